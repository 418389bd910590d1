"""``fifo``: strict first-in first-out, no backfill, no preemption."""

from __future__ import annotations

from typing import ClassVar

from notebookos.policies.base import Policy, PolicyKind, QueuedJob


class FIFOPolicy(Policy):
    name: ClassVar[str] = "fifo"
    kind: ClassVar[PolicyKind] = PolicyKind.JOB
    backfill: ClassVar[bool] = False
    description: ClassVar[str] = "strict FIFO: the head of the queue blocks everyone behind it"

    def priority_key(self, job: QueuedJob, now: float) -> tuple:
        return (job.submit_time, job.seq)
