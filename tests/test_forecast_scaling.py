"""Forecast-driven scaling (Helios CES) for the live autoscaler, on a compressed day (24 s; a check
every 0.5 s, so an "hour" is 1 s): demand is 4 running hosts from 8 to 17 h, ramps down to none
by 19 h and stays there at night. After three such days the forecast knows the evening: at 17.5 h
of the fourth day, with running hosts falling, the surplus goes to sleep; waiting cells wake
hosts; and nothing sleeps before a day of history."""

from __future__ import annotations

import pytest

from notebookos.policies.base import ScalingView
from notebookos.policies.forecast_scaling import ForecastScaling

CHECK_S = 0.5
DAY_S = 24.0


def demand(hour: float) -> float:
    if 8 <= hour < 17:
        return 4
    if 17 <= hour < 19:
        return max(0.0, 4 - 2 * (hour - 17))  # 4 -> 0 over two hours
    return 0


def run_days(scaling: ForecastScaling, days: float, awake: int = 6) -> list:
    decisions = []
    steps = round(days * DAY_S / CHECK_S)
    for i in range(steps):
        now = i * CHECK_S
        hour = (now % DAY_S) / DAY_S * 24
        running = round(demand(hour))
        checked = scaling.observe(now, running)
        view = ScalingView(hosts=awake, gpus_per_host=2, committed_gpus=2 * running,
                           waiting_gpus=0, subscribed_gpus=0,
                           releasable_host_ids=[f"h{j}" for j in range(running, awake)])
        decision = scaling.decide(view, now, asleep=10 - awake, checked=checked)
        decisions.append((hour, running, decision))
    return decisions


def test_the_surplus_sleeps_when_the_forecast_falls_and_never_before_a_day() -> None:
    scaling = ForecastScaling(check_interval_s=CHECK_S, day_s=DAY_S, wake_buffer=1, min_hosts=1)
    first_day = run_days(scaling, 1.0)
    assert not any(d.release_host_ids for _, _, d in first_day)  # no forecast yet
    rest = run_days(scaling, 3.0)
    slept = [(round(h, 1), r, d.release_host_ids) for h, r, d in rest if d.release_host_ids]
    assert slept, scaling.report()
    for hour, running, released in slept:
        assert 17 <= hour % 24 < 20, slept  # in the evening, as demand falls
        assert len(released) <= 6 - (running + 1)  # keeps the running hosts plus the buffer
    assert scaling.report()["forecast_fits"] >= 1


def test_waiting_cells_wake_what_they_lack_plus_the_buffer() -> None:
    scaling = ForecastScaling(check_interval_s=CHECK_S, day_s=DAY_S, wake_buffer=1)
    view = ScalingView(hosts=2, gpus_per_host=2, committed_gpus=4, waiting_gpus=3,
                       subscribed_gpus=0)
    assert scaling.decide(view, 5.0, asleep=5, checked=False).add_hosts == 2 + 1
    assert scaling.decide(view, 6.0, asleep=1, checked=False).add_hosts == 1  # all there is


def test_the_history_survives_a_restart_and_is_bounded() -> None:
    scaling = ForecastScaling(check_interval_s=CHECK_S, day_s=DAY_S)
    run_days(scaling, 1.0)
    again = ForecastScaling(check_interval_s=CHECK_S, day_s=DAY_S)
    again.restore(scaling.history)
    assert again.history == scaling.history
    again.restore([1.0] * 10 * again.max_history)
    assert len(again.history) == again.max_history


def test_bad_parameters_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="day_s >= check_interval_s"):
        ForecastScaling(check_interval_s=10, day_s=5)
