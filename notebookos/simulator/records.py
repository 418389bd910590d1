"""What a run records: one row per task, timeline samples, running integrals, the summary."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

TASK_COLUMNS = ("task_id", "session_id", "gpus", "submit_s", "bound_s", "start_s", "end_s",
                "host", "executor", "reused_executor", "migrated", "preemptions")
TIMELINE_COLUMNS = ("time_s", "active_sessions", "running_tasks", "waiting_tasks", "hosts",
                    "gpus_provisioned", "gpus_committed", "subscription_ratio", "migrations",
                    "gpus_in_use", "sr_limit")


@dataclass(slots=True)
class TaskRecord:
    task_id: str
    session_id: str
    gpus: int
    submit: float
    duration: float
    bound: float | None = None  # GPUs committed for this task
    start: float | None = None  # code starts (interactivity ends here)
    end: float | None = None
    host: str = ""
    executor: str = ""
    reused_executor: bool | None = None
    migrated: bool = False
    preemptions: int = 0

    def row(self) -> tuple:
        def fmt(x: float | None) -> str:
            return "" if x is None else f"{x:.3f}"

        reused = "" if self.reused_executor is None else int(self.reused_executor)
        return (self.task_id, self.session_id, self.gpus, fmt(self.submit), fmt(self.bound),
                fmt(self.start), fmt(self.end), self.host, self.executor, reused,
                int(self.migrated), self.preemptions)


@dataclass
class Integrals:
    """Piecewise-constant quantities integrated over time (unit x seconds)."""

    last: float = 0.0
    hosts: int = 0
    committed_gpus: int = 0
    standby_gpu_equiv: float = 0.0  # sum over standby replicas of their GPU request
    standby_replicas: int = 0  # replicas of replicated kernels that are not executing
    replicas: int = 0  # replica containers of session kernels, executing or not
    hibernated_replicas: int = 0  # replicas that hibernated sessions would hold awake
    host_s: float = 0.0
    committed_gpu_s: float = 0.0
    standby_gpu_s: float = 0.0
    standby_replica_s: float = 0.0
    replica_s: float = 0.0
    hibernated_replica_s: float = 0.0

    def advance(self, now: float) -> None:
        dt = now - self.last
        if dt > 0:
            self.host_s += self.hosts * dt
            self.committed_gpu_s += self.committed_gpus * dt
            self.standby_gpu_s += self.standby_gpu_equiv * dt
            self.standby_replica_s += self.standby_replicas * dt
            self.replica_s += self.replicas * dt
            self.hibernated_replica_s += self.hibernated_replicas * dt
            self.last = now


@dataclass
class RunRecord:
    policy: str
    tasks: list[TaskRecord] = field(default_factory=list)
    timeline: list[tuple] = field(default_factory=list)
    integrals: Integrals = field(default_factory=Integrals)
    migrations: int = 0
    scale_in_migrations: int = 0  # standby replicas moved off idle hosts to release them
    scale_outs: int = 0
    scale_ins: int = 0
    unschedulable: list[str] = field(default_factory=list)
    end_time: float = 0.0
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)  # a policy's own figures, merged into the summary
    reserves_gpus: bool = False  # the policy binds GPUs for the session (reservation)
    hibernations: int = 0  # idle sessions whose replicas stopped (SimConfig.hibernate_after_s)
    wake_delays: list[float] = field(default_factory=list)  # per wake: cell held back, s


def _pct(values: np.ndarray, q: float) -> float | None:
    return None if values.size == 0 else round(float(np.percentile(values, q)), 3)


def _mean(values: np.ndarray) -> float | None:
    return None if values.size == 0 else round(float(values.mean()), 3)


def summarize(record: RunRecord, gpus_per_host: int, gpu_usd_per_hour: float, markup: float,
              standby_fraction: float, *, immediate_within_s: float = 1.0,
              standby_billing: str = "flat", reservation_billing: str = "reserved") -> dict:
    """The run's figures. Billing (paper 5.5): the provider pays every provisioned host-hour;
    users pay ``markup`` x the GPU rate for the GPU-hours their cells run, a reservation for every
    GPU-hour it holds (``reservation_billing="usage"``: only what its cells run), and each
    standby replica of a replicated kernel pays ``standby_fraction`` x ``markup`` x the host's
    rate per hour (``standby_billing="flat"``, 5.5's example) or that share of its own GPUs' rate
    (``"per_gpu"``). A task is immediate when its code starts within ``immediate_within_s`` of
    its submission, whatever the policy."""
    done = [t for t in record.tasks if t.end is not None]
    jct = np.array([t.end - t.submit for t in done], dtype=float)
    queue = np.array([t.end - t.submit - t.duration for t in done], dtype=float)
    started = [t for t in record.tasks if t.start is not None]
    delay = np.array([t.start - t.submit for t in started], dtype=float)
    immediate = int((delay <= immediate_within_s + 1e-9).sum()) if started else 0
    reuse = [t.reused_executor for t in record.tasks if t.reused_executor is not None]
    first_submit = min((t.submit for t in record.tasks), default=0.0)
    makespan = max((t.end for t in done), default=first_submit) - first_submit
    integ = record.integrals
    provisioned_gpu_h = integ.host_s * gpus_per_host / 3600.0
    committed_gpu_h = integ.committed_gpu_s / 3600.0
    used_gpu_h = sum(t.gpus * t.duration for t in done) / 3600.0
    standby_gpu_h = integ.standby_gpu_s / 3600.0
    standby_replica_h = integ.standby_replica_s / 3600.0
    cost = provisioned_gpu_h * gpu_usd_per_hour
    charged_gpu_h = (committed_gpu_h if record.reserves_gpus and reservation_billing == "reserved"
                     else used_gpu_h)
    if standby_billing == "flat":
        standby_revenue = standby_fraction * markup * gpu_usd_per_hour * gpus_per_host \
            * standby_replica_h
    else:
        standby_revenue = standby_fraction * markup * gpu_usd_per_hour * standby_gpu_h
    usage_revenue = markup * gpu_usd_per_hour * charged_gpu_h
    revenue = usage_revenue + standby_revenue
    return {
        "policy": record.policy,
        "jobs": len(record.tasks),
        "completed": len(done),
        "unschedulable": len(record.unschedulable),
        "avg_jct_s": _mean(jct),
        "p50_jct_s": _pct(jct, 50),
        "p99_jct_s": _pct(jct, 99),
        "avg_queue_s": _mean(queue),
        "p99_queue_s": _pct(queue, 99),
        "p999_queue_s": _pct(queue, 99.9),
        "makespan_s": round(makespan, 3),
        "interactivity_p50_s": _pct(delay, 50),
        "interactivity_p90_s": _pct(delay, 90),
        "interactivity_p99_s": _pct(delay, 99),
        "interactivity_avg_s": _mean(delay),
        "immediate_fraction": round(immediate / len(started), 6) if started else None,
        "executor_reuse_fraction": round(sum(reuse) / len(reuse), 6) if reuse else None,
        "migrations": record.migrations,
        "scale_in_migrations": record.scale_in_migrations,
        "preemptions": sum(t.preemptions for t in record.tasks),
        "scale_outs": record.scale_outs,
        "scale_ins": record.scale_ins,
        "gpu_hours_provisioned": round(provisioned_gpu_h, 3),
        "gpu_hours_committed": round(committed_gpu_h, 3),
        "gpu_hours_used": round(used_gpu_h, 3),
        "gpu_hours_standby": round(standby_gpu_h, 3),
        "standby_replica_hours": round(standby_replica_h, 3),
        "cost_usd": round(cost, 2),
        "revenue_usd": round(revenue, 2),
        "revenue_usage_usd": round(usage_revenue, 2),
        "revenue_standby_usd": round(standby_revenue, 2),
        "profit_margin": round((revenue - cost) / revenue, 4) if revenue > 0 else None,
        **hibernation_figures(record),
        "simulated_s": round(record.end_time, 3),
        "wall_s": round(record.wall_s, 4),
        **record.extra,
    }


def hibernation_figures(record: RunRecord) -> dict:
    """Replica-hours held by session kernels, and what hibernation saved of them: the replicas
    a hibernated session would have held awake, from its hibernation to its wake (or its end).
    A wake's delay is the time from the cell that woke the session to its kernel being up again
    (placing its replicas, which may wait like a start, and the wake itself)."""
    integ = record.integrals
    delays = np.array(record.wake_delays, dtype=float)
    held_h = integ.replica_s / 3600.0
    saved_h = integ.hibernated_replica_s / 3600.0
    return {
        "replica_hours": round(held_h, 3),
        "replica_hours_without_hibernation": round(held_h + saved_h, 3),
        "replica_hours_saved": round(saved_h, 3),
        "hibernations": record.hibernations,
        "wakes": int(delays.size),
        "wake_delay_p50_s": _pct(delays, 50),
        "wake_delay_p99_s": _pct(delays, 99),
        "wake_delay_avg_s": _mean(delays),
    }


def cell_waits(record: RunRecord) -> dict[str, list[float]]:
    """Per session, how long each started cell waited after it could have started (its submit,
    or the end of the session's previous cell, whichever is later)."""
    waits: dict[str, list[float]] = {}
    by_session: dict[str, list[TaskRecord]] = {}
    for task in record.tasks:
        if task.start is not None:
            by_session.setdefault(task.session_id, []).append(task)
    for session_id, tasks in by_session.items():
        previous_end = 0.0
        for task in sorted(tasks, key=lambda t: t.start):
            waits.setdefault(session_id, []).append(task.start - max(task.submit, previous_end))
            previous_end = task.end if task.end is not None else task.start
    return waits
