"""The NotebookOS JupyterLab extension: shipped prebuilt in the package, current with its sources,
and working in a real browser (Playwright driving Debian's chromium) against a real cluster: the
status bar item names the host the REST API reports as the executor, and after that replica is
SIGKILLed, the next cell's item names the new host; the side panel shows the lost replica."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from browser import Lab
from lab_fixtures import DISPLAY_NAME, LabServer, executor_of, wait_item

from notebookos.testing import labextension

ROOT = Path(__file__).resolve().parents[2]



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
    assert re.search(r"GPU time \d+\.\d\d GPU-s", hover), hover  # its GPUs x commit -> reply

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
    # Each cell's GPU time, and the notebook's against what a reservation would have held.
    assert panel.locator(".jp-NotebookOS-History th").last.inner_text() == "GPU time"
    gpu_time = panel.locator(".jp-NotebookOS-History tr").nth(1).locator("td").last.inner_text()
    assert re.fullmatch(r"\d+\.\d\d GPU-s", gpu_time), gpu_time
    hours = panel.locator(".jp-NotebookOS-GpuHours").inner_text()
    assert re.match(r"GPU time: \d+\.\d\d GPU-s used; a reservation since it started would "
                    r"have held .+ \(\d+\.\d% saved\)\.", hours), hours
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
