"""``sjf``: shortest job first (oracle durations), non-preemptive, work-conserving."""

from __future__ import annotations

from typing import ClassVar

from notebookos.policies.base import Policy, PolicyKind, QueuedJob


class SJFPolicy(Policy):
    name: ClassVar[str] = "sjf"
    kind: ClassVar[PolicyKind] = PolicyKind.JOB
    backfill: ClassVar[bool] = True
    description: ClassVar[str] = "shortest (oracle) duration first, non-preemptive, skips blocked"

    def priority_key(self, job: QueuedJob, now: float) -> tuple:
        return (job.duration, job.submit_time, job.seq)
