"""The cell orders (notebookos/policies/cell_order.py) and the Global Scheduler's cell queue that
serves waiting cells in their order (global_scheduler/cell_queue.py)."""

from __future__ import annotations

import math

import pytest

from notebookos.global_scheduler.cell_queue import CellQueue
from notebookos.policies.cell_order import (
    ArrivalOrder,
    PredictedShortestFirst,
    UserFairness,
    WaitingCell,
    cell_order_for,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def cell(user: str, n: int, *, notebook: str = "nb", gpus: int = 1, at: float = 0.0
         ) -> WaitingCell:
    return WaitingCell(f"k-{user}-{notebook}", f"m{n}", user, notebook, gpus, at, n)


def test_unknown_order_or_bad_parameters_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown cell order 'lottery'; choose one of arrival"):
        cell_order_for("lottery")
    with pytest.raises(ValueError, match="half_life_s"):
        cell_order_for("themis", half_life_s=0)
    assert isinstance(cell_order_for("qssf"), PredictedShortestFirst)


def test_arrival_order_is_first_come_first_served() -> None:
    order = ArrivalOrder()
    cells = [cell("b", 2, at=2.0), cell("a", 1, at=1.0), cell("c", 3, at=2.0)]
    assert [c.seq for c in sorted(cells, key=lambda c: order.key(c, 5.0))] == [1, 2, 3]


def test_themis_serves_the_user_with_one_notebook_before_one_with_many() -> None:
    """User a has three notebooks and has been served all along; user b has one notebook and
    has waited as long: b's rho is larger, so b's cell goes first, whatever the arrival order."""
    order = UserFairness(half_life_s=600, capacity_gpus=1)
    a_cells = [cell("a", i, notebook=f"nb{i}") for i in range(3)]
    for c in a_cells:
        order.cell_waiting(c, 0.0)
    order.cell_started(a_cells[0], 0.0)
    b_cell = cell("b", 10, at=0.0)
    order.cell_waiting(b_cell, 0.0)
    # a's cells run back to back for 30 s: a holds the one GPU the whole time.
    order.cell_finished(a_cells[0], 10.0, 10.0)
    order.cell_started(a_cells[1], 10.0)
    order.cell_finished(a_cells[1], 10.0, 20.0)
    order.cell_started(a_cells[2], 20.0)
    order.cell_finished(a_cells[2], 10.0, 30.0)
    late_a = cell("a", 4, notebook="nb0", at=30.0)
    order.cell_waiting(late_a, 30.0)
    assert math.isinf(order.rho("b", 30.0))  # waited 30 s, never served
    assert order.key(b_cell, 30.0) < order.key(late_a, 30.0)
    # b is served for 10 s; a's rho is pending/(busy x share): 40 s x 1/2 / 30 GPU-s; b's 40
    # s x 1/2 / 10: b is still the worse off (it waited 30 s of its 40).
    order.cell_started(b_cell, 30.0)
    order.cell_finished(b_cell, 10.0, 40.0)
    b_next = cell("b", 11, at=40.0)
    order.cell_waiting(b_next, 40.0)
    assert order.rho("b", 40.0) > order.rho("a", 40.0)
    assert order.key(b_next, 40.0) < order.key(late_a, 40.0)
    assert set(order.report()["rho"]) == {"a", "b"}


def test_themis_forgets_users_once_their_history_has_decayed() -> None:
    order = UserFairness(half_life_s=1.0)
    c = cell("gone", 1)
    order.cell_waiting(c, 0.0)
    order.cell_started(c, 0.0)
    order.cell_finished(c, 1.0, 1.0)
    order.cell_left(cell("other", 2), 100.0)  # any event advances the clock
    order.cell_waiting(cell("x", 3), 100.0)
    assert "gone" not in order.report()["rho"]


def test_qssf_learns_each_notebooks_cell_durations_and_serves_the_shortest_first() -> None:
    order = PredictedShortestFirst(alpha=0.5, default_s=60)
    assert order.predict_s("u", "long.ipynb") == 60  # nothing learnt yet
    order.cell_finished(cell("u", 1, notebook="long.ipynb"), 40.0, 40.0)
    order.cell_finished(cell("u", 2, notebook="short.ipynb"), 2.0, 42.0)
    order.cell_finished(cell("u", 3, notebook="short.ipynb"), 4.0, 46.0)
    assert order.predict_s("u", "short.ipynb") == 3.0
    assert order.predict_s("u", "new.ipynb") == order._by_user["u"]  # the user's, then all
    assert order.predict_s("v", "x") == order._overall
    long_cell = cell("u", 5, notebook="long.ipynb", at=1.0)
    short_cell = cell("u", 6, notebook="short.ipynb", at=2.0)
    two_gpu_short = cell("u", 7, notebook="short.ipynb", gpus=20, at=0.5)
    ranked = sorted([long_cell, short_cell, two_gpu_short], key=lambda c: order.key(c, 50.0))
    assert ranked == [short_cell, long_cell, two_gpu_short]  # GPU-time: 3, 40, 60
    order.cell_finished(short_cell, float("nan"), 60.0)  # cut short: not learnt
    assert order.predict_s("u", "short.ipynb") == 3.0


def test_the_queue_lets_a_cell_try_only_after_every_cell_ahead_failed_since_the_release() -> None:
    clock = Clock()
    queue = CellQueue(UserFairness(), clock=clock)
    a = queue.join("k1", "m1", user="a", notebook="n", gpus=1)
    clock.now = 1.0
    b = queue.join("k2", "m2", user="b", notebook="n", gpus=1)
    # Neither user was served: equal rho (inf); arrival breaks the tie: a first.
    assert queue.may_try(a, releases=0) and not queue.may_try(b, releases=0)
    assert queue.position(b) == 1 and queue.explain(b).startswith("1 cell(s) ahead")
    queue.tried(a, 0, placed=False)
    assert queue.may_try(b, releases=0)  # a tried since release 0 and could not go
    assert not queue.may_try(b, releases=1)  # a new release: a's turn again
    queue.tried(a, 1, placed=True)  # a got the GPU
    assert queue.may_try(b, releases=1) and queue.waiting() == 1
    clock.now = 5.0
    queue.finished("k1", "m1")
    queue.leave(b)
    assert queue.waiting() == 0
    assert queue.order.rho("a", 5.0) > 0


def test_the_queue_reports_durations_to_the_order_and_forgets_stopped_kernels() -> None:
    clock = Clock()
    queue = CellQueue(PredictedShortestFirst(alpha=1.0), clock=clock)
    c = queue.join("k1", "m1", user="u", notebook="n", gpus=1)
    queue.tried(c, 0, placed=True)
    clock.now = 7.0
    queue.finished("k1", "m1")
    queue.finished("k1", "m1")  # a second release of the same cell changes nothing
    assert queue.order.predict_s("u", "n") == 7.0
    d = queue.join("k1", "m2", user="u", notebook="n", gpus=1)
    queue.tried(d, 0, placed=True)
    queue.kernel_gone("k1")
    assert queue.order.predict_s("u", "n") == 7.0 and queue.order.learned == 1


def test_the_queue_estimates_a_waiting_cells_wait_from_recent_cells() -> None:
    """Issue 34: a cell waiting for GPUs is told its place in the queue and about how long it
    will wait, from how long the latest cells held their GPUs."""
    clock = Clock()
    queue = CellQueue(UserFairness(), clock=clock)
    first = queue.join("k0", "m0", user="c", notebook="n", gpus=1)  # never served, earlier
    assert queue.estimate_wait_s(first) is None and "to wait" not in queue.explain(first)
    for n, length in enumerate((10.0, 30.0, 20.0)):  # three cells ran: median 20 s
        running = queue.join(f"k{n}", f"r{n}", user="a", notebook="n", gpus=1)
        queue.tried(running, 0, placed=True)
        clock.now += length
        queue.finished(f"k{n}", f"r{n}")
    holder = queue.join("k9", "held", user="z", notebook="n", gpus=1)
    queue.tried(holder, 0, placed=True)  # one cell holds the GPUs now
    clock.now += 1.0
    second = queue.join("k5", "m5", user="b", notebook="n", gpus=1)
    # the holder has 19 s of a median cell left, then first (ahead) holds them 20 s
    assert queue.estimate_wait_s(second) == pytest.approx(39.0)
    text = queue.explain(second)
    assert text.startswith("1 cell(s) ahead of it in the queue, about 39 s to wait (the latest "
                           "3 cell(s) held their GPUs 20 s at the median)"), text
    # a holder that has run longer than the median is expected to run as long again: behind
    # a 60 s holder after 20 s cells, "about 0 s" (the estimate before) misled the user
    clock.now += 59.0
    assert queue.estimate_wait_s(first) == pytest.approx(60.0)
    assert queue.estimate_wait_s(second) == pytest.approx(80.0)
