"""`notebookos up` smoke test: the whole local cluster and JupyterLab from one command.

It starts, a kernel created over the REST API runs cells over the websocket on three replicas,
a SIGKILLed Local Scheduler and Global Scheduler are restarted by `notebookos up` itself while
JupyterLab and the notebook carry on, and SIGINT leaves no process behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import suppress
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
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")),
                              daemon=True)
    reader.start()
    try:
        url = None
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and url is None and proc.poll() is None:
            match = re.search(r"NotebookOS is up: (http://\S+token=(\w+))", "".join(lines))
            if match:
                url, token = match.group(1), match.group(2)
            time.sleep(0.2)
        assert url, "notebookos up did not come up:\n" + "".join(lines)
        marker = _marker_of(proc.pid)
        assert marker, "children of notebookos up carry no supervisor marker"

        kernel = asyncio.run(start_kernel(port, token))
        assert kernel["name"] == "notebookos"  # JupyterLab's default kernel
        kernel_id = kernel["id"]
        results = asyncio.run(run_cells(port, token, kernel_id, [
            "x = 41", "x += 1\nprint('x is', x)", "x",
        ]))
        assert [r["reply"]["status"] for r in results] == ["ok", "ok", "ok"]
        assert [r["reply"]["execution_count"] for r in results] == [1, 2, 3]
        assert results[1]["outputs"] == [{"name": "stdout", "text": "x is 42\n"}]
        assert results[2]["outputs"][0]["data"]["text/plain"] == "42"
        for r in results:  # exactly one busy and one idle per request
            assert r["states"] == ["busy", "idle"]

        doc = _status(gs_port)
        assert len(doc["hosts"]) == 3
        (kernel,) = doc["kernels"]
        assert len({r["host_id"] for r in kernel["replicas"]}) == 3
        _check_metrics_live(doc)
        # JupyterLab loads the NotebookOS extension (prebuilt, installed with the package).
        page = _get(f"http://127.0.0.1:{port}/lab?token={token}")
        assert '"name": "notebookos-jupyterlab"' in page or \
            '"name":"notebookos-jupyterlab"' in page, "the lab page lists no NotebookOS extension"

        # A Local Scheduler holding a replica, then the Global Scheduler, die: `notebookos up`
        # restarts each, JupyterLab stays up, and the notebook goes on with its state.
        victim = kernel["replicas"][0]["host_id"]  # "host-N", started as local-scheduler-N
        _kill_child(proc.pid, "--host-id", victim)
        _wait_for_line(lines, f"restarted local-scheduler-{victim.removeprefix('host-')}")
        _kill_child(proc.pid, "global-scheduler")
        _wait_for_line(lines, "restarted global-scheduler")
        results = asyncio.run(run_cells(port, token, kernel_id, ["x += 1\nx"]))
        assert results[0]["reply"]["status"] == "ok", results
        assert results[0]["outputs"][0]["data"]["text/plain"] == "43"
        doc = _wait_whole(gs_port, 3)
        assert len(doc["hosts"]) == 3
        # the restarted daemons' endpoints, wherever they now are: the kernel was whole all along
        # (the restarted Local Scheduler takes its replica back), so wait for its registration
        doc = _wait_metrics_live(gs_port)
        assert proc.poll() is None

        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        reader.join(timeout=10)
        out = "".join(lines)
        assert proc.returncode == 0, out
        assert "notebookos up: stopped" in out
        assert _processes_with_marker(marker) == [], "processes left behind after SIGINT"
    finally:
        kill_group(proc)
        if marker:
            for pid in _processes_with_marker(marker):
                os.kill(pid, signal.SIGKILL)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - loopback
        return resp.read().decode()


def _check_metrics_live(doc: dict) -> None:
    """`notebookos status --json` names a live /metrics for the GS and for every host."""
    urls = doc["metrics"]
    assert sorted(urls["local_schedulers"]) == sorted(h["id"] for h in doc["hosts"])
    assert "notebookos_hosts{" in _get(urls["global_scheduler"])
    for url in urls["local_schedulers"].values():
        assert "notebookos_host_gpus{" in _get(url)
    assert len(json.loads(_get(urls["service_discovery"]))) == 1 + len(doc["hosts"])


def _wait_metrics_live(gs_port: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        doc = _status(gs_port)
        try:
            _check_metrics_live(doc)
            return doc
        except (OSError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _status(gs_port: int) -> dict:
    status = subprocess.run(
        [sys.executable, "-m", "notebookos.cli", "status", "--json",
         "--global-scheduler", f"127.0.0.1:{gs_port}"],
        capture_output=True, text=True, timeout=30)
    return json.loads(status.stdout)


def _wait_whole(gs_port: int, hosts: int, timeout: float = 90) -> dict:
    """The cluster status once ``hosts`` hosts are registered and the kernel has three replicas
    on distinct hosts again."""
    deadline = time.monotonic() + timeout
    doc: dict = {}
    while time.monotonic() < deadline:
        try:
            doc = _status(gs_port)
        except (json.JSONDecodeError, subprocess.TimeoutExpired):
            continue
        replicas = doc["kernels"][0]["replicas"] if doc.get("kernels") else []
        if len(doc.get("hosts", [])) == hosts and len({r["host_id"] for r in replicas}) == 3:
            return doc
        time.sleep(0.5)
    raise AssertionError(f"the cluster did not heal within {timeout:g} s: {doc}")


def _kill_child(up_pid: int, *words: str) -> None:
    """SIGKILL the child of `notebookos up` whose command line has all of ``words``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().split(") ", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
        except (OSError, IndexError, ValueError):
            continue
        if parent == up_pid and all(w in argv for w in words):
            os.kill(int(entry.name), signal.SIGKILL)
            return
    raise AssertionError(f"no child of notebookos up runs with {words}")


def _wait_for_line(lines: list[str], text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(text in line for line in lines):
            return
        time.sleep(0.1)
    raise AssertionError(f"notebookos up never said {text!r}:\n{''.join(lines)}")


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


@pytest.mark.slow
def test_up_whose_terminal_went_away_still_stops_its_daemons(tmp_path: Path) -> None:
    """`notebookos up` started behind a pipe that then closed (its shell's terminal gone, a
    `| tee` killed), then stopped: its last words raised BrokenPipeError before it stopped
    anything, and every daemon ran on, orphaned (found by a test run whose driver was killed)."""
    port, gs_port = free_ports(2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "notebookos.cli", "up", "--no-browser", "--hosts", "1",
         "--port", str(port), "--scheduler-port", str(gs_port),
         "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        cwd=tmp_path,
    )
    marker = None
    try:
        deadline = time.monotonic() + 150
        seen = ""
        while "NotebookOS is up" not in seen and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "notebookos up exited:\n" + seen
            seen += line
        marker = _marker_of(proc.pid)
        daemons = _processes_with_marker(marker)
        assert len(daemons) >= 3, daemons  # the schedulers and JupyterLab
        proc.stdout.close()  # the terminal goes away
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
        deadline = time.monotonic() + 30
        while _processes_with_marker(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_with_marker(marker) == [], "daemons outlived notebookos up"
    finally:
        kill_group(proc)
        for pid in _processes_with_marker(marker):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
