"""The NotebookOS JupyterLab extension: shipped prebuilt in the package, current with its sources,
and working in a real browser (Playwright driving Debian's chromium) against a real cluster: the
status bar item names the host the REST API reports as the executor, and after that replica is
SIGKILLed, the next cell's item names the new host; the side panel shows the lost replica."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import LAB_ARGS, Lab, browser_missing, launch_browser
from nbos_cluster import Cluster

from notebookos.testing import labextension
from notebookos.testing.processes import free_port, kill_group, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
DISPLAY_NAME = "Python 3 (NotebookOS, 1 GPU)"


def test_committed_build_matches_its_sources() -> None:
    assert labextension.recorded_hash() == labextension.source_hash(), (
        "provisioner/labextension was built from other sources than labextension/: run "
        "`make labextension` and commit the result")
    built = json.loads((labextension.BUILD / "package.json").read_text())
    assert built["name"] == "notebookos-jupyterlab"
    assert (labextension.BUILD / built["jupyterlab"]["_build"]["load"]).is_file()


@pytest.mark.slow
def test_a_wheel_installs_the_prebuilt_extension(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    wheel = next(tmp_path.glob("notebookos-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    share = "notebookos-0.1.0.data/data/share/jupyter/labextensions/notebookos-jupyterlab/"
    built = json.loads((labextension.BUILD / "package.json").read_text())
    assert share + "package.json" in names
    assert share + built["jupyterlab"]["_build"]["load"] in names


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


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_status_item_names_the_executor_and_follows_it_after_a_sigkill(
        lab_server: LabServer, lab: Lab, tmp_path: Path) -> None:
    lab.new_notebook(DISPLAY_NAME)
    lab.wait_kernel_idle()
    lab.run_cell(0, "x = 20\nx + 1")
    lab.wait_output(0, "21", timeout_s=90)
    kernel_id, first = executor_of(lab_server)
    shown = wait_item(lab, f"replica {first['replica_id']} @ {first['host_id']}")
    assert "GPU" in shown and "delay" in shown
    # Hovering the cell's prompt tells the same: where it ran, on which GPU, the delay.
    hover = lab.cell(0).locator(".jp-InputPrompt").get_attribute("title") or ""
    assert f"replica {first['replica_id']} on {first['host_id']}, GPU " in hover, hover
    assert "delay" in hover and "ran" in hover, hover

    os.kill(first["pid"], signal.SIGKILL)
    lab.run_cell(1, "x * 2")
    lab.wait_output(1, "40", timeout_s=90)
    _, second = executor_of(lab_server)
    assert second["replica_id"] != first["replica_id"]
    assert second["host_id"] != first["host_id"]
    wait_item(lab, f"replica {second['replica_id']} @ {second['host_id']}")

    # The side panel: both cells in the history, and the lost replica named.
    lab.page.locator(".jp-NotebookOS-StatusItem").click()
    panel = lab.page.locator(".jp-NotebookOS-Panel")
    panel.wait_for(state="visible")
    panel.locator(".jp-NotebookOS-History").wait_for(state="visible")
    assert panel.locator(".jp-NotebookOS-History tr").count() == 3  # heading + two cells
    panel.filter(has_text=f"replica {first['replica_id']} on {first['host_id']} was "
                          "lost").wait_for(state="visible", timeout=30_000)
    panel.locator(".jp-NotebookOS-Hosts").wait_for(state="visible")
    assert panel.locator(".jp-NotebookOS-Hosts tr").count() == 5  # heading + four hosts
    # Who shares a GPU (GPU sharing is off here: nobody, "-" on every host).
    assert panel.locator(".jp-NotebookOS-Hosts th").last.inner_text() == "shared"
    assert panel.locator(".jp-NotebookOS-Hosts tr").nth(1).locator("td").last.inner_text() == "-"
    lab.screenshot(str(tmp_path / "panel.png"))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_refused_kernel_shows_its_reason_in_jupyterlabs_dialog(lab: Lab) -> None:
    # No host of this cluster has 4 GPUs: opening a 4-GPU notebook is refused by the Global
    # Scheduler, and JupyterLab's "Error Starting Kernel" dialog shows why and what to do,
    # not "Unhandled error" (issue 19.2).
    lab.new_notebook("Python 3 (NotebookOS, 4 GPUs)")
    text = lab.dialog_text(timeout_s=90)
    assert "Unhandled error" not in text, text
    assert "no host can hold the request" in text, text
    assert "What you can do" in text, text
