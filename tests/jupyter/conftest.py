"""Fixtures for the Jupyter-side tests: a real NotebookOS cluster per test module."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from nbos_cluster import Cluster, start_cluster


@pytest.fixture(scope="module")
def nbos_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Four hosts with 2 virtual GPUs each; this process's provisioner is pointed at them."""
    cluster, supervisor = start_cluster(tmp_path_factory.mktemp("nbos"), hosts=4)
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in cluster.env.items() if k.startswith("NOTEBOOKOS_")})
    try:
        yield cluster
    finally:
        os.environ.clear()
        os.environ.update(saved)
        supervisor.stop()
