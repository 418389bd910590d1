"""What a replay measures: one record per task and per session, cluster samples, the summary.

Times are seconds from the start of the run on this machine's clock (``time.time()``), so they
compare with the plan's times (trace times x the time scale).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

COMPLETED, FAILED, NOT_SUBMITTED = "completed", "failed", "not_submitted"


@dataclass
class TaskResult:
    task_id: str
    session_id: str
    index: int  # the cell's position in its session
    gpus: int  # what the kernel binds per cell (its kernelspec's GPUs)
    planned_submit_s: float
    duration_s: float  # the work the cell was asked to do (scaled)
    status: str = NOT_SUBMITTED
    reason: str = ""
    submit_s: float | None = None  # execute_request sent
    execute_input_s: float | None = None  # the kernel said the code starts
    work_start_s: float | None = None  # the cell's first statement (kernel clock)
    work_end_s: float | None = None
    reply_s: float | None = None  # execute_reply received
    idle_s: float | None = None
    # From the cell's planned time (when the user runs it; a cell due while its kernel was
    # still starting is sent once the kernel is up, and the user waits meanwhile) to
    # execute_input (paper 5.3.1) and to the reply. ``wire_delay_s``: from the websocket send.
    interactivity_s: float | None = None
    tct_s: float | None = None
    wire_delay_s: float | None = None
    state_ok: bool | None = None  # the previous completed cell's state was there
    state_seen: int | None = None
    executor_replica: int | None = None
    executor_host: str = ""
    gpu_device_ids: str = ""  # "0+1" as the cell saw them (notebookos.kernel.assigned_gpus())
    device: str = ""  # the torch device the cell ran on
    moved_by_kernel: bool | None = None  # torch: model and optimizer already on that device
    migrated: bool = False  # the executor ran on a host where the kernel had no replica before
    immediate: bool | None = None
    scheduler_delay_s: float | None = None  # the scheduler's own measure, when it reports one
    starts: int = 0  # execute_input messages seen; > 1: the code started more than once

    def row(self) -> list[Any]:
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float):
                value = f"{value:.4f}"
            elif isinstance(value, bool):
                value = int(value)
            out.append("" if value is None else value)
        return out


@dataclass
class SessionResult:
    session_id: str
    gpus: int
    kernel_name: str
    planned_start_s: float
    planned_stop_s: float
    tasks: int
    jupyter_session: str = ""
    kernel_id: str = ""
    start_requested_s: float | None = None
    started_s: float | None = None  # POST /api/sessions answered
    # The cluster first reported the kernel past ``starting`` (its replicas up): POST returns
    # before that, since a kernel takes cells while its replicas start (they wait for them).
    ready_s: float | None = None
    stopped_s: float | None = None  # DELETE /api/sessions answered
    failure: str = ""

    @property
    def start_latency_s(self) -> float | None:
        if self.started_s is None or self.start_requested_s is None:
            return None
        return self.started_s - self.start_requested_s

    @property
    def ready_latency_s(self) -> float | None:
        if self.ready_s is None or self.start_requested_s is None:
            return None
        return self.ready_s - self.start_requested_s

    def row(self) -> list[Any]:
        values = [*(getattr(self, f.name) for f in fields(self)), self.start_latency_s,
                  self.ready_latency_s]
        return ["" if v is None else (f"{v:.4f}" if isinstance(v, float) else v) for v in values]


TASK_COLUMNS = [f.name for f in fields(TaskResult)]
SESSION_COLUMNS = [*(f.name for f in fields(SessionResult)), "start_latency_s",
                   "ready_latency_s"]
SAMPLE_COLUMNS = ("time_s", "hosts", "gpus_total", "gpus_committed", "gpus_pending",
                  "kernels", "subscription_ratio_limit")


@dataclass
class RunResult:
    tasks: list[TaskResult]
    sessions: list[SessionResult]
    samples: list[tuple] = field(default_factory=list)
    cluster_migrations: int = 0  # replica host changes seen in the cluster samples
    interrupted: bool = False
    stopped_at_s: float | None = None  # when the run was stopped (Ctrl-C), if it was
    notes: list[str] = field(default_factory=list)  # e.g. a daemon of the local cluster died
    wall_s: float = 0.0
    end_s: float = 0.0


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(np.asarray(values, dtype=float), q)), 4) if values else None


def _integral(samples: list[tuple], column: int, end_s: float) -> float:
    """Piecewise-constant integral (value x seconds) of a sampled column up to ``end_s``."""
    total = 0.0
    for (t0, *rest0), (t1, *_) in zip(samples, [*samples[1:], (end_s,)], strict=True):
        value = rest0[column - 1]
        total += max(0.0, min(t1, end_s) - t0) * float(value or 0)
    return total


def summarize(run: RunResult, reservation: bool) -> dict[str, Any]:
    submitted = [t for t in run.tasks if t.status != NOT_SUBMITTED]
    done = [t for t in submitted if t.status == COMPLETED]
    failed = [t for t in submitted if t.status == FAILED]
    delays = [t.interactivity_s for t in submitted if t.interactivity_s is not None]
    tcts = [t.tct_s for t in done if t.tct_s is not None]
    immediate = [t.immediate for t in submitted if t.immediate is not None]
    starts = [s.start_latency_s for s in run.sessions if s.start_latency_s is not None]
    ready = [s.ready_latency_s for s in run.sessions if s.ready_latency_s is not None]
    per_task_gpu_s = sum(t.gpus * (t.reply_s - t.execute_input_s) for t in submitted
                         if t.reply_s is not None and t.execute_input_s is not None)
    session_gpu_s = 0.0
    for s in run.sessions:
        if s.started_s is not None:
            end = s.stopped_s if s.stopped_s is not None else run.end_s
            session_gpu_s += s.gpus * max(0.0, end - s.started_s)
    sampled = _integral(run.samples, 3, run.end_s) if len(run.samples) >= 2 else None
    estimated = session_gpu_s if reservation else per_task_gpu_s
    reasons: dict[str, int] = {}
    for t in failed:
        key = t.reason.split(":", 1)[0][:80]
        reasons[key] = reasons.get(key, 0) + 1
    return {
        "tasks_planned": len(run.tasks),
        "tasks_submitted": len(submitted),
        "tasks_completed": len(done),
        "tasks_failed": len(failed),
        "failure_reasons": reasons,
        "state_check_failures": sum(1 for t in done if t.state_ok is False),
        "cells_started_twice": sum(1 for t in submitted if t.starts > 1),
        "cells_sent_late": sum(1 for t in submitted if t.submit_s is not None
                               and t.submit_s - t.planned_submit_s > 0.5),
        "sessions": len(run.sessions),
        "sessions_failed": sum(1 for s in run.sessions if s.failure),
        "interactivity_p50_s": _pct(delays, 50),
        "interactivity_p90_s": _pct(delays, 90),
        "interactivity_p99_s": _pct(delays, 99),
        "interactivity_avg_s": round(float(np.mean(delays)), 4) if delays else None,
        "tct_p50_s": _pct(tcts, 50),
        "tct_p90_s": _pct(tcts, 90),
        "tct_p99_s": _pct(tcts, 99),
        "immediate_fraction": round(sum(immediate) / len(immediate), 6) if immediate else None,
        "migrations": sum(1 for t in submitted if t.migrated),
        "replica_moves_seen": run.cluster_migrations,
        "gpu_hours_committed": round((sampled if sampled is not None else estimated) / 3600, 6),
        "gpu_hours_committed_sampled": None if sampled is None else round(sampled / 3600, 6),
        "gpu_hours_committed_client": round(estimated / 3600, 6),
        "gpu_hours_used": round(sum(t.gpus * t.duration_s for t in done) / 3600, 6),
        "gpu_hours_reservation": round(session_gpu_s / 3600, 6),
        "kernel_start_p50_s": _pct(starts, 50),
        "kernel_start_p90_s": _pct(starts, 90),
        "kernel_ready_p50_s": _pct(ready, 50),
        "kernel_ready_p90_s": _pct(ready, 90),
        "interrupted": run.interrupted,
        "stopped_at_s": None if run.stopped_at_s is None else round(run.stopped_at_s, 3),
        "cluster_notes": run.notes,
        "wall_s": round(run.wall_s, 3),
    }


def write_run(out: Path, summary: dict[str, Any], run: RunResult) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    with (out / "tasks.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(TASK_COLUMNS)
        writer.writerows(t.row() for t in sorted(run.tasks, key=lambda t: (
            t.planned_submit_s, t.task_id)))
    with (out / "sessions.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(SESSION_COLUMNS)
        writer.writerows(s.row() for s in run.sessions)
    with (out / "cluster_samples.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(SAMPLE_COLUMNS)
        writer.writerows(run.samples)

