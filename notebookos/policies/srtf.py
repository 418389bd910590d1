"""``srtf``: shortest remaining time first (oracle durations), preemptive."""

from __future__ import annotations

from typing import ClassVar

from notebookos.policies.base import Policy, PolicyKind, QueuedJob


class SRTFPolicy(Policy):
    name: ClassVar[str] = "srtf"
    kind: ClassVar[PolicyKind] = PolicyKind.JOB
    preemptive: ClassVar[bool] = True
    backfill: ClassVar[bool] = True
    description: ClassVar[str] = "shortest remaining (oracle) time first, preemptive"

    def priority_key(self, job: QueuedJob, now: float) -> tuple:
        return (job.remaining, job.submit_time, job.seq)
