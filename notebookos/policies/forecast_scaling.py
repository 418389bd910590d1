"""Forecast-driven scaling for the live autoscaler: Helios's Cluster Energy Saving (``ces``, seed
002) on the hosts of a NotebookOS cluster (``global_scheduler.scaling = ces``).

Every ``check_interval_s`` the autoscaler reports how many hosts run something (a GPU bound) and
how many are awake. Hosts are put to sleep (released to the host provider: a static pool keeps
them in reserve, a cloud provider gives them back) when both the recent trend and the demand
forecast fall: the same ``CESPolicy.hosts_to_sleep`` the simulator runs. A cell that waits for
GPUs the awake hosts cannot bind wakes the hosts it lacks plus ``wake_buffer``
(``hosts_to_wake``). The forecast learns from the history of checks, which the caller keeps across
restarts (``history`` / ``restore``): until it holds a day of checks (``day_s``) nothing sleeps.

Pure (DESIGN section 2): the caller passes the time and the counts, and applies the decision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from notebookos.policies.base import ScalingDecision, ScalingView
from notebookos.policies.ces import CESPolicy
from notebookos.policies.estimators import DAY_S

MAX_HISTORY_DAYS = 15  # the forecast fits on two weeks; a day more for its lags


class ForecastScaling:
    def __init__(self, *, check_interval_s: float = 600.0, day_s: float = DAY_S,
                 wake_buffer: int = 1, min_hosts: int = 1, seed: int = 0) -> None:
        if check_interval_s <= 0 or day_s < check_interval_s:
            raise ValueError("need check_interval_s > 0 and day_s >= check_interval_s")
        # Helios's windows, in fractions of the day: the trend over the last hour, the forecast
        # over the next three, no sleep within two hours of a wake.
        hour = day_s / 24.0
        self.ces = CESPolicy(check_interval_s=check_interval_s, day_s=day_s,
                             history_bins=max(1, round(hour / check_interval_s)),
                             future_bins=max(1, round(3 * hour / check_interval_s)),
                             wake_buffer=wake_buffer, wake_s=0.0, keep_awake_s=2 * hour,
                             seed=seed)
        self.check_interval_s = float(check_interval_s)
        self.min_hosts = int(min_hosts)
        self.max_history = max(1, round(MAX_HISTORY_DAYS * day_s / check_interval_s))
        self._history: list[float] = []
        self._next_check = -math.inf
        self.slept = 0
        self.woken = 0

    @property
    def history(self) -> list[float]:
        """Running hosts at each check, oldest first (what the caller persists)."""
        return list(self._history)

    def restore(self, history: Sequence[float]) -> None:
        """The history of an earlier run (a Global Scheduler restart)."""
        self._history = [float(v) for v in history][-self.max_history:]

    def observe(self, now: float, running_hosts: int) -> bool:
        """Sample the running hosts when a check is due; True when one was taken."""
        if now < self._next_check:
            return False
        self._next_check = now + self.check_interval_s
        self._history.append(float(running_hosts))
        del self._history[:-self.max_history]
        return True

    def decide(self, view: ScalingView, now: float, *, asleep: int,
               checked: bool) -> ScalingDecision:
        """Wake what waiting cells lack; at a check, put the forecast's surplus to sleep."""
        gph = max(1, view.gpus_per_host)
        short = math.ceil(view.waiting_gpus / gph) + view.waiting_hosts
        if short > 0:
            wake = self.ces.hosts_to_wake(now, short, asleep)
            if wake:
                self.woken += wake
                return ScalingDecision(add_hosts=wake)
        if not checked:
            return ScalingDecision()
        surplus = self.ces.hosts_to_sleep(now, self._history, view.hosts)
        surplus = min(surplus, max(0, view.hosts - self.min_hosts))
        release = tuple(view.releasable_host_ids[:surplus])
        self.slept += len(release)
        return ScalingDecision(release_host_ids=release)

    def report(self) -> dict[str, Any]:
        return {"checks": len(self._history), "forecast_fits": self.ces.forecast.fits,
                "slept": self.slept, "woken": self.woken, **self.ces.last_decision}
