"""Hibernation in JupyterLab (issue 34), in a real browser (Playwright, Debian's chromium) on a
real cluster whose kernels hibernate after 3 s: the panel and the status item say the notebook
is hibernated, the Wake button wakes it, and the next cell has its variables and says it woke."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import Lab
from lab_fixtures import DISPLAY_NAME, LabServer, wait_item
from nbos_cluster import Cluster, running_cluster


@pytest.fixture(scope="module")
def nbos_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three hosts; a kernel with no cell for 3 s hibernates."""
    with running_cluster(tmp_path_factory.mktemp("nbos-hibernate"), hosts=3,
                         settings={"global_scheduler.hibernate_after_s": 3.0}) as cluster:
        yield cluster


def _kernel(server: LabServer) -> dict:
    sessions = server.get("/api/sessions")
    kernel_id = next(s["kernel"]["id"] for s in sessions
                     if s["kernel"]["name"].startswith("notebookos"))
    return server.get(f"/api/notebookos/kernels/{kernel_id}")


def _wait_state(server: LabServer, states: tuple[str, ...], timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    entry: dict = {}
    while time.monotonic() < deadline:
        entry = _kernel(server)
        if entry["state"] in states:
            return entry
        time.sleep(0.3)
    raise AssertionError(f"the kernel stayed {entry.get('state')!r}, not {states}: {entry}")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_hibernated_notebook_is_shown_woken_by_the_button_and_keeps_its_state(
        lab_server: LabServer, lab: Lab, tmp_path: Path) -> None:
    lab.new_notebook(DISPLAY_NAME)
    lab.wait_kernel_idle()
    lab.run_cell(0, "x = 41\nimport numpy as np\nbig = np.ones(1_000_000)\nprint('set')")
    lab.wait_output(0, "set", timeout_s=90)
    entry = _wait_state(lab_server, ("hibernated",))
    assert entry["replicas"] == []

    # The panel asks for the kernel's state when it opens: hibernated, with a Wake button.
    lab.page.locator(".jp-NotebookOS-StatusItem").click()
    panel = lab.page.locator(".jp-NotebookOS-Panel")
    panel.wait_for(state="visible")
    state = panel.locator(".jp-NotebookOS-KernelState")
    state.filter(has_text="hibernated").wait_for(state="visible", timeout=30_000)
    wait_item(lab, "hibernated")
    lab.screenshot(str(tmp_path / "hibernated.png"))
    panel.locator(".jp-NotebookOS-Wake").click()
    _wait_state(lab_server, ("idle",), timeout_s=90)

    lab.run_cell(1, "print(x + 1, int(big.sum()))")
    shown = lab.wait_output(1, "42 1000000", timeout_s=90)
    assert "42 1000000" in shown
    lab.screenshot(str(tmp_path / "woken.png"))
    # Asleep again, then woken by a cell: the cell's output says so.
    _wait_state(lab_server, ("hibernated",))
    lab.run_cell(2, "print(x * 2)")
    shown = lab.wait_output(2, "82", timeout_s=90)
    assert "woke from hibernation in" in shown, shown


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_restart_kernel_in_jupyterlab_awake_and_hibernated(lab_server: LabServer, lab: Lab) -> None:
    """JupyterLab's Restart Kernel, awake and then hibernated: the notebook's next cell runs on
    an empty kernel, and the hibernated one wakes empty, saying nothing of a wake. (JupyterLab
    reconnects its websocket after a restart, so it also worked when a restart moved the kernel
    to new ports; a client that keeps its connection did not:
    test_provisioner_stack.py::test_a_restart_keeps_the_ports_...)"""
    lab.new_notebook(DISPLAY_NAME)
    lab.wait_kernel_idle()
    lab.run_cell(0, "x = 41\nprint('set')")
    lab.wait_output(0, "set", timeout_s=90)
    lab.restart_kernel()
    lab.wait_kernel_idle()
    lab.run_cell(1, "print('x' in dir(), 'first')")
    assert "False first" in lab.wait_output(1, "first", timeout_s=90)
    lab.run_cell(2, "y = 1\nprint('again')")
    lab.wait_output(2, "again", timeout_s=90)
    _wait_state(lab_server, ("hibernated",))
    lab.restart_kernel()
    lab.wait_kernel_idle()
    _wait_state(lab_server, ("idle", "hibernated"))
    lab.run_cell(3, "print('y' in dir(), 'second')")
    shown = lab.wait_output(3, "second", timeout_s=90)
    assert "False second" in shown and "woke" not in shown, shown
