"""Fixtures for the deployment tests: a real Docker engine and the NotebookOS image built from
this tree (scripts/build-image.sh; the engine's layer cache makes a rebuild after a code change
take seconds, the first build a few minutes)."""

from __future__ import annotations

import os
import time

import pytest
from notebook_check import ROOT

from notebookos.testing import deployment

IMAGE = os.environ.get("NOTEBOOKOS_TEST_IMAGE", "notebookos:test")


def service_missing(reason: str) -> None:
    """Skip, or fail when CI demands the services (as tests/conftest.py's helper does)."""
    if os.environ.get("NOTEBOOKOS_REQUIRE_SERVICES") == "1":
        pytest.fail(f"required service missing (NOTEBOOKOS_REQUIRE_SERVICES=1): {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_engine() -> None:
    reason = deployment.docker_missing(ROOT)
    if reason is not None:
        service_missing(reason)


@pytest.fixture(scope="session")
def image_torch(docker_engine: None) -> str:
    """The torch build of the test image: cpu when pip finds that wheel here, else none."""
    return deployment.torch_choice()


@pytest.fixture(scope="session")
def notebookos_image(image_torch: str) -> str:
    """The image of this tree, tagged notebookos:test (NOTEBOOKOS_TEST_IMAGE)."""
    start = time.monotonic()
    deployment.build_image(ROOT, IMAGE, image_torch)
    print(f"\nimage {IMAGE} (torch: {image_torch}) built in {time.monotonic() - start:.0f} s")
    return IMAGE


@pytest.fixture(scope="session")
def prometheus_image(docker_engine: None) -> str:
    """Prometheus for the compose file's monitoring profile, built from Debian's package (no
    image registry is reachable here)."""
    return deployment.build_prometheus_image(ROOT)
