"""The replayed cells' code (run here in plain Python), the per-run summary, the comparison, and
the simulator's policy parameters matching the live Global Scheduler's."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

from notebookos.config import load_config
from notebookos.replay.cells import cell_code, parse_marker
from notebookos.replay.compare import comparison_table, live_policy_params
from notebookos.replay.records import COMPLETED, FAILED, RunResult, SessionResult, TaskResult
from notebookos.replay.records import summarize as summarize_run
from notebookos.testing.optional import require_torch


def _run(code: str, namespace: dict) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<cell>", "exec"), namespace)  # noqa: S102 - the cell under test
    marker = parse_marker(out.getvalue())
    assert marker is not None, out.getvalue()
    return marker


def test_sleep_cells_check_the_previous_cells_state() -> None:
    ns: dict = {}
    first = _run(cell_code("sleep", "s", 0, 0.01, None), ns)
    assert first["state_ok"] and first["seen"] is None and first["cell"] == 0
    assert ns["replay_state"] == {"session": "s", "cell": 0}
    second = _run(cell_code("sleep", "s", 1, 0.01, 0), ns)
    assert second["state_ok"] and second["seen"] == 0
    assert second["t_end"] - second["t_start"] >= 0.01
    # A cell that expects another state (its predecessor's was lost) says so, while saying
    # that what it saw is a consistent state of its own session.
    third = _run(cell_code("sleep", "s", 2, 0.0, 0), ns)
    assert not third["state_ok"] and third["seen"] == 1 and third["consistent"]
    # The helper is gone from the namespace: only replay_state is left behind.
    assert {k for k in ns if not k.startswith("__")} == {"replay_state"}


def test_torch_cells_train_and_carry_model_and_optimizer_state() -> None:
    require_torch()
    ns: dict = {}
    first = _run(cell_code("torch", "s", 0, 0.05, None), ns)
    assert first["state_ok"] and first["steps"] >= 1 and first["device"] == "cpu"
    assert first["moved_by_kernel"] is None  # created here, nothing to move yet
    second = _run(cell_code("torch", "s", 1, 0.05, 0), ns)
    assert second["state_ok"] and second["steps_before"] == first["steps_after"]
    assert second["moved_by_kernel"] is True  # on the CPU, where the cell runs
    # An optimizer that lost its state fails the next check.
    ns["replay_optimizer"].state.clear()
    third = _run(cell_code("torch", "s", 2, 0.0, 1), ns)
    assert not third["state_ok"] and not third["consistent"]


def test_unknown_work_is_refused() -> None:
    with pytest.raises(ValueError, match="--work"):
        cell_code("gpu-burn", "s", 0, 1.0, None)


def _task(i: int, status: str, delay: float, gpus: int = 1, migrated: bool = False) -> TaskResult:
    t = TaskResult(f"s/{i}", "s", i, gpus, 10.0 * i, 2.0, status=status)
    t.submit_s, t.execute_input_s = 10.0 * i, 10.0 * i + delay
    t.interactivity_s = delay
    if status == COMPLETED:
        t.reply_s, t.tct_s = 10.0 * i + delay + 2.0, delay + 2.0
    t.migrated, t.immediate = migrated, (not migrated and delay <= 1.0)
    return t


def test_summary_figures() -> None:
    tasks = [_task(0, COMPLETED, 0.1), _task(1, COMPLETED, 0.2), _task(2, COMPLETED, 5.0,
                                                                          migrated=True),
             _task(3, FAILED, 0.3)]
    tasks[3].reason = "NotebookOSExecutorFailed: the executor died"
    session = SessionResult("s", 1, "notebookos", 0.0, 40.0, 4)
    session.start_requested_s, session.started_s, session.stopped_s = 0.0, 1.0, 41.0
    session.ready_s = 6.5  # POST answers before the replicas are up
    samples = [(0.0, 3, 6, 0, 0, 1, 1.0), (10.0, 3, 6, 2, 0, 1, 1.0), (20.0, 3, 6, 0, 0, 1, 1.0)]
    run = RunResult(tasks, [session], samples=samples, end_s=30.0)
    s = summarize_run(run, reservation=False)
    assert (s["tasks_submitted"], s["tasks_completed"], s["tasks_failed"]) == (4, 3, 1)
    assert s["failure_reasons"] == {"NotebookOSExecutorFailed": 1}
    assert s["immediate_fraction"] == 0.75
    assert s["migrations"] == 1
    assert s["interactivity_p50_s"] == pytest.approx(0.25)
    assert s["gpu_hours_committed_sampled"] == pytest.approx(20.0 / 3600, abs=1e-6)
    assert s["gpu_hours_committed"] == s["gpu_hours_committed_sampled"]
    assert s["gpu_hours_reservation"] == pytest.approx(40.0 / 3600, abs=1e-6)
    assert s["kernel_start_p50_s"] == 1.0 and s["kernel_ready_p50_s"] == 6.5
    assert summarize_run(run, reservation=True)["gpu_hours_committed_client"] == \
        pytest.approx(40.0 / 3600, abs=1e-6)


def test_comparison_flags_disagreements_over_ten_percent() -> None:
    table = comparison_table(
        {"interactivity_p50_s": 1.0, "interactivity_p90_s": 0.03, "tasks_submitted": 10,
         "tasks_failed": 3},
        {"interactivity_p50_s": 2.0, "interactivity_p90_s": 0.0, "tasks_submitted": 10,
         "tasks_failed": 0})
    assert "| interactivity p50 (s) | 1.000 | 2.000 | -50% **>10%** |" in table
    assert "| interactivity p90 (s) | 0.030 | 0.000 | +0.03 (simulated 0) |" in table
    assert "| tasks failed | 3 | 0 | +3 (simulated 0) **>10%** |" in table
    assert "| tasks submitted | 10 | 10 | 0% |" in table


@pytest.mark.parametrize("policy", ["notebookos", "reservation", "batch", "lcp"])
@pytest.mark.parametrize("ratio", [0.5, 1.0, 7.0])
def test_simulated_policy_matches_the_live_global_schedulers(policy: str, ratio: float) -> None:
    from notebookos.global_scheduler.daemon import make_policy
    from notebookos.policies import get_policy

    config = load_config(env={}, overrides={"cluster.policy": policy,
                                            "cluster.max_subscription_ratio": ratio})
    live = make_policy(config)
    simulated = get_policy(policy, **live_policy_params(config))
    assert vars(simulated) == vars(live)


def test_cli_refuses_bad_input_with_a_message(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    cases = [
        (["--template", str(bad), "--local", "3x2"], "not a readable JSON template"),
        (["--template", str(tmp_path / "none.json"), "--local", "3x2"], "no such trace file"),
        (["--generate", "1", "--local", "3by2"], "HOSTSxGPUS"),
        (["--generate", "1", "--local", "3x2", "--time-scale", "0"], "time-scale"),
        (["--generate", "1", "--url", "ftp://x", "--no-simulate"], "--url"),
        (["--generate", "1", "--local", "3x2", "--sim-set", "nope=1"], "nope"),
    ]
    for argv, message in cases:
        out = subprocess.run([sys.executable, "-m", "notebookos.cli", "replay", *argv],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, (argv, out.stderr)
        assert message in out.stderr and "Traceback" not in out.stderr, (argv, out.stderr)


def test_the_schedulers_reply_metadata_is_used_when_present_and_optional() -> None:
    """Issue 16's ``metadata.notebookos`` block (executor, host, GPUs, delay, waits) fills the
    record; without it the record still completes from the cell's own marker."""
    import asyncio

    from notebookos.replay.driver import Replay, ReplayOptions
    from notebookos.replay.jupyter import Execution
    from notebookos.resources import ResourceSpec
    from notebookos.workload.model import Session, Task, Workload

    spec = ResourceSpec(1000, 2048, 2, 0.0)
    workload = Workload((Session("s", 0.0, 10.0, spec, (Task("s/0", "s", 1.0, 1.0, spec),
                                                         Task("s/1", "s", 5.0, 1.0, spec))),))

    async def record(metadata: dict) -> TaskResult:
        replay = Replay(None, workload, ReplayOptions())  # type: ignore[arg-type]
        replay.t0 = 100.0
        execution = Execution("m", 101.0)
        execution.execute_input, execution.reply_at, execution.idle = 101.02, 102.05, 102.06
        execution.reply = {"status": "ok"}
        execution.reply_metadata = metadata
        execution.marker = {"t_start": 101.03, "t_end": 102.03, "seen": None, "state_ok": True,
                            "device": "cpu", "gpus": None}
        result = replay.tasks["s/0"]
        replay._record_execution(result, execution)
        return result

    bare = asyncio.run(record({}))
    assert bare.status == COMPLETED and bare.state_ok and bare.immediate
    assert bare.interactivity_s == pytest.approx(0.02) and bare.tct_s == pytest.approx(1.05)
    full = asyncio.run(record({"notebookos": {
        "role": "executor", "replica_id": 2, "host_id": "host-1", "gpu_device_ids": [0, 1],
        "interactivity_delay_ms": 15.0, "waited_ms": 800, "waited_for": "GPUs"}}))
    assert (full.executor_replica, full.executor_host, full.gpu_device_ids) == (2, "host-1", "0+1")
    assert full.scheduler_delay_s == pytest.approx(0.015)
    assert full.immediate is False  # the scheduler says the cell waited for its GPUs


def test_state_check_follows_how_the_previous_cells_really_ended() -> None:
    """A cell sent while its predecessor still ran expects that predecessor's state; when the
    predecessor then fails (its executor died, it timed out), the cell rightly sees the state of
    the last completed cell, and that is not a state-check failure. Seeing anything else is."""
    from notebookos.replay.driver import Replay, ReplayOptions
    from notebookos.replay.jupyter import Execution
    from notebookos.resources import ResourceSpec
    from notebookos.workload.model import Session, Task, Workload

    spec = ResourceSpec(1000, 2048, 1, 0.0)
    workload = Workload((Session("s", 0.0, 30.0, spec, tuple(
        Task(f"s/{i}", "s", 5.0 * i, 1.0, spec) for i in range(3))),))

    def third_cell(seen: int | None) -> TaskResult:
        replay = Replay(None, workload, ReplayOptions())  # type: ignore[arg-type]
        replay.t0 = 100.0
        replay.tasks["s/0"].status = COMPLETED
        replay.tasks["s/1"].status = FAILED  # failed after s/2 had been sent expecting it
        execution = Execution("m", 110.0)
        execution.execute_input, execution.reply_at, execution.idle = 110.02, 111.05, 111.06
        execution.reply = {"status": "ok"}
        execution.marker = {"t_start": 110.03, "t_end": 111.03, "seen": seen, "expected": 1,
                            "state_ok": seen == 1, "consistent": True, "device": "cpu",
                            "gpus": None}
        replay._record_execution(replay.tasks["s/2"], execution)
        return replay.tasks["s/2"]

    assert third_cell(0).state_ok is True
    wrong = third_cell(1)  # the failed cell's state: its effects were not discarded
    assert wrong.state_ok is False and "expected the state of cell 0, saw 1" in wrong.reason


def test_progress_bar_shows_trace_time_and_the_replay_time_it_is_played_in() -> None:
    """At time scale 0.005, 37 s of a 155 s replay are 2.1 of 8.6 trace hours."""
    from notebookos.replay.progress import ReplayProgress, trace_span

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    bar = ReplayProgress(53, 154.8, time_scale=0.005, file=out)
    bar({"done": 7, "open_sessions": 5, "elapsed_s": 37.0})
    bar.close()
    text = out.getvalue()
    assert "7/53" in text and "sessions open 5" in text, text
    assert "trace 2.1 h of 8.6 h, 6.5 h left (replay 37/155 s)" in text, text
    assert (trace_span(30), trace_span(750), trace_span(9000)) == ("30 s", "12.5 min", "2.5 h")


def test_the_clusters_kernel_states_mark_sessions_ready_or_failed() -> None:
    """From the extension's samples: past ``starting`` is ready; ``failed`` fails the session
    with the cluster's reason although no cell of it is due (an idle reservation session whose
    GPUs could not be bound once passed unnoticed)."""
    from notebookos.replay.driver import Replay, ReplayOptions
    from notebookos.resources import ResourceSpec
    from notebookos.workload.model import Session, Workload

    spec = ResourceSpec(1000, 2048, 1, 0.0)
    replay = Replay(None, Workload((Session("ok", 0.0, 9.0, spec, ()),  # type: ignore[arg-type]
                                    Session("idle", 0.0, 9.0, spec, ()))), ReplayOptions())
    for sid in ("ok", "idle"):
        replay.sessions[sid] = SessionResult(sid, 1, "notebookos", 0.0, 9.0, 0)
        replay.sessions[sid].kernel_id = f"k-{sid}"
    replay._note_ready({"id": "k-ok", "state": "starting"})
    assert replay.sessions["ok"].ready_s is None
    replay._note_ready({"id": "k-ok", "state": "idle"})
    replay._note_ready({"id": "k-idle", "state": "failed", "message": "host host-0 cannot bind "
                        "1 GPU(s) for the session"})
    assert replay.sessions["ok"].ready_s is not None and not replay.sessions["ok"].failure
    idle = replay.sessions["idle"]
    assert idle.ready_s is None and "cannot bind 1 GPU(s)" in idle.failure


def test_a_cell_whose_code_starts_twice_is_reported() -> None:
    """A cell resubmitted after its kernel was rebuilt although its code had started (seen when
    every replica of a kernel was SIGKILLed mid-cell): two execute_input messages for one
    request. The run counts it; at-most-once forbids it."""
    from notebookos.replay.driver import Replay, ReplayOptions
    from notebookos.replay.jupyter import Execution, KernelChannel
    from notebookos.resources import ResourceSpec
    from notebookos.workload.model import Session, Task, Workload

    channel = KernelChannel.__new__(KernelChannel)  # no websocket: messages are fed by hand
    channel.pending, channel.statuses, channel.closed_reason = {}, [], ""
    execution = Execution("m", 100.5)
    channel.pending["m"] = execution

    def feed(kind: str, at: float, content: dict | None = None) -> None:
        channel._dispatch({"header": {"msg_type": kind}, "parent_header": {"msg_id": "m"},
                           "content": content or {}, "channel": "shell" if kind ==
                           "execute_reply" else "iopub"}, at)

    feed("execute_input", 101.0)
    feed("execute_input", 104.0)  # the rebuilt kernel runs it again
    feed("stream", 105.0, {"name": "stdout", "text": '@@notebookos-replay {"t_start": 104.1, '
                           '"t_end": 105.0, "seen": null, "state_ok": true, "consistent": true}'})
    feed("execute_reply", 105.1, {"status": "ok"})
    feed("status", 105.2, {"execution_state": "idle"})
    assert execution.execute_input == 101.0 and execution.starts == 2

    spec = ResourceSpec(1000, 2048, 1, 0.0)
    replay = Replay(None, Workload((Session("s", 0.0, 9.0, spec,  # type: ignore[arg-type]
                                            (Task("s/0", "s", 0.5, 1.0, spec),)),)),
                    ReplayOptions())
    replay.t0 = 100.0
    record = replay.tasks["s/0"]
    replay._record_execution(record, execution)
    assert record.status == COMPLETED and record.starts == 2
    assert "started 2 times" in record.reason
    record.submit_s = 0.5
    summary = summarize_run(RunResult([record], []), reservation=False)
    assert summary["cells_started_twice"] == 1
