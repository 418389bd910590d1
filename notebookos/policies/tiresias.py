"""``tiresias``: 2D least-attained-service with discretized priority queues (Tiresias, NSDI'19).

A job's *attained service* is GPUs x seconds run so far. Queue k holds jobs whose attained
service lies in [T_(k-1), T_k) for thresholds T_0 < T_1 < ...; a lower queue always goes first,
and inside a queue jobs run in arrival order (FIFO), which keeps the number of preemptions low.
A running job is demoted the moment it crosses a threshold, which can preempt it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import ClassVar

from notebookos.policies.base import Policy, PolicyKind, QueuedJob

DEFAULT_THRESHOLDS_GPU_S: tuple[float, ...] = (18000.0,)  # two queues, as in notes/thesis_002


class TiresiasPolicy(Policy):
    name: ClassVar[str] = "tiresias"
    kind: ClassVar[PolicyKind] = PolicyKind.JOB
    preemptive: ClassVar[bool] = True
    backfill: ClassVar[bool] = True
    description: ClassVar[str] = "2D-LAS: discretized attained-GPU-service queues, FIFO inside"

    def __init__(self, *, thresholds: Sequence[float] = DEFAULT_THRESHOLDS_GPU_S, **kwargs) -> None:
        super().__init__(**kwargs)
        values = [float(t) for t in thresholds]
        if any(t <= 0 for t in values) or values != sorted(set(values)):
            raise ValueError(
                f"thresholds={list(thresholds)!r} must be positive and strictly increasing "
                "(GPU-seconds of attained service)"
            )
        self.thresholds = tuple(values)

    def queue_index(self, job: QueuedJob) -> int:
        return bisect.bisect_right(self.thresholds, job.attained_gpu_s + 1e-9)

    def priority_key(self, job: QueuedJob, now: float) -> tuple:
        return (self.queue_index(job), job.submit_time, job.seq)

    def next_priority_change(self, job: QueuedJob, now: float) -> float | None:
        k = self.queue_index(job)
        if k >= len(self.thresholds) or job.num_gpus <= 0:
            return None
        return now + (self.thresholds[k] - job.attained_gpu_s) / job.num_gpus
