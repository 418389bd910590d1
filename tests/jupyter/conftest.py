"""Fixtures for the Jupyter-side tests: a real NotebookOS cluster per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from lab_fixtures import lab, lab_server  # noqa: F401 - fixtures of the browser tests
from nbos_cluster import Cluster, running_cluster


@pytest.fixture(scope="module")
def nbos_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Four hosts with 2 virtual GPUs each; this process's provisioner is pointed at them."""
    with running_cluster(tmp_path_factory.mktemp("nbos"), hosts=4) as cluster:
        yield cluster
