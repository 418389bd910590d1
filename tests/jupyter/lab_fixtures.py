"""JupyterLab on a test module's cluster, and a browser on it: the fixtures ``lab_server`` (a
JupyterLab server on ``nbos_cluster``, per module) and ``lab`` (a fresh page, per test), and what
the browser tests read from them. Registered in conftest.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import LAB_ARGS, Lab, browser_missing, launch_browser
from nbos_cluster import Cluster

from notebookos.testing.processes import free_port, kill_group, wait_for_port

DISPLAY_NAME = "Python 3 (NotebookOS, 1 GPU)"


class LabServer:
    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token
        self.url = f"http://127.0.0.1:{port}"

    def get(self, path: str) -> dict | list:
        request = urllib.request.Request(f"{self.url}{path}",
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310 - loopback
            return json.loads(resp.read())


@pytest.fixture(scope="module")
def lab_server(nbos_cluster: Cluster) -> Iterator[LabServer]:
    workdir, env = nbos_cluster.workdir, nbos_cluster.env
    port, token = free_port(), uuid.uuid4().hex
    log = open(workdir / "lab.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
         f"--port={port}", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={workdir}", *LAB_ARGS],
        stdout=log, stderr=subprocess.STDOUT, env=dict(env, JUPYTER_CONFIG_DIR=str(workdir)),
        start_new_session=True, cwd=workdir)
    try:
        assert wait_for_port(port, 90, server), (workdir / "lab.log").read_text()[-3000:]
        yield LabServer(port, token)
    finally:
        kill_group(server)
        log.close()


@pytest.fixture
def lab(lab_server: LabServer, tmp_path: Path) -> Iterator[Lab]:
    missing = browser_missing()
    if missing:
        if os.environ.get("NOTEBOOKOS_REQUIRE_SERVICES") == "1":
            pytest.fail(f"required service missing (NOTEBOOKOS_REQUIRE_SERVICES=1): {missing}")
        pytest.skip(missing)
    with launch_browser() as browser:
        # ?reset: a fresh workspace (the launcher), not the notebooks an earlier test left open
        page = Lab(browser, f"{lab_server.url}/lab?reset&token={lab_server.token}")
        try:
            yield page
        finally:
            page.screenshot(str(tmp_path / "lab.png"))
            page.close()


def executor_of(server: LabServer) -> tuple[str, dict]:
    """(kernel id, its executor replica) as the server extension's REST API reports them."""
    sessions = server.get("/api/sessions")
    kernel_id = next(s["kernel"]["id"] for s in sessions
                     if s["kernel"]["name"].startswith("notebookos"))
    entry = server.get(f"/api/notebookos/kernels/{kernel_id}")
    return kernel_id, next(r for r in entry["replicas"] if r["replica_id"] == entry["executor"])


def wait_item(lab: Lab, text: str, timeout_s: float = 30.0) -> str:
    item = lab.page.locator(".jp-NotebookOS-StatusItem")
    deadline = time.monotonic() + timeout_s
    shown = ""
    while time.monotonic() < deadline:
        shown = item.inner_text() if item.count() else ""
        if text in shown:
            return shown
        time.sleep(0.2)
    bar = lab.page.locator("#jp-main-statusbar")
    raise AssertionError(f"the status item shows {shown!r} ({item.count()} found), not {text!r}; "
                         f"the status bar: {bar.inner_html()[:3000] if bar.count() else None}")
