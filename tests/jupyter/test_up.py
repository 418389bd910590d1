"""`notebookos up` smoke test: the whole local cluster and JupyterLab from one command.

It starts, a kernel created over the REST API runs cells over the websocket on three replicas,
and SIGINT leaves no process behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from wsclient import run_cells, start_kernel

from notebookos.ports import free_ports
from notebookos.supervisor import MARKER_VAR
from notebookos.testing.processes import kill_group


@pytest.mark.slow
def test_up_runs_a_notebook_kernel_and_stops_cleanly(tmp_path: Path) -> None:
    port, gs_port = free_ports(2)  # drawn together: never the same port twice
    proc = subprocess.Popen(
        [sys.executable, "-m", "notebookos.cli", "up", "--no-browser", "--hosts", "3",
         "--gpus-per-host", "2", "--port", str(port), "--scheduler-port", str(gs_port),
         "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        cwd=tmp_path,
    )
    marker = None
    try:
        url = None
        deadline = time.monotonic() + 150
        lines = []
        while time.monotonic() < deadline and url is None:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            match = re.search(r"NotebookOS is up: (http://\S+token=(\w+))", line)
            if match:
                url, token = match.group(1), match.group(2)
        assert url, "notebookos up did not come up:\n" + "".join(lines)
        marker = _marker_of(proc.pid)
        assert marker, "children of notebookos up carry no supervisor marker"

        kernel = asyncio.run(start_kernel(port, token))
        assert kernel["name"] == "notebookos"  # JupyterLab's default kernel
        results = asyncio.run(run_cells(port, token, kernel["id"], [
            "x = 41", "x += 1\nprint('x is', x)", "x",
        ]))
        assert [r["reply"]["status"] for r in results] == ["ok", "ok", "ok"]
        assert [r["reply"]["execution_count"] for r in results] == [1, 2, 3]
        assert results[1]["outputs"] == [{"name": "stdout", "text": "x is 42\n"}]
        assert results[2]["outputs"][0]["data"]["text/plain"] == "42"
        for r in results:  # exactly one busy and one idle per request
            assert r["states"] == ["busy", "idle"]

        status = subprocess.run(
            [sys.executable, "-m", "notebookos.cli", "status", "--json",
             "--global-scheduler", f"127.0.0.1:{gs_port}"],
            capture_output=True, text=True, timeout=30)
        doc = json.loads(status.stdout)
        assert len(doc["hosts"]) == 3
        (kernel,) = doc["kernels"]
        assert len({r["host_id"] for r in kernel["replicas"]}) == 3

        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert "notebookos up: stopped" in out
        assert _processes_with_marker(marker) == [], "processes left behind after SIGINT"
    finally:
        kill_group(proc)
        if marker:
            for pid in _processes_with_marker(marker):
                os.kill(pid, signal.SIGKILL)


def _marker_of(pid: int) -> str | None:
    """The supervisor marker the children of `notebookos up` carry (read from a child)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().split(") ", 1)[1].split()[1]) != pid:
                continue
            for item in (entry / "environ").read_bytes().split(b"\0"):
                if item.startswith(MARKER_VAR.encode() + b"="):
                    return item.split(b"=", 1)[1].decode()
        except (OSError, IndexError, ValueError):
            continue
    return None


def _processes_with_marker(marker: str | None) -> list[int]:
    from notebookos.supervisor import marked_processes

    return marked_processes(marker) if marker else []
