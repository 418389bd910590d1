"""``ces``: Helios's Cluster Energy Saving (seed 002, ch. 2, Algorithm 2) over any job policy.

Hosts are put to sleep when both the recent and the forecast demand fall, and woken when jobs
arrive that the awake hosts cannot hold:

- every ``check_interval_s`` (10 min) the engine reports the number of *running* hosts (at least
  one GPU bound) and of awake hosts. T_H = the drop in running hosts over the last
  ``history_bins`` checks (1 h); T_P = running hosts now - the forecast mean over the next
  ``future_bins`` checks (3 h). When T_H >= ``his_threshold`` and T_P >= ``fut_threshold``, every
  awake host beyond running + ``wake_buffer`` goes to sleep, if that is at least
  ``de_threshold`` hosts and no host was woken in the last ``keep_awake_s`` (2 h);
- a job that arrives when the awake hosts' free GPUs cannot hold the waiting demand wakes the
  hosts it needs plus ``wake_buffer``; they are usable ``wake_s`` later (a 5-minute reboot).

The forecast is a gradient-boosted model of the mean running hosts over the next 3 h from the
time of day, the day of the week, the recent samples, their rolling means and the value a day
earlier (the features of the authors' artifact, without holiday and deadline flags), refitted
once a simulated day (when a decision needs it) on the last two weeks of history. Until the first fit (a day of history) nothing
sleeps. Queue order, preemption and backfill are the ``base`` policy's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from notebookos.policies.base import Policy, PolicyKind, QueuedJob
from notebookos.policies.estimators import DAY_S, single_thread


class NodeForecast:
    """Mean running hosts over the next ``future_bins`` checks, from the history of checks."""

    LAGS = (1, 2, 3, 6)
    window_days = 14  # fit on the last two weeks of checks

    def __init__(self, interval_s: float, future_bins: int, seed: int = 0,
                 day_s: float = DAY_S) -> None:
        self.interval_s = interval_s
        self.future_bins = future_bins
        self.day_s = float(day_s)  # the demand's period (a day; shorter in compressed replays)
        self.day_bins = max(1, round(self.day_s / interval_s))
        self.seed = seed
        self._model = None
        self._fitted_at = -math.inf
        self.fits = 0

    def _features(self, history: Sequence[float], i: int) -> list[float]:
        t = i * self.interval_s
        now = history[i]
        lags = [history[max(0, i - k)] for k in self.LAGS]
        window = history[max(0, i - 5): i + 1]
        day_ago = history[i - self.day_bins] if i >= self.day_bins else now
        return [(t % self.day_s) / self.day_s * 24.0, (t // self.day_s) % 7, now, *lags,
                sum(window) / len(window), day_ago]

    def maybe_fit(self, history: Sequence[float], now: float) -> None:
        n = len(history) - self.future_bins
        if now - self._fitted_at < self.day_s or n < self.day_bins:
            return
        from sklearn.ensemble import HistGradientBoostingRegressor

        first = max(0, n - self.window_days * self.day_bins)  # a trailing window of history
        rows = [self._features(history, i) for i in range(first, n)]
        targets = [sum(history[i + 1: i + 1 + self.future_bins]) / self.future_bins
                   for i in range(first, n)]
        model = HistGradientBoostingRegressor(max_iter=40, max_leaf_nodes=15,
                                              early_stopping=False, random_state=self.seed)
        with single_thread():
            model.fit(np.asarray(rows), np.asarray(targets))
        self._model = model
        self._fitted_at = now
        self.fits += 1

    def predict(self, history: Sequence[float]) -> float | None:
        if self._model is None or not history:
            return None
        with single_thread():
            value = self._model.predict(np.asarray([self._features(history, len(history) - 1)]))
        return float(value[0])


class CESPolicy(Policy):
    name: ClassVar[str] = "ces"
    kind: ClassVar[PolicyKind] = PolicyKind.JOB
    description: ClassVar[str] = "Helios CES: predictive host sleep over a base job policy"
    sleeps_hosts: ClassVar[bool] = True

    def __init__(self, *, base: str = "fifo", base_params: dict[str, Any] | None = None,
                 check_interval_s: float = 600.0, history_bins: int = 6, future_bins: int = 18,
                 his_threshold: float = 1.0, fut_threshold: float = 1.0, de_threshold: int = 1,
                 wake_buffer: int = 2, wake_s: float = 300.0, keep_awake_s: float = 7200.0,
                 day_s: float = DAY_S, seed: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        from notebookos.policies.registry import get_policy

        if base == self.name:
            raise ValueError("ces cannot use itself as its base policy")
        self.base = get_policy(base, **(base_params or {}))
        if self.base.kind is not PolicyKind.JOB:
            raise ValueError(f"ces needs a job policy as its base, not {base!r} "
                             f"({self.base.kind} policy)")
        if getattr(self.base, "ftf_solver", None):
            raise ValueError(f"ces cannot wrap {base!r}: it runs in its own engine "
                             "(notebookos/simulator/job_ftf.py), which does not sleep hosts")
        if check_interval_s <= 0 or wake_s < 0 or keep_awake_s < 0:
            raise ValueError("check_interval_s must be > 0, wake_s and keep_awake_s >= 0")
        if history_bins < 1 or future_bins < 1 or wake_buffer < 0 or de_threshold < 1:
            raise ValueError("history_bins, future_bins, de_threshold must be >= 1 and "
                             "wake_buffer >= 0")
        self.base_name = base
        self.preemptive = self.base.preemptive
        self.backfill = self.base.backfill
        self.check_interval_s = float(check_interval_s)
        self.history_bins = int(history_bins)
        self.his_threshold = float(his_threshold)
        self.fut_threshold = float(fut_threshold)
        self.de_threshold = int(de_threshold)
        self.wake_buffer = int(wake_buffer)
        self.wake_s = float(wake_s)
        self.keep_awake_s = float(keep_awake_s)
        if day_s < check_interval_s:
            raise ValueError("day_s (the demand's period) must be at least check_interval_s")
        self.forecast = NodeForecast(self.check_interval_s, int(future_bins), seed, day_s)
        self.last_wake = -math.inf
        self.last_decision: dict[str, float] = {}

    # -- queue order: the base policy's ------------------------------------------------------

    def priority_key(self, job: QueuedJob, now: float) -> tuple:
        return self.base.priority_key(job, now)

    def next_priority_change(self, job: QueuedJob, now: float) -> float | None:
        return self.base.next_priority_change(job, now)

    def job_finished(self, job: QueuedJob, now: float) -> None:
        hook = getattr(self.base, "job_finished", None)
        if hook is not None:
            hook(job, now)

    # -- energy ------------------------------------------------------------------------------

    def hosts_to_sleep(self, now: float, running_history: Sequence[float], awake: int) -> int:
        """DynamicResourceSleep: how many awake hosts to put to sleep now (0: none)."""
        if now - self.last_wake < self.keep_awake_s or len(running_history) <= self.history_bins:
            return 0
        running = running_history[-1]
        trend_history = running_history[-1 - self.history_bins] - running
        if trend_history < self.his_threshold:
            return 0  # the recent trend alone says no: no forecast needed
        self.forecast.maybe_fit(running_history, now)
        predicted = self.forecast.predict(running_history)
        if predicted is None:
            return 0
        trend_future = running - predicted
        self.last_decision = {"t_h": trend_history, "t_p": trend_future, "forecast": predicted}
        if trend_history < self.his_threshold or trend_future < self.fut_threshold:
            return 0
        keep = math.ceil(running) + self.wake_buffer
        surplus = awake - keep
        return surplus if surplus >= self.de_threshold else 0

    def hosts_to_wake(self, now: float, short_hosts: int, asleep: int) -> int:
        """JobArrivalCheck: wake what the waiting jobs lack, plus the buffer."""
        if short_hosts <= 0 or asleep <= 0:
            return 0
        self.last_wake = now
        return min(asleep, short_hosts + self.wake_buffer)
