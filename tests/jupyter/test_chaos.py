"""A short run of the fault campaign (benchmarks/chaos.py): `notebookos up`, a notebook over
Jupyter Server's websocket with small values, a numpy array and a torch model with its optimizer,
and every kind of fault once (SIGKILL of the executor, of a standby, of a Local Scheduler, of the
Global Scheduler, a host hung for 10 s) plus one double fault. No cell may fail, no state may be
lost silently, and no single fault may cost a rollback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_short_fault_campaign_loses_nothing(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "benchmarks" / "chaos.py"), "--faults", "5", "--double", "1",
         "--round-robin", "--big-mib", "2", "--seed", "11", "--json", "--keep", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        cwd=tmp_path)
    try:
        out, err = proc.communicate(timeout=560)
    finally:
        if proc.poll() is None:  # it stops its cluster on SIGTERM (as on Ctrl-C)
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=120)
    logs = f"stderr:\n{err[-6000:]}\nnotebookos up:\n{_tail(tmp_path / 'up.log')}"
    assert out.strip(), logs
    result = json.loads(out)
    rows = {row["kind"]: row for row in result["table"]}
    assert set(rows) == {"kill-executor", "kill-standby", "kill-local-scheduler",
                         "kill-global-scheduler", "hang-host", "double", "all"}, rows
    bad = [o for o in result["outcomes"] if o["verdict"] in ("silent-loss", "error")]
    assert not bad, f"{bad}\n{logs}"
    singles = [o for o in result["outcomes"] if o["kind"] != "double"]
    assert all(o["verdict"] == "intact" for o in singles), f"{singles}\n{logs}"
    assert all(o["redundancy_s"] is not None for o in result["outcomes"]), logs
    # the Local Scheduler and the Global Scheduler were brought back by `notebookos up`
    assert result["daemon_restarts"] >= 2, logs
    assert proc.returncode == 0, logs


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""
