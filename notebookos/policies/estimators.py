"""Duration estimators behind the predicted-size policies (QSSF, Lucid): pure, deterministic.

- ``RollingEstimate``: Helios's history fallback chain (thesis sec. 2.4.2): the mean duration of
  the submitter's earlier jobs of the same name; else of the submitter's jobs with the same GPU
  count; else of everyone's jobs with the same GPU count; else of every job. A "submitter" is the
  trace's ``user`` where it has one; the shared traces have none, so the job's name stands in.
- ``DurationModel``: a gradient-boosted model of log duration (scikit-learn's
  HistGradientBoostingRegressor, the maintained counterpart of the LightGBM model Helios uses),
  refitted on the completed jobs once per ``refit_every_s`` of simulated time (Helios's Model
  Update Engine). ``additive=True`` forbids feature interactions, which makes it a GA2M-style
  additive model whose per-feature shape functions explain each estimate (Lucid's interpretable
  Workload Estimate Model and Primo's PrAM, seed 002 ch. 4-5); ``monotone_gpus`` makes the
  estimate non-decreasing in the GPU count (Lucid's System Tuner).

Both see only what a scheduler knows when a job is submitted: GPUs, name, submitter, submit time
(hour of day, day of week), and for Lucid the metrics of its profiling run.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from notebookos.policies.base import QueuedJob

DAY_S = 86400.0


def single_thread():  # noqa: ANN201 - a context manager
    """Run a scikit-learn call on one OpenMP thread: deterministic, and on a small shared machine
    about 70x faster than letting OpenMP spin up a team for a few thousand rows (measured)."""
    global _CONTROLLER
    if _CONTROLLER is None:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()  # finding the libraries once is the slow part
    return _CONTROLLER.limit(limits=1)


_CONTROLLER = None


class RollingEstimate:
    """Means of completed jobs' durations, by (submitter, name), (submitter, GPUs), GPUs, all."""

    def __init__(self) -> None:
        self._sums: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0])

    @staticmethod
    def _keys(job: QueuedJob) -> tuple[tuple, ...]:
        who = job.user or job.name
        return (("name", who, job.name), ("user", who, job.num_gpus), ("gpus", job.num_gpus),
                ("all",))

    def add(self, job: QueuedJob) -> None:
        for key in self._keys(job):
            entry = self._sums[key]
            entry[0] += job.duration
            entry[1] += 1

    def estimate(self, job: QueuedJob) -> tuple[float | None, str]:
        """The estimate and the tier it came from (for explanations); None when nothing is known."""
        for key in self._keys(job):
            entry = self._sums.get(key)
            if entry and entry[1]:
                return entry[0] / entry[1], key[0]
        return None, "none"


class DurationModel:
    """A gradient-boosted model of log(duration) from submit-time features, refitted periodically."""

    def __init__(self, *, refit_every_s: float = DAY_S, min_samples: int = 50,
                 additive: bool = False, monotone_gpus: bool = False, max_iter: int = 60,
                 seed: int = 0) -> None:
        self.refit_every_s = float(refit_every_s)
        self.min_samples = int(min_samples)
        self.additive = additive
        self.monotone_gpus = monotone_gpus
        self.max_iter = int(max_iter)
        self.seed = int(seed)
        self._names: dict[str, int] = {}
        self._rows: list[list[float]] = []
        self._targets: list[float] = []
        self._model = None
        self._next_fit = 0.0
        self._cache: dict[tuple, float] = {}
        self.fits = 0

    def _code(self, text: str) -> int:
        return self._names.setdefault(text, len(self._names))

    def features(self, job: QueuedJob, extra: Sequence[float] = ()) -> tuple[float, ...]:
        hour = (job.submit_time % DAY_S) / 3600.0
        dow = (job.submit_time // DAY_S) % 7
        return (float(job.num_gpus), float(self._code(job.name)),
                float(self._code("u:" + (job.user or job.name))), math.floor(hour), dow, *extra)

    def add(self, job: QueuedJob, extra: Sequence[float] = ()) -> None:
        self._rows.append(list(self.features(job, extra)))
        self._targets.append(math.log(max(1.0, job.duration)))

    def _maybe_fit(self, now: float) -> None:
        if now < self._next_fit or len(self._rows) < self.min_samples:
            return
        from sklearn.ensemble import HistGradientBoostingRegressor

        width = len(self._rows[0])
        params: dict = {"max_iter": self.max_iter, "learning_rate": 0.1, "max_leaf_nodes": 15,
                        "early_stopping": False, "random_state": self.seed,
                        "categorical_features": [1, 2]}
        if self.additive:
            params["interaction_cst"] = "no_interactions"
        if self.monotone_gpus:
            params["monotonic_cst"] = [1] + [0] * (width - 1)
        model = HistGradientBoostingRegressor(**params)
        # Category codes beyond the estimator's limit are folded (255 categories at most).
        rows = [[r[0], r[1] % 250, r[2] % 250, *r[3:]] for r in self._rows]
        with single_thread():
            model.fit(np.asarray(rows, dtype=float), np.asarray(self._targets))
        self._model = model
        self._cache.clear()
        self._next_fit = now + self.refit_every_s
        self.fits += 1
        # One batch prediction for every (GPUs, name, submitter) seen x hour x day of week: a
        # call per job would cost more than the whole simulation.
        if width == 5:
            seen = sorted({(r[0], r[1], r[2]) for r in rows})
            if len(seen) * 168 <= 50_000:
                grid = [[g, n, u, h, d] for g, n, u in seen for h in range(24) for d in range(7)]
                with single_thread():
                    values = model.predict(np.asarray(grid, dtype=float))
                for row, value in zip(grid, values, strict=True):
                    self._cache[tuple(float(x) for x in row)] = math.exp(float(value))

    def predict(self, job: QueuedJob, now: float, extra: Sequence[float] = ()) -> float | None:
        """Predicted duration in seconds, or None before the first fit."""
        self._maybe_fit(now)
        if self._model is None:
            return None
        feats = self.features(job, extra)
        key = (feats[0], float(feats[1] % 250), float(feats[2] % 250), *feats[3:])
        value = self._cache.get(key)
        if value is None:
            with single_thread():
                value = math.exp(float(self._model.predict(np.asarray([key], dtype=float))[0]))
            self._cache[key] = value
        return value
