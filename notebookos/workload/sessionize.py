"""Group a job trace's tasks into notebook sessions with the Sensei-calibrated session model.

The Sensei CSV exports (traces/README.md) list training events without a session id. To replay
them as notebooks, each task is put into a session the way the synthetic generator
(``notebookos.workload.generator``) builds sessions:

- tasks are taken in submit order; a task joins an open session with the same GPU count whose
  previous task ended at least the shortest Sensei gap (4 min) before it was submitted, choosing
  the session that became free most recently (the smallest gap: the Sensei gap distribution is
  concentrated just above its minimum, median 5 min);
- a task that finds none opens a new session, which started a gap drawn from the Sensei gap
  distribution before the task and lives a log-normal time (the generator's median and sigma);
  a session that is past its planned end takes no more tasks;
- a session stops at its planned end, or after its last task ends if that is later, cut at
  the end of the trace;
- then idle sessions (which never train) are added, so that they are the generator's share of
  all sessions: Poisson arrivals over the trace, GPU count from the Sensei mix, log-normal lives.

Deterministic for a given seed. Tasks keep their ids, submit times, durations and GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from notebookos.resources import ResourceSpec
from notebookos.workload.generator import GAP_KNOTS_MIN, GPU_MIX, SenseiParams, _quantile
from notebookos.workload.model import Session, Task, Workload

MIN_GAP_S = GAP_KNOTS_MIN[0][1] * 60.0


@dataclass
class _Open:
    session_id: str
    gpus: int
    start: float
    planned_stop: float
    last_end: float
    tasks: list[Task] = field(default_factory=list)


def task_request(gpus: int) -> ResourceSpec:
    """The request the generator gives a training of ``gpus`` GPUs."""
    return ResourceSpec(millicpus=1000 * gpus, memory_mb=4096 * gpus, gpus=gpus, vram_gb=8.0 * gpus)


def sessionize(workload: Workload, seed: int = 0, params: SenseiParams | None = None,
               idle_sessions: bool = True) -> Workload:
    """``workload``'s tasks grouped into sessions (see the module docstring)."""
    params = params or SenseiParams(hours=max(workload.span_s, 1.0) / 3600.0, seed=seed)
    rng = np.random.default_rng(seed)
    tasks = workload.tasks
    trace_end = workload.span_s
    open_by_gpus: dict[int, list[_Open]] = {}
    closed: list[_Open] = []
    counter = 0

    def life_s() -> float:
        return 3600.0 * float(np.exp(math.log(params.session_hours_median)
                                     + params.session_hours_sigma * rng.standard_normal()))

    for task in tasks:
        pool = open_by_gpus.setdefault(task.gpus, [])
        still_open = []
        for s in pool:
            (still_open if s.planned_stop >= task.submit else closed).append(s)
        pool[:] = still_open
        free = [s for s in pool if s.last_end + MIN_GAP_S <= task.submit]
        if free:
            chosen = max(free, key=lambda s: (s.last_end, s.session_id))
        else:
            gap = 60.0 * _quantile(GAP_KNOTS_MIN, float(rng.random()))
            start = max(0.0, task.submit - gap)
            chosen = _Open(f"session-{seed}-{counter:06d}", task.gpus, start, start + life_s(),
                           start)
            counter += 1
            pool.append(chosen)
        chosen.tasks.append(Task(task.task_id, chosen.session_id, task.submit, task.duration,
                                 task_request(task.gpus)))
        chosen.last_end = task.submit + task.duration
    for pool in open_by_gpus.values():
        closed.extend(pool)
    sessions = [Session(s.session_id, s.start, min(max(s.planned_stop, s.last_end),
                                                   max(trace_end, s.last_end)),
                        task_request(s.gpus), tuple(s.tasks)) for s in closed]
    if idle_sessions and params.idle_session_fraction > 0 and sessions and trace_end > 0:
        share = min(params.idle_session_fraction, 0.95)
        wanted = int(round(len(sessions) * share / (1.0 - share)))
        gpu_values = [g for g, _ in GPU_MIX]
        probs = np.array([p for _, p in GPU_MIX]) / sum(p for _, p in GPU_MIX)
        for i in range(wanted):
            start = float(rng.uniform(0.0, trace_end))
            gpus = int(rng.choice(gpu_values, p=probs))
            stop = min(trace_end, start + life_s())
            sessions.append(Session(f"idle-{seed}-{i:06d}", start, max(stop, start),
                                    task_request(gpus), ()))
    sessions.sort(key=lambda s: (s.start, s.session_id))
    return Workload(tuple(sessions), f"{workload.source} (sessions: Sensei model, seed {seed})",
                    job_trace=False)
