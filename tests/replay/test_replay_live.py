"""``notebookos replay`` against a real embedded cluster (Global Scheduler, Local Schedulers,
replica processes over Raft, a Jupyter Server): a tiny template with exact expectations, and an
executor replica SIGKILLed mid-cell, reported while the run completes."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from notebookos.commands._replay_local import LocalCluster
from notebookos.proto import common_pb2, global_scheduler_pb2, global_scheduler_pb2_grpc
from notebookos.replay.driver import Replay, ReplayOptions
from notebookos.replay.jupyter import JupyterServer
from notebookos.replay.plan import as_played, kernelspec_request, scale_time
from notebookos.replay.records import COMPLETED, FAILED
from notebookos.supervisor import marked_processes
from notebookos.testing.credentials import connect
from notebookos.testing.optional import require_torch
from notebookos.workload.readers import read_template

pytestmark = pytest.mark.slow


def _template(path: Path, sessions: list[dict]) -> Path:
    path.write_text(json.dumps({"workloadTitle": path.stem, "sessions": sessions}))
    return path


def _training(start: int, ticks: int, gpus: int) -> dict:
    return {"start_tick": start, "duration_in_ticks": ticks, "millicpus": 100, "memory": 128,
            "vram": 1, "gpus": gpus}


def _left_running(state_dir: str) -> list[int]:
    return marked_processes(state_dir, var="NOTEBOOKOS_CLUSTER_STATE_DIR")


def test_tiny_template_on_a_local_cluster(tmp_path: Path) -> None:
    # A tick is 3 s, so that kernels usually start before their session's first cell; a cell
    # whose kernel was ready before its time must start at once (checked below).
    template = _template(tmp_path / "tiny.json", [
        {"id": "a", "start_tick": 0, "stop_tick": 6,
         "trainings": [_training(2, 1, 1), _training(4, 1, 1)]},
        {"id": "b", "start_tick": 0, "stop_tick": 5, "trainings": [_training(3, 1, 2)]},
        {"id": "idle", "start_tick": 1, "stop_tick": 4, "trainings": []},
    ])
    out = tmp_path / "out"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "notebookos.cli", "replay", "--template", str(template),
         "--time-scale", "0.05", "--local", "3x2", "--out", str(out), "--quiet"],
        capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    wall = time.monotonic() - started
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["tasks_submitted"], summary["tasks_completed"], summary["tasks_failed"]) \
        == (3, 3, 0)
    assert summary["state_check_failures"] == 0 and summary["sessions_failed"] == 0
    assert summary["sessions"] == 3 and summary["policy"] == "notebookos"
    assert summary["migrations"] == 0 and summary["immediate_fraction"] > 0
    assert summary["gpu_hours_committed_sampled"] > 0
    sim = summary["simulated"]
    assert (sim["tasks_submitted"], sim["tasks_completed"]) == (3, 3)
    assert sim["settings"]["hosts"] == 3 and sim["settings"]["gpus_per_host"] == 2
    # Cells in trace order, each at its time, each seeing its session's previous cell.
    rows = list(csv.DictReader((out / "tasks.csv").open()))
    assert [r["task_id"] for r in sorted(rows, key=lambda r: float(r["submit_s"]))] == \
        ["a/0", "b/0", "a/1"]
    by_id = {r["task_id"]: r for r in rows}
    for r in rows:
        assert r["status"] == COMPLETED and r["state_ok"] == "1", r
        assert abs(float(r["submit_s"]) - float(r["planned_submit_s"])) < 1.0, r
        assert float(r["work_end_s"]) - float(r["work_start_s"]) >= float(r["duration_s"]) - 0.01
        assert float(r["execute_input_s"]) <= float(r["work_start_s"]) + 0.05
        assert float(r["reply_s"]) >= float(r["work_end_s"])
        assert r["executor_host"] and r["executor_replica"]
        assert len(r["gpu_device_ids"].split("+")) == int(r["gpus"])
    assert by_id["a/0"]["state_seen"] == "" and by_id["a/1"]["state_seen"] == "0"
    assert by_id["b/0"]["gpus"] == "2"
    # Sessions (the idle one too) opened at their start and closed at their stop.
    sessions = {r["session_id"]: r for r in csv.DictReader((out / "sessions.csv").open())}
    for s in sessions.values():
        assert s["kernel_id"] and not s["failure"], s
        assert float(s["stopped_s"]) >= float(s["planned_stop_s"]) - 0.05, s
        assert float(s["start_requested_s"]) >= float(s["planned_start_s"]) - 0.05, s
    assert sessions["b"]["kernel_name"] == "notebookos-2gpu"
    # A cell due after its kernel was ready started at once (on a loaded machine a kernel may
    # not be ready by its first cell: that cell waits for it, as a user's would).
    for r in rows:
        ready = sessions[r["session_id"]]["ready_s"]
        assert ready, sessions[r["session_id"]]
        if float(ready) <= float(r["planned_submit_s"]):
            assert r["immediate"] == "1" and float(r["interactivity_s"]) < 1.0, r
        assert r["starts"] == "1", r
    for name in ("comparison.md", "cdf_live_vs_simulated.png", "simulated/summary.json",
                 "cluster-logs/global-scheduler.log"):
        assert (out / name).is_file(), name
    # The stored run simulated again with other latencies, beside the same live figures.
    again = subprocess.run(
        [sys.executable, "-m", "notebookos.cli", "replay", "--resimulate", str(out), "--sim-set",
         "container_start_s=30", "--out", str(tmp_path / "again"), "--json"],
        capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    resim = json.loads(again.stdout)
    assert resim["tasks_completed"] == 3 and resim["simulated"]["tasks_completed"] == 3
    assert resim["simulated"]["settings"]["container_start_s"] == 30
    # a 30 s kernel start (the default is 2.24 s since issue 21) makes first cells wait
    assert resim["simulated"]["interactivity_p90_s"] > sim["interactivity_p90_s"]
    # Nothing left behind: no process of the cluster, no state directory.
    assert not Path(summary["local_state_dir"]).exists()
    assert _left_running(summary["local_state_dir"]) == []
    assert wall < 180


def _executor_pid(address: str, kernel_id: str) -> tuple[int, str]:
    with connect(address) as channel:
        stub = global_scheduler_pb2_grpc.GlobalSchedulerStub(channel)
        status = stub.GetKernelStatus(
            global_scheduler_pb2.GetKernelStatusRequest(kernel_id=kernel_id), timeout=10)
    running = [r for r in status.replicas if r.executor
               and r.state == common_pb2.REPLICA_STATE_EXECUTING and r.pid]
    return (running[0].pid, running[0].host_id) if running else (0, "")


def test_executor_killed_mid_cell_is_reported_and_the_run_completes(tmp_path: Path) -> None:
    template = _template(tmp_path / "kill.json", [
        {"id": "k", "start_tick": 0, "stop_tick": 12,
         "trainings": [_training(1, 1, 1), _training(3, 5, 1), _training(9, 1, 1)]},
        {"id": "other", "start_tick": 0, "stop_tick": 8, "trainings": [_training(2, 1, 1)]},
    ])
    cluster = LocalCluster(3, 2, "notebookos")
    state_dir = str(cluster.state_dir)
    try:
        url = cluster.start()
        address = f"127.0.0.1:{cluster.config.global_scheduler.grpc_port}"
        workload = scale_time(read_template(template), 0.05)  # a tick is 3 s

        async def main() -> tuple:
            server = JupyterServer(url, cluster.token)
            replay = Replay(server, as_played(workload, {g: kernelspec_request(g) for g in (0, 1, 2, 4, 8)}),
                            ReplayOptions(cell_timeout_s=60, policy="notebookos"))
            await replay.prepare()
            run = asyncio.ensure_future(replay.run())
            record = replay.tasks["k/1"]
            while record.submit_s is None:
                await asyncio.sleep(0.05)
            kernel_id = replay.sessions["k"].kernel_id
            deadline = time.monotonic() + 10
            pid = 0
            while not pid and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                pid, host = await asyncio.to_thread(_executor_pid, address, kernel_id)
            assert pid, "the long cell never ran"
            await asyncio.sleep(1.0)  # well inside the 15 s cell
            os.kill(pid, signal.SIGKILL)
            return await run, pid

        result, killed = asyncio.run(main())
    finally:
        cluster.stop()
    tasks = {t.task_id: t for t in result.tasks}
    assert not result.interrupted
    assert tasks["k/0"].status == COMPLETED and tasks["k/0"].state_ok
    assert tasks["k/1"].status == FAILED
    assert "NotebookOSExecutorFailed" in tasks["k/1"].reason, tasks["k/1"].reason
    # The next cell runs on a survivor with the state of the last completed cell (k/0).
    assert tasks["k/2"].status == COMPLETED, tasks["k/2"].reason
    assert tasks["k/2"].state_ok and tasks["k/2"].state_seen == 0
    assert tasks["other/0"].status == COMPLETED and tasks["other/0"].state_ok
    from notebookos.replay.records import summarize

    summary = summarize(result, reservation=False)
    assert (summary["tasks_submitted"], summary["tasks_completed"], summary["tasks_failed"]) \
        == (4, 3, 1)
    assert summary["failure_reasons"] == {"NotebookOSExecutorFailed": 1}
    assert not Path(state_dir).exists()
    assert _left_running(state_dir) == [] and killed > 0


def test_torch_cells_carry_model_and_optimizer_state_across_cells(tmp_path: Path) -> None:
    """--work torch: a real training loop per cell; the model and Adam's state built by the
    first cell are there (replicated, on the cell's device) for the next ones."""
    require_torch()
    template = _template(tmp_path / "torch.json", [
        {"id": "t", "start_tick": 0, "stop_tick": 8,
         "trainings": [_training(2, 1, 1), _training(4, 1, 1), _training(6, 1, 1)]},
    ])
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "notebookos.cli", "replay", "--template", str(template),
         "--time-scale", "0.05", "--local", "3x1", "--work", "torch", "--out", str(out),
         "--quiet", "--no-simulate", "--no-plots"],
        capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["tasks_completed"], summary["state_check_failures"]) == (3, 0), summary
    rows = sorted(csv.DictReader((out / "tasks.csv").open()), key=lambda r: int(r["index"]))
    assert [r["state_ok"] for r in rows] == ["1", "1", "1"]
    assert all(r["device"] in ("cpu", "cuda:0") for r in rows)
    assert [r["moved_by_kernel"] for r in rows] == ["", "1", "1"]
    assert not Path(summary["local_state_dir"]).exists()


def test_ctrl_c_stops_cleanly_and_keeps_what_was_measured(tmp_path: Path) -> None:
    # Two sessions, one running a cell at the Ctrl-C: each must be closed (a second session's
    # close was once cut short when the first one's finished, leaving it open on the server).
    template = _template(tmp_path / "long.json", [
        {"id": "a", "start_tick": 0, "stop_tick": 40,
         "trainings": [_training(1, 1, 1), _training(30, 1, 1)]},
        {"id": "b", "start_tick": 0, "stop_tick": 40, "trainings": [_training(2, 20, 1)]},
    ])
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "notebookos.cli", "replay", "--template", str(template),
         "--time-scale", "0.1", "--local", "3x1", "--out", str(out), "--quiet"],
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        for line in proc.stderr:
            if line.startswith("replay: playing") or time.monotonic() > deadline:
                break
        # A tick is 6 s: a/0 (at 6 s, 6 s long, after its kernel's start) is done, a/1 is due
        # at 180 s, b/0 runs (from 12 s, 120 s long).
        time.sleep(25)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)  # impatient: a second Ctrl-C still closes everything
        rest = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, rest
    # The second Ctrl-C may come after the sessions closed, while the results are written: it
    # once cut the writing short (no summary, "interrupted while starting")
    assert "interrupted while starting" not in rest, rest
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] and summary["tasks_completed"] == 1
    # The simulator played the part the run did (a/0 and b/0 were due), not the whole plan.
    assert 12.0 < summary["stopped_at_s"] < 180.0
    assert summary["simulated"]["tasks_submitted"] == summary["tasks_submitted"] == 2
    rows = {r["task_id"]: r for r in csv.DictReader((out / "tasks.csv").open())}
    assert rows["a/1"]["status"] == "not_submitted" and "stopped" in rows["a/1"]["reason"]
    assert rows["b/0"]["status"] == "failed" and "stopped while" in rows["b/0"]["reason"]
    sessions = list(csv.DictReader((out / "sessions.csv").open()))
    assert len(sessions) == 2 and all(s["stopped_s"] for s in sessions), sessions  # closed
    assert not Path(summary["local_state_dir"]).exists()
    assert _left_running(summary["local_state_dir"]) == []
