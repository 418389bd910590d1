"""``qssf``: Helios's Quasi-Shortest-Service-First (seed 002, ch. 2, Algorithm 1).

Priority = GPUs x predicted duration (expected GPU time, so a large short job does not jump a
crowd of small ones), computed once when the job is submitted; the queue is served strictly in
that order with no backfill (head-of-line blocking, as in Helios) and no preemption. Helios places
jobs on as few nodes as possible: run it with ``--placement consolidated`` for that.

The prediction blends a rolling history estimate P_R (``estimators.RollingEstimate``) with a
gradient-boosted model P_M (``estimators.DurationModel``), refitted on completed jobs once a
simulated day: ``lambda_ x P_R + (1 - lambda_) x P_M`` (lambda = 0.1 in the authors' artifact).
Before the model's first fit only P_R is used; with no history at all a job gets
``default_duration_s``. ``estimator="oracle"`` uses the true duration instead (the ceiling of
the method, for validation: it is then SJF by GPU time without backfill).
"""

from __future__ import annotations

from typing import ClassVar

from notebookos.policies.base import Policy, PolicyKind, QueuedJob
from notebookos.policies.estimators import DAY_S, DurationModel, RollingEstimate

ESTIMATORS = ("blend", "oracle", "rolling", "model")


class QSSFPolicy(Policy):
    name: ClassVar[str] = "qssf"
    kind: ClassVar[PolicyKind] = PolicyKind.JOB
    backfill: ClassVar[bool] = False  # strict head-of-line, as Helios
    description: ClassVar[str] = "Helios QSSF: GPUs x predicted duration, strict order, no backfill"

    def __init__(self, *, estimator: str = "blend", lambda_: float = 0.1,
                 refit_every_s: float = DAY_S, default_duration_s: float = 3600.0,
                 seed: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator={estimator!r} must be one of {', '.join(ESTIMATORS)}")
        if not 0.0 <= lambda_ <= 1.0:
            raise ValueError(f"lambda_={lambda_!r} must be in [0, 1]")
        if refit_every_s <= 0 or default_duration_s <= 0:
            raise ValueError("refit_every_s and default_duration_s must be > 0")
        self.estimator = estimator
        self.lambda_ = float(lambda_)
        self.default_duration_s = float(default_duration_s)
        self.rolling = RollingEstimate()
        self.model = DurationModel(refit_every_s=refit_every_s, seed=seed)
        self._estimates: dict[int, float] = {}  # job seq -> estimate made at submission

    def estimate(self, job: QueuedJob, now: float) -> float:
        """Predicted duration (s) of ``job`` as known at ``now``."""
        if self.estimator == "oracle":
            return job.duration
        rolling, _tier = self.rolling.estimate(job)
        model = self.model.predict(job, now) if self.estimator != "rolling" else None
        if self.estimator == "model" and model is not None:
            return model
        if rolling is None and model is None:
            return self.default_duration_s
        if model is None:
            return rolling
        if rolling is None:
            return model
        return self.lambda_ * rolling + (1.0 - self.lambda_) * model

    def priority_key(self, job: QueuedJob, now: float) -> tuple:
        estimate = self._estimates.get(job.seq)
        if estimate is None:
            estimate = self._estimates[job.seq] = self.estimate(job, now)
        return (job.num_gpus * estimate, job.submit_time, job.seq)

    def job_finished(self, job: QueuedJob, now: float) -> None:
        """Update engine: the completed job joins the history the estimates learn from."""
        self._estimates.pop(job.seq, None)
        if self.estimator != "oracle":
            self.rolling.add(job)
            self.model.add(job)
