"""A placement waiting for GPUs or for its turn in the cell queue sleeps until something that
could let it go on happens (a try of a cell ahead, a release, a host, a withdrawal, a stop) or
its deadline: an idle waiter costs no wake-up (issue 32; it used to look every 0.25 s).

The waits are the service's own (``ExecutionMixin``), on a stand-in holding just the state they
use, with a condition variable that counts how often a waiter wakes.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from notebookos.cluster import Cluster, Host
from notebookos.global_scheduler.cell_containers import CellContainerMixin
from notebookos.global_scheduler.cell_queue import ORDER_RECHECK_S, CellQueue
from notebookos.global_scheduler.execution import ExecutionMixin, _Pass
from notebookos.global_scheduler.front import PlacementFailed
from notebookos.global_scheduler.hibernation import HibernationMixin
from notebookos.global_scheduler.kernels import KernelEntry
from notebookos.global_scheduler.loop_waits import SignallingCondition
from notebookos.global_scheduler.state_lock import StateLock
from notebookos.policies import get_policy
from notebookos.policies.cell_order import ArrivalOrder, CellOrder, UserFairness
from notebookos.resources import ResourceSpec

IDLE_S = 1.5


class _Waits(ExecutionMixin):
    """The state the placement waits use, nothing else; the conditions are the service's
    kind (their notifications wake the coroutines), and ``wakeups`` counts the waits."""

    def __init__(self, order: CellOrder) -> None:
        self._placement_cv = SignallingCondition()
        # on the placement condition's lock, as in the service (a stop notifies it too)
        self._kernels_changed = SignallingCondition(self._placement_cv._lock)
        self._cell_cv = SignallingCondition()
        self._gpu_releases = 0
        self._withdrawn_cells: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self.cell_queue = CellQueue(order)

    @property
    def wakeups(self) -> int:
        return self._placement_cv.signal.waits + self._kernels_changed.signal.waits


def _join(w: _Waits, kernel_id: str) -> object:
    with w._placement_cv:
        return w.cell_queue.join(kernel_id, "m", user=kernel_id, notebook="", gpus=1)


def test_a_cell_waiting_for_its_turn_wakes_only_at_its_deadline() -> None:
    w = _Waits(ArrivalOrder())
    _join(w, "ahead")  # never tries: the cell behind it waits its whole deadline
    behind = _join(w, "behind")
    started = time.monotonic()
    asyncio.run(w._wait_turn("behind", "m", behind, started + IDLE_S))
    took = time.monotonic() - started
    assert IDLE_S - 0.05 <= took < IDLE_S + 1.5
    # polling every 0.25 s woke it 6 times; now once, at its deadline
    assert w.wakeups <= 2, w.wakeups


def test_a_try_of_the_cell_ahead_gives_the_next_one_its_turn_at_once() -> None:
    w = _Waits(ArrivalOrder())
    ahead = _join(w, "ahead")
    behind = _join(w, "behind")
    done = threading.Event()
    thread = threading.Thread(target=lambda: (asyncio.run(w._wait_turn(
        "behind", "m", behind, time.monotonic() + 30)), done.set()))
    thread.start()
    time.sleep(0.3)
    assert not done.is_set()
    with w._placement_cv:
        w.cell_queue.tried(ahead, 0, placed=False)
        w._placement_cv.notify_all()
    assert done.wait(1.0)
    thread.join()
    assert w.wakeups <= 2


def test_a_cell_waiting_for_gpus_sleeps_until_a_release_or_a_host() -> None:
    w = _Waits(ArrivalOrder())
    started = time.monotonic()
    asyncio.run(w._placement_pause("k", "m", IDLE_S, releases=0))
    assert time.monotonic() - started >= IDLE_S - 0.05
    assert w.wakeups <= 2, w.wakeups

    w._placement_cv.signal.waits = 0
    timer = threading.Timer(0.2, w._capacity_added)  # a host joined
    timer.start()
    started = time.monotonic()
    asyncio.run(w._placement_pause("k", "m", 30, releases=w._gpu_releases))
    assert time.monotonic() - started < 2
    timer.join()


def test_a_waiting_cell_sees_a_withdrawal_and_a_stop_at_once() -> None:
    w = _Waits(ArrivalOrder())
    threading.Timer(0.2, w.cancel_execute, args=("k", "m")).start()
    started = time.monotonic()
    with pytest.raises(PlacementFailed):
        asyncio.run(w._placement_pause("k", "m", 30, releases=0))
    assert time.monotonic() - started < 2

    w2 = _Waits(ArrivalOrder())
    _join(w2, "ahead")
    behind = _join(w2, "behind")

    def stop() -> None:
        w2._stop.set()
        w2._wake_waiting_placements()

    threading.Timer(0.2, stop).start()
    started = time.monotonic()
    with pytest.raises(PlacementFailed):
        asyncio.run(w2._wait_turn("behind", "m", behind, time.monotonic() + 30))
    assert time.monotonic() - started < 2


def test_a_withdrawn_cell_stops_waiting_for_its_turn_and_the_turns_go_on() -> None:
    """An interrupt ends the wait of the cell it withdraws, at once, and no other's; the cells
    behind it still wait for every cell ahead, the withdrawn one too until it leaves."""
    from notebookos.loop_thread import LoopThread

    w = _Waits(ArrivalOrder())
    ahead, middle, behind = (_join(w, k) for k in ("ahead", "middle", "behind"))
    loop = LoopThread("turn-test")
    try:
        waits = [loop.spawn(w._wait_turn(k, "m", cell, time.monotonic() + 30))
                 for k, cell in (("middle", middle), ("behind", behind))]
        time.sleep(0.2)
        started = time.monotonic()
        w.cancel_execute("middle", "m")
        with pytest.raises(PlacementFailed, match="withdrawn"):
            waits[0].result(timeout=2)
        assert time.monotonic() - started < 0.5
        with w._placement_cv:
            w.cell_queue.tried(ahead, 0, placed=False)
            w._placement_cv.notify_all()
        time.sleep(0.2)
        assert not waits[1].done()  # the withdrawn cell is ahead until it leaves
        with w._placement_cv:
            w.cell_queue.leave(middle)
            w._placement_cv.notify_all()
        assert waits[1].result(timeout=2) == 0
    finally:
        loop.close()


def test_an_order_that_drifts_with_time_is_looked_at_again_now_and_then() -> None:
    """Themis's keys change as time passes with no event, so its waiters look at the order
    every ORDER_RECHECK_S (not 0.25 s); the event-driven orders never do."""
    w = _Waits(UserFairness())
    _join(w, "ahead")
    behind = _join(w, "behind")
    asyncio.run(w._wait_turn("behind", "m", behind, time.monotonic() + IDLE_S))
    assert w.wakeups <= IDLE_S / ORDER_RECHECK_S + 2


# -- a cell waiting for its kernel's replicas (a rebuild, replacements, a wake) ----------------


class _Entry:
    def __init__(self) -> None:
        self.state = "degraded"
        self.replicas: dict[int, object] = {}
        self.front = None
        self.message = "replacing a lost replica"
        self.checkpoint_count = 0
        self.wake_error = ""


class _ReplicaWaits(_Waits):
    def __init__(self) -> None:
        super().__init__(ArrivalOrder())
        self.lock = StateLock()  # as the service's: awaited on the loop
        self.kernels = {"k": _Entry()}
        self.start_timeout_s = 30.0
        self._kernel_changes = 0
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gs-work")

    def _begin_wake(self, kernel_id: str) -> bool:
        """The decision to wake (lock held): never, the kernel is not asleep here."""
        return False


def _wait_in_thread(w: _ReplicaWaits) -> tuple[threading.Thread, list]:
    outcome: list = []

    def wait() -> None:
        try:
            asyncio.run(w._wait_for_replicas("k", "m"))
            outcome.append("ready")
        except PlacementFailed as exc:
            outcome.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    return thread, outcome


def test_a_cell_waiting_for_replicas_sleeps_until_the_kernel_changes() -> None:
    w = _ReplicaWaits()
    thread, outcome = _wait_in_thread(w)
    time.sleep(IDLE_S)
    assert not outcome
    # the 0.1 s poll woke it 15 times; now only the 1 s recheck
    assert w.wakeups <= 2, w.wakeups
    started = time.monotonic()
    with w.lock:
        w.kernels["k"].replicas[1] = object()
        w.kernels["k"].state = "idle"
        w._kernel_changed()  # what _save_kernel does after every change
    thread.join(5)
    assert outcome == ["ready"]
    assert time.monotonic() - started < 0.2


def test_a_withdrawn_cell_stops_waiting_for_replicas_at_once() -> None:
    w = _ReplicaWaits()
    thread, outcome = _wait_in_thread(w)
    time.sleep(0.3)
    started = time.monotonic()
    w.cancel_execute("k", "m")
    thread.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], PlacementFailed)
    assert time.monotonic() - started < 0.2


class _FailingWakes(HibernationMixin, _ReplicaWaits):
    """A hibernated notebook whose first ``failures`` wakes fail (a replica died starting);
    its wakes start as the service's do (``HibernationMixin._start_wake``: a task on the
    cell's loop)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.kernels["k"].state = "hibernated"
        self.failures = failures
        self.wakes = 0
        self._effects: set = set()

    def _begin_wake(self, kernel_id: str) -> bool:
        """The decision to wake, lock held (as the service's): a hibernated kernel is waking."""
        entry = self.kernels[kernel_id]
        if entry.state != "hibernated":
            return False
        self.wakes += 1
        entry.state = "waking"
        return True

    async def _wake(self, kernel_id: str) -> None:
        """The wake, on the loop (as the service's): back to sleep with the reason while it
        fails, else replicas."""
        entry = self.kernels[kernel_id]
        await asyncio.sleep(0.05)
        await self.lock.acquire_async()
        try:
            if self.wakes <= self.failures:
                entry.state = "hibernated"
                entry.wake_error = "replica 6 on host-0 died while starting"
            else:
                entry.replicas[1] = object()
                entry.state = "idle"
            self._kernel_changed()
        finally:
            self.lock.release()


def test_a_failed_wake_is_tried_again_before_the_cell_fails() -> None:
    """A mass wake of 20 notebooks on the 2-core VM had a replica die while starting, once in
    three runs, and the cell that woke the notebook failed (benchmarks/hibernate.py)."""
    w = _FailingWakes(failures=2)
    thread, outcome = _wait_in_thread(w)
    thread.join(10)
    w._pool.shutdown(wait=True)  # its threads gone before the next test counts threads
    assert outcome == ["ready"] and w.wakes == 3


def test_a_wake_that_keeps_failing_fails_the_cell_with_the_reason() -> None:
    w = _FailingWakes(failures=10)
    thread, outcome = _wait_in_thread(w)
    thread.join(10)
    w._pool.shutdown(wait=True)
    assert len(outcome) == 1 and "died while starting" in str(outcome[0]), outcome
    assert w.wakes == 3


def test_a_cell_waking_a_kernel_waits_for_the_lock_without_blocking_the_loop() -> None:
    """A cell for a hibernated notebook decides the wake under the lock, awaited: while a
    thread holds the lock for a second, the loop the cell waits on runs on (it took the lock
    the blocking way, in its look and in ``wake_kernel``, and stopped the loop meanwhile);
    the wake then runs in a task on the loop and the cell goes on."""
    from notebookos.loop_thread import LoopThread

    w = _FailingWakes(failures=0)
    loop = LoopThread("placement-test")
    gaps: list[float] = []

    async def tick() -> None:  # what the fronts on the loop need: turns
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    try:
        ticker = loop.spawn(tick())
        time.sleep(0.1)
        with w.lock:
            wait = loop.spawn(w._wait_for_replicas("k", "m"))
            time.sleep(1.0)
            assert not wait.done() and w.wakes == 0
        time.sleep(0.05)
        assert max(gaps) < 0.5, f"the loop stood still for {max(gaps):.2f} s"
        wait.result(timeout=5)
        ticker.cancel()
    finally:
        loop.close()
        w._pool.shutdown(wait=True)
    assert w.wakes == 1


def test_cells_waiting_for_gpus_hold_no_thread_and_a_release_wakes_them_all() -> None:
    """Issue 32: each waiting placement held a thread of the placement pool for its whole wait,
    so threads grew with the cells waiting (most of them, on an oversubscribed cluster). The
    waits are coroutines on one loop now: 40 cells wait on it, one release wakes them all. Each
    sleeps on a future of its own; one dispatcher sleeps on the signal for all of them (it was
    40 sleepers on the signal, each woken by every event)."""
    from notebookos.loop_thread import LoopThread

    w = _Waits(ArrivalOrder())
    loop = LoopThread("placement-test")
    try:
        before = threading.active_count()
        waits = [loop.spawn(w._placement_pause(f"k{i}", "m", 30, releases=0))
                 for i in range(40)]
        time.sleep(0.5)
        assert threading.active_count() == before, "a thread per waiting cell"
        assert not any(f.done() for f in waits)
        asleep = w.wakeups  # the dispatcher went to sleep once per step; nobody polls
        assert 1 <= asleep <= 2, asleep
        time.sleep(0.3)
        assert w.wakeups == asleep
        started = time.monotonic()
        w._gpus_released()  # from this thread, as a Local Scheduler's answer would come
        for f in waits:
            f.result(timeout=5)
        assert time.monotonic() - started < 1.0
        assert w.wakeups <= asleep + 1  # one step resolved all 40
    finally:
        loop.close()


# -- a per-cell container's cell waiting for a host (batch, lcp: cell_containers.py) -----------

ONE_GPU = ResourceSpec(100, 100, 1, 0.0)


class _HostLink:
    """What the container cycle reads of a host link: it takes containers."""

    draining = False
    unreachable_since = 0.0


class _CellSlots(CellContainerMixin, ExecutionMixin):
    """A per-cell policy's placement up to its container start, on a cluster model of 1-GPU
    hosts: the service's cell queue and waits; the container start and the commit (Local
    Scheduler calls) only note which thread they ran on."""

    def __init__(self, policy: str, hosts: int, gpus: int = 1,
                 order: CellOrder | None = None) -> None:
        self.lock = StateLock()  # as the service's: awaited on the loop
        self._cell_cv = SignallingCondition(self.lock)  # as the service's
        self._placement_cv = SignallingCondition()
        self._kernels_changed = SignallingCondition(self._placement_cv._lock)
        self._gpu_releases = 0
        self._withdrawn_cells: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self._pool = SimpleNamespace(submit=lambda *_: None)  # parking: not here
        self.cell_queue = CellQueue(order or ArrivalOrder())
        self._cell_waiters: list = []
        self.cell_queue_timeout_s = 30.0
        self.cluster = Cluster()
        for i in range(hosts):
            self.cluster.add_host(Host(f"h{i}", ResourceSpec(8000, 64000, gpus, 80.0)))
        self.policy = get_policy(policy)
        self.hosts = {h: _HostLink() for h in self.cluster.hosts}
        self.kernels: dict[str, KernelEntry] = {}
        self.cycle_recorder = None
        self.on_capacity_wanted = None
        self.started: list[tuple[str, str, threading.Thread]] = []
        self.decisions = 0

    def _decide_containers(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        self.decisions += 1
        return super()._decide_containers(*args, **kwargs)

    def add_parked_kernel(self, kernel_id: str, request: ResourceSpec = ONE_GPU) -> None:
        self.cluster.add_kernel(kernel_id, request)
        self.kernels[kernel_id] = KernelEntry(kernel_id, "key", "hmac-sha256", "python3", {},
                                              state="parked")

    async def _start_cell_container(self, kernel_id: str, msg_id: str, request: ResourceSpec,
                                    host_id: str) -> tuple[int, list[int]]:
        self.started.append((kernel_id, host_id, threading.current_thread()))
        return 1, [0]


def _wait_until(predicate, timeout: float = 5.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("policy", ["batch", "lcp"])
def test_per_cell_cells_waiting_for_a_host_hold_no_thread_and_a_release_wakes_them(
        policy: str) -> None:
    """Issue 32, per-cell containers: a batch or lcp cell waiting in the cluster-wide cell queue
    held a thread of the placement pool for its whole wait, blocked on ``_cell_cv``. Its wait is
    a coroutine on the fronts' loop now: 40 cells wait for two busy 1-GPU hosts on one loop, with
    no thread each; a release gives the first two in the queue their host at once, their
    containers' starts are coroutines on the loop too, and an interrupt ends a wait at once."""
    from notebookos.global_scheduler.kernel_modes import CellContainers
    from notebookos.loop_thread import LoopThread

    cells = 40
    w = _CellSlots(policy, hosts=2)
    for host in w.cluster.hosts.values():  # the cells running now
        host.reserve("running", ONE_GPU)
    for i in range(cells):
        w.add_parked_kernel(f"k{i}")
    mode = CellContainers(w)
    loop = LoopThread("cell-slot-test")
    waits: list = []
    try:
        before = threading.active_count()
        waits = [loop.spawn(mode.place_execute_async(f"k{i}", "m", {})) for i in range(cells)]
        _wait_until(lambda: len(w._cell_waiters) == cells)
        time.sleep(0.3)
        # (<=: an idle placement-pool worker left by an earlier test may end meanwhile)
        assert threading.active_count() <= before, "a thread per waiting cell"
        assert len(w._cell_waiters) == cells and not any(f.done() for f in waits)
        # the queue's one dispatcher looked at most once per cell that joined, and sleeps:
        # nobody polls (the cells themselves sleep on their own futures)
        asleep = w._cell_cv.signal.waits
        assert 1 <= asleep <= cells
        time.sleep(0.3)
        assert w._cell_cv.signal.waits == asleep

        started = time.monotonic()
        with w.lock:  # the running cells' GPUs are released (from this thread, as a Local
            for host in w.cluster.hosts.values():  # Scheduler's answer would come)
                host.cancel_reservation("running")
        w._cell_released("running")
        assert waits[0].result(timeout=2) == (1, [0])
        assert waits[1].result(timeout=2) == (1, [0])
        assert time.monotonic() - started < 1.0
        # in the queue's order; each container's start a coroutine on the loop (its Local
        # Scheduler calls in a pool, awaited; its wait to answer holds no thread)
        assert sorted(k for k, _, _ in w.started) == ["k0", "k1"]
        assert sorted(h for _, h, _ in w.started) == ["h0", "h1"]
        assert all(t is loop._thread for _, _, t in w.started)
        assert {w.cluster.hosts[h].reservation_of(f"cell-slot:{k}:m") is not None
                for k, h, _ in w.started} == {True}  # the GPUs set aside for them
        time.sleep(0.2)
        assert not any(f.done() for f in waits[2:]) and len(w._cell_waiters) == cells - 2

        started = time.monotonic()
        assert w.cancel_waiting_cells("k7") == 1  # an interrupt
        with pytest.raises(PlacementFailed, match="interrupted"):
            waits[7].result(timeout=2)
        assert time.monotonic() - started < 1.0
        assert len(w._cell_waiters) == cells - 3
    finally:
        _close(w, loop, waits)
    assert not w._cell_waiters and w.cell_queue.waiting() == 0


class _CountingOrder(ArrivalOrder):
    """Arrival order that counts how often a cell's key is asked for: each look at the queue
    sorts it, so this is the work a look costs, counted rather than timed."""

    def __init__(self) -> None:
        super().__init__()
        self.keys = 0

    def key(self, cell, now: float) -> tuple:  # noqa: ANN001
        self.keys += 1
        return super().key(cell, now)


def _close(w, loop, waits: list) -> None:  # noqa: ANN001 - a placement stand-in, its loop
    """Stop the stand-in's waits and its loop (every test's finally)."""
    w._stop.set()
    w._wake_waiting_placements()
    for f in waits:
        try:
            f.result(timeout=10)
        except PlacementFailed:
            pass
    loop.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("policy", ["batch", "lcp"])
def test_one_release_costs_one_walk_over_the_waiting_cells_not_a_look_per_cell(
        policy: str) -> None:
    """Issue 32: on a release every batch/lcp waiter woke and looked at the whole queue itself
    (sorted it; lcp also ran the container cycle for the cells ahead), and every cell that took
    a host woke them all again: O(N^2) work on the fronts' loop for one release (200 lcp cells:
    about 100 ms the loop did nothing else). One dispatcher walks the queue once per event and
    settles just the cells that may go: here one walk (200 keys asked for, the code before:
    78,807) and a cycle per host plus one (the code before: 792 for lcp)."""
    from notebookos.global_scheduler.kernel_modes import CellContainers
    from notebookos.loop_thread import LoopThread

    cells, hosts = 200, 2
    order = _CountingOrder()
    w = _CellSlots(policy, hosts=hosts, order=order)
    for host in w.cluster.hosts.values():
        host.reserve("running", ONE_GPU)
    for i in range(cells):
        w.add_parked_kernel(f"k{i}")
    mode = CellContainers(w)
    loop = LoopThread("cell-walk-test")
    waits: list = []
    try:
        waits = [loop.spawn(mode.place_execute_async(f"k{i}", "m", {})) for i in range(cells)]
        _wait_until(lambda: len(w._cell_waiters) == cells, timeout=60)
        time.sleep(0.3)
        keys, decisions = order.keys, w.decisions
        with w.lock:
            for host in w.cluster.hosts.values():
                host.cancel_reservation("running")
        w._cell_released("running")
        assert [f.result(timeout=10) for f in waits[:hosts]] == [(1, [0])] * hosts
        time.sleep(0.3)  # whatever the release set off is done
        assert not any(f.done() for f in waits[hosts:])
        assert sorted(k for k, _, _ in w.started) == ["k0", "k1"]  # first come, first served
        assert order.keys - keys <= 2 * cells, "more than one walk over the queue"
        assert w.decisions - decisions <= 2 * (hosts + 1)
    finally:
        _close(w, loop, waits)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("policy, placed", [("batch", []), ("lcp", ["k1", "k2"])])
def test_a_blocked_head_holds_back_batch_and_lcp_backfills_behind_it(
        policy: str, placed: list[str]) -> None:
    """Who goes is as before: two 2-GPU hosts with one GPU busy each; the first cell wants 2
    GPUs and cannot go. ``batch`` lets nobody overtake it; ``lcp`` lets the next 1-GPU cells go,
    in their order, while a host has a GPU for them."""
    from notebookos.global_scheduler.kernel_modes import CellContainers
    from notebookos.loop_thread import LoopThread

    w = _CellSlots(policy, hosts=2, gpus=2)
    for host in w.cluster.hosts.values():
        host.reserve("running", ONE_GPU)
    w.add_parked_kernel("k0", ResourceSpec(100, 100, 2, 0.0))
    for i in range(1, 4):
        w.add_parked_kernel(f"k{i}")
    mode = CellContainers(w)
    loop = LoopThread("cell-walk-test")
    waits: list = []
    try:
        for i in range(4):  # one after the other: the queue's order is their arrival
            waits.append(loop.spawn(mode.place_execute_async(f"k{i}", "m", {})))
            _wait_until(lambda n=i + 1: len(w._cell_waiters) + len(w.started) == n)
        time.sleep(0.3)
        assert sorted(k for k, _, _ in w.started) == placed
        assert [f.done() for f in waits] == [k in placed for k in ("k0", "k1", "k2", "k3")]
    finally:
        _close(w, loop, waits)


# -- a replicated kernel's cell waiting for GPUs (notebookos, reservation: execution.py) ---------


class _GpuCells(_Waits):
    """A replicated kernel's placement (``_wait_for_gpus``): the service's queue, turns and
    pauses; a try (``_try_place``, which calls Local Schedulers) takes one of ``free`` GPUs or
    fails, on a thread of the placement pool as in the service."""

    def __init__(self, order: CellOrder) -> None:
        super().__init__(order)
        self.lock = StateLock()  # as the service's: awaited on the loop
        self.kernels: dict = {}
        self.cluster = SimpleNamespace(total_gpus=2)
        self.cell_queue_timeout_s = 600.0
        self.migration_retries = 3
        self.free = 0
        self.tries = 0
        self.placed: list[str] = []
        self._free_lock = threading.Lock()

    def _try_held(self, kernel_id: str, msg_id: str, request: ResourceSpec) -> _Pass:
        return _Pass(None, None, None, False)  # no held GPUs: every try goes to a thread

    def _try_place(self, kernel_id: str, msg_id: str, request: ResourceSpec,
                   first: _Pass | None = None
                   ) -> tuple[tuple[int, list[int]] | None, str, bool]:
        with self._free_lock:
            self.tries += 1
            if self.free <= 0:
                return None, "every GPU is committed", False
            self.free -= 1
            self.placed.append(kernel_id)
            return (1, [0]), "", False

    def all_tried_since(self, releases: int) -> bool:
        with self._placement_cv:
            return all(w.failed_at >= releases for w in self.cell_queue._waiters.values())


@pytest.mark.timeout(120)
def test_one_release_costs_o_n_for_replicated_kernels_cells_waiting_for_gpus() -> None:
    """Issue 32, replicated kernels (notebookos, reservation): every cell waiting for GPUs woke
    on every release and on every try after it, and each looked at every cell ahead of it (one
    key per waiting cell per look): after a release, each of the N cells tries in its turn and
    each try woke all N, O(N^2) keys per try. One dispatcher now gives the turns: a release
    with 200 cells waiting costs a sort per cell placed (the order changed), the tries that
    follow it none, and the cells in turn are served first come, first served."""
    from notebookos.loop_thread import LoopThread

    cells = 200
    order = _CountingOrder()
    w = _GpuCells(order)
    loop = LoopThread("gpu-wait-test")
    waits: list = []
    try:
        waits = [loop.spawn(w._wait_for_gpus(f"k{i:03d}", "m", ONE_GPU)) for i in range(cells)]
        _wait_until(lambda: w.cell_queue.waiting() == cells and w.all_tried_since(0),
                    timeout=60)
        keys, tries = order.keys, w.tries
        with w._free_lock:
            w.free = 2  # two cells' GPUs were released
        w._gpus_released()
        _wait_until(lambda: len(w.placed) == 2 and w.all_tried_since(1), timeout=30)
        keys, tries = order.keys - keys, w.tries - tries
        assert w.placed == ["k000", "k001"]  # first come, first served
        assert tries >= cells  # every cell tried once since the release, in its turn
        # a sort per cell placed (and at most one more): the code before asked for millions
        assert keys <= 3 * cells, keys
        assert not any(f.done() for f in waits[2:])
    finally:
        _close(w, loop, waits)
    assert w.cell_queue.waiting() == 0
