"""`notebookos status` while `notebookos up` restarts the Global Scheduler: the scheduler cannot
answer, so the status says what the supervisor's state file says (restarting, which attempt, when
it tries again), and the exit code still says the status itself was not available."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from notebookos.ports import free_ports
from notebookos.testing.supervisor_state import write_state


def status(state_dir: Path, address: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "notebookos.cli", "status", "--state-dir", str(state_dir),
         "--global-scheduler", address, "--timeout", "1", *flags],
        capture_output=True, text=True, timeout=60)


def test_status_says_the_global_scheduler_is_restarting(tmp_path: Path) -> None:
    (port,) = free_ports(1)  # nothing listens there
    address = f"127.0.0.1:{port}"
    write_state(tmp_path, address)
    done = status(tmp_path, address)
    assert done.returncode == 1, done
    assert "cannot reach the Global Scheduler" in done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"DAEMONS (notebookos up, pid {os.getpid()})", done.stdout
    assert lines[1].startswith("  global-scheduler: restarting, attempt 4, next try in "), lines
    wait = int(lines[1].split("next try in ", 1)[1].split(" s", 1)[0])
    assert 5 <= wait <= 8, lines[1]
    assert "(last exit: killed by SIGKILL after 3.1 s)" in lines[1]
    assert lines[2] == "  local-scheduler-0: running (pid 4243)"

    done = status(tmp_path, address, "--json")
    assert done.returncode == 1
    doc = json.loads(done.stdout)["supervisor"]
    gs = doc["daemons"][0]
    assert (gs["name"], gs["state"], gs["attempt"]) == ("global-scheduler", "restarting", 4)
    assert 5 <= gs["retry_in_s"] <= 8


def test_a_stale_or_foreign_state_file_is_not_shown(tmp_path: Path) -> None:
    (port, other) = free_ports(2)
    address = f"127.0.0.1:{port}"
    write_state(tmp_path, f"127.0.0.1:{other}")  # another cluster's scheduler
    done = status(tmp_path, address)
    assert (done.returncode, done.stdout) == (1, "")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_state(tmp_path, address, pid=dead.pid)  # its `notebookos up` was killed
    done = status(tmp_path, address)
    assert (done.returncode, done.stdout) == (1, ""), done


def test_a_reachable_clusters_status_lists_the_daemons_too(tmp_path: Path) -> None:
    from notebookos.commands.status_cmd import render_text, status_document, supervisor_document
    from notebookos.proto import global_scheduler_pb2

    address = "127.0.0.1:1"
    write_state(tmp_path, address, retry_in_s=0.0)
    doc = status_document(global_scheduler_pb2.ClusterStatus(policy="notebookos"))
    doc["supervisor"] = supervisor_document(tmp_path, address)
    text = render_text(doc)
    assert f"DAEMONS (notebookos up, pid {os.getpid()})" in text
    assert "  global-scheduler: restarting, attempt 4, next try in 0 s" in text
    assert "  jupyterlab: running (pid 4244)" in text
