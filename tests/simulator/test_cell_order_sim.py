"""The simulator serves waiting cells in the live Global Scheduler's cell order (the same
``notebookos.policies.cell_order`` code): alice's four notebooks and bob's one, 1 s cells back to
back on three 1-GPU hosts. In arrival order both users wait about the same per cell; by fairness
(themis) bob waits much less. benchmarks/cell_order.py puts these beside the live cluster's."""

from __future__ import annotations

import statistics

import pytest

from notebookos.simulator.config import SimConfig
from notebookos.simulator.records import cell_waits
from notebookos.simulator.runner import simulate
from notebookos.workload.generator import back_to_back

NOTEBOOKS = [("alice-1", "alice"), ("alice-2", "alice"), ("alice-3", "alice"),
             ("alice-4", "alice"), ("bob", "bob")]


def mean_wait_per_user(order: str, cells: int = 12) -> dict[str, float]:
    config = SimConfig(hosts=3, gpus_per_host=1, autoscale=False, max_hosts=3, cell_order=order,
                       policy_params={"notebookos": {"max_subscription_ratio": 7}})
    _, record = simulate(back_to_back(NOTEBOOKS, cells, 1.0), "notebookos", config)
    assert all(t.end is not None for t in record.tasks)
    waits: dict[str, list[float]] = {}
    for name, session_waits in cell_waits(record).items():
        waits.setdefault(dict(NOTEBOOKS)[name], []).extend(session_waits)
    return {user: statistics.fmean(w) for user, w in waits.items()}


def test_fairness_between_users_in_the_simulator_as_live() -> None:
    arrival = mean_wait_per_user("arrival")
    themis = mean_wait_per_user("themis")
    assert abs(arrival["bob"] - arrival["alice"]) < 0.25 * arrival["alice"], arrival
    assert themis["bob"] < 0.75 * themis["alice"], themis
    assert themis["bob"] < 0.75 * arrival["bob"], (arrival, themis)


def test_an_unknown_cell_order_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="cell_order 'lottery' must be one of arrival, themis"):
        SimConfig(cell_order="lottery")
