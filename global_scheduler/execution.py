"""Running cells: which replica executes, GPU commit and release, migration when every replica's
host is busy. Mixed into ``GlobalSchedulerService`` (it uses the service's lock, cluster model,
host links and kernel entries). The fronts place a cell with ``place_execute_async``, a
coroutine on their loop: its waits (for replicas, its turn, GPUs) hold no thread, and each try
(which calls Local Schedulers) runs on a thread of the placement pool (loop_waits.py).

A cell waiting for its turn or for a release awaits a future of its own. One dispatcher
(loop_dispatch.py, ``_serve_gpu_waits``) wakes on ``_placement_cv``'s signal instead of every
waiter: per event it asks the cell queue for the cells whose turn came (cell_queue.py: no key
asked for while the order holds), resolves their futures, and the pausing cells' when the
release count moved; it fails the waits of withdrawn cells and, on a stop, all. Each waiter's
own deadline is a timer of its own. A release with N cells waiting used to wake all N on
every try that followed it, each looking at every cell ahead: O(N^2) per event."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import grpc

from notebookos.cluster import AccountingError
from notebookos.global_scheduler.cell_queue import ORDER_RECHECK_S
from notebookos.global_scheduler.cycle_runner import CycleRunnerMixin
from notebookos.global_scheduler.errors import StartError
from notebookos.global_scheduler.front import PlacementFailed
from notebookos.global_scheduler.front_loop import FrontLoop
from notebookos.global_scheduler.hibernation import ASLEEP
from notebookos.global_scheduler.hosts import HostLink
from notebookos.global_scheduler.kernels import RELEASED_ARRIVALS_KEPT, KernelEntry
from notebookos.global_scheduler.loop_dispatch import LoopDispatcher
from notebookos.global_scheduler.loop_waits import run_blocking
from notebookos.global_scheduler.sharing import SharingMixin
from notebookos.policies.cell_order import WaitingCell
from notebookos.policies.cycle import Action, CycleResult, Snapshot, Status, run_cycle
from notebookos.proto import local_scheduler_pb2
from notebookos.resources import ResourceSpec

log = logging.getLogger(__name__)


# A cell waiting for its kernel's replicas wakes on every change of the kernel's record; this
# is only the longest it sleeps without one (it was a 0.1 s poll).
REPLICA_WAIT_RECHECK_S = 1.0
# A cell that wakes a hibernated notebook tries this many wakes before it fails.
WAKE_ATTEMPTS = 3
WITHDRAWN = "the cell was withdrawn while it waited (the kernel was interrupted)"


@dataclass(eq=False)
class _GpuWaiter:
    """A cell waiting for its turn (``cell``) or for a release after ``releases``."""

    kernel_id: str
    msg_id: str
    future: asyncio.Future[int]  # the release count it goes on from; or PlacementFailed
    releases: int | None = None  # a pause: the release count it waits past (None: none)
    cell: WaitingCell | None = None  # a turn: the cell whose turn it waits for


class _Pass(NamedTuple):
    """One scheduling cycle of a placement try: what it ran on and decided."""

    entry: KernelEntry
    kernel: Any
    result: CycleResult
    shareable: bool


@dataclass
class _GpuWaits:
    """The replicated kernels' cells waiting for GPUs, as their dispatcher sees them (under
    ``_placement_cv``'s lock)."""

    dispatcher: LoopDispatcher
    turns: dict[WaitingCell, _GpuWaiter] = field(default_factory=dict)
    pauses: dict[_GpuWaiter, None] = field(default_factory=dict)
    keyed: dict[tuple[str, str], _GpuWaiter] = field(default_factory=dict)  # by cell id
    releases_seen: int = -1  # the release count the pauses were last looked at for

    def add(self, waiter: _GpuWaiter) -> None:
        if waiter.cell is None:
            self.pauses[waiter] = None
        else:
            self.turns[waiter.cell] = waiter
        self.keyed[(waiter.kernel_id, waiter.msg_id)] = waiter

    def forget(self, waiter: _GpuWaiter) -> None:
        if waiter.cell is None:
            self.pauses.pop(waiter, None)
        elif self.turns.get(waiter.cell) is waiter:
            del self.turns[waiter.cell]
        key = (waiter.kernel_id, waiter.msg_id)
        if self.keyed.get(key) is waiter:
            del self.keyed[key]


class ExecutionMixin(SharingMixin, CycleRunnerMixin):
    async def _wait_for_replicas(self, kernel_id: str, msg_id: str) -> None:
        """A cell that arrives while the kernel has no replica because it is being rebuilt or
        its replacements are starting waits for them (up to the replica start timeout) instead
        of failing at once. A coroutine on the fronts' loop: no thread while it waits. It wakes
        when the kernel's record changes (``_save_kernel``), when the cell is withdrawn or the
        scheduler stops, and at 0.2 s to tell the user why it waits; at least every
        ``REPLICA_WAIT_RECHECK_S`` it looks again in any case (a change that bypassed
        ``_save_kernel`` then costs that much, not the whole timeout). Each look takes the
        lock awaited (state_lock.py: a thread holding it delays the cell, not the loop); a
        hibernated kernel's wake is decided there (``_begin_wake``) and run in a task on
        this loop (``_start_wake``), as WakeKernel does."""
        started = time.monotonic()
        deadline = started + self.start_timeout_s
        told = False
        woke = False
        wakes = 0
        signal = self._kernels_changed.signal
        while time.monotonic() < deadline:
            changed = signal.future()  # before the state is read: a change after it wakes us
            await self.lock.acquire_async()  # a thread holding it delays this cell, not the loop
            try:
                entry = self.kernels.get(kernel_id)
                if entry is None or entry.state == "stopping":
                    return
                asleep = entry.state in ASLEEP
                if entry.replicas and not asleep:
                    if woke and entry.front is not None:
                        entry.front.cell_note(msg_id, entry.message or "the notebook woke")
                    return
                if entry.state == "failed":
                    raise PlacementFailed(f"the kernel has no replica and could not be "
                                          f"recovered: {entry.message}")
                if entry.state == "hibernated" and entry.wake_error and woke:
                    if wakes >= WAKE_ATTEMPTS:
                        raise PlacementFailed(f"the notebook could not be woken from "
                                              f"hibernation: {entry.wake_error}")
                    # a replica that died while starting (20 notebooks woken at once on the
                    # 2-core VM, once in three runs): the cell waits for another try
                    log.warning("kernel %s: wake %d of %d failed (%s); trying again",
                                kernel_id, wakes, WAKE_ATTEMPTS, entry.wake_error)
                    entry.wake_error = ""
                why = entry.message
                front = entry.front
                checkpoint = entry.checkpoint_count
                # hibernated: the decision to wake it (hibernating: its replicas stop first)
                waking = asleep and self._begin_wake(kernel_id)
            finally:
                self.lock.release()
            if asleep:
                if not woke:
                    woke = True
                    if front is not None:
                        front.cell_waiting(msg_id, "the notebook was hibernated (idle); waking "
                                           f"it from its checkpoint after cell [{checkpoint}]"
                                           "; the cell runs once its replicas are ready")
                if waking:  # the wake itself (Local Scheduler calls, its replicas' start)
                    wakes += 1
                    self._start_wake(kernel_id)
            elif not told and time.monotonic() - started >= 0.2 and front is not None:
                told = True  # a rebuild takes seconds: say why the cell waits
                front.cell_waiting(msg_id, "waiting for the kernel's replicas to be replaced"
                                   + (f" ({why})" if why else "")
                                   + "; the cell runs once they are ready")
            until = min(deadline, time.monotonic() + REPLICA_WAIT_RECHECK_S)
            if not told and not asleep and front is not None:
                until = min(until, started + 0.2)
            with self._kernels_changed:
                self._still_placing(kernel_id, msg_id)
            await signal.wait(changed, max(0.0, until - time.monotonic()))

    def _kernel_changed(self) -> None:
        """A kernel's record changed (its replicas, its state): cells waiting for replicas
        look again."""
        with self._kernels_changed:
            self._kernel_changes += 1
            self._kernels_changed.notify_all()

    def _await_kernel_change(self, seen: int, until: float,
                             check: Callable[[], None] | None = None) -> None:
        """Sleep until a kernel's record changes after ``seen`` changes were counted, until
        ``until`` (monotonic), or until the scheduler stops. ``check`` runs before each sleep
        and ends the wait by raising (a withdrawn cell's PlacementFailed)."""
        with self._kernels_changed:
            while True:
                if check is not None:
                    check()
                left = until - time.monotonic()
                if left <= 0 or self._kernel_changes != seen or self._stop.is_set():
                    return
                self._kernels_changed.wait(left)

    # -- waiting for GPUs: a withdrawn cell (interrupt) and a GPU release wake the wait -------

    def cancel_execute(self, kernel_id: str, msg_id: str) -> None:
        """The front withdrew the cell (an interrupt while it waited): stop placing it."""
        with self._placement_cv:
            self._withdrawn_cells.add((kernel_id, msg_id))
            self._placement_cv.notify_all()
            self._kernels_changed.notify_all()

    def _gpus_released(self) -> None:
        with self._placement_cv:
            self._gpu_releases += 1
            self._placement_cv.notify_all()

    def _capacity_added(self) -> None:
        """A host joined: cells waiting for GPUs (or for a host, per-cell containers) try
        again now, as after a release."""
        self._gpus_released()
        with self._cell_cv:
            self._cell_cv.notify_all()

    def _wake_waiting_placements(self) -> None:
        """The scheduler stops: every waiting placement looks again (and fails)."""
        with self._placement_cv:
            self._placement_cv.notify_all()
            self._kernels_changed.notify_all()
        with self._cell_cv:
            self._cell_cv.notify_all()

    def _still_placing(self, kernel_id: str, msg_id: str) -> None:
        """Raises PlacementFailed when the cell was withdrawn or the scheduler stops.
        ``_placement_cv`` held."""
        if (kernel_id, msg_id) in self._withdrawn_cells:
            raise PlacementFailed(WITHDRAWN)
        if self._stop.is_set():
            raise PlacementFailed("the Global Scheduler is stopping")

    @property
    def _gpu_waits(self) -> _GpuWaits:
        """The cells waiting for their turn or a release, and their dispatcher, on
        ``_placement_cv``'s signal (made on first use, on the fronts' loop)."""
        waits = self.__dict__.get("_gpu_wait_state")
        if waits is None:
            waits = _GpuWaits(LoopDispatcher(self._placement_cv.signal, self._serve_gpu_waits,
                                             "gpu-waits"))
            self.__dict__["_gpu_wait_state"] = waits
        return waits

    async def _await_gpu_wait(self, waiter: _GpuWaiter, timeout: float) -> int | None:
        """Sleep until the dispatcher resolves ``waiter`` (the release count it goes on from;
        raises its PlacementFailed) or ``timeout`` passes (None). Out of the waits after, also
        when cancelled."""
        waits = self._gpu_waits
        waits.dispatcher.ensure()
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), max(0.0, timeout))
        except TimeoutError:
            pass
        finally:
            with self._placement_cv:
                waits.forget(waiter)
            if waiter.future.done() and not waiter.future.cancelled():  # its failure is not
                waiter.future.exception()  # logged as lost when the task was cancelled
        return waiter.future.result() if waiter.future.done() else None

    def _serve_gpu_waits(self) -> float | None:
        """One step of the GPU waits' dispatcher (loop_dispatch.py), ``_placement_cv``'s
        signal fired: resolve the waiters that may go on now and nobody else. What each
        waiter looked at for itself on every fire: a withdrawal or a stop ends its wait (the
        withdrawn cells looked up by id; every waiter only on a stop); a pause ends when the
        release count moved (all pauses looked at once per release); a turn comes when every
        cell ahead tried since the release and failed (``CellQueue.new_turns``: just the cells
        whose turn came since the last step). Sleeps until the next fire, or
        ``ORDER_RECHECK_S`` for an order that drifts with time while cells wait for their
        turn; None when nothing waits."""
        waits = self._gpu_waits
        with self._placement_cv:
            if not waits.turns and not waits.pauses:
                return None
            releases = self._gpu_releases
            ending = (list(waits.keyed.values()) if self._stop.is_set() else
                      [w for key in self._withdrawn_cells if (w := waits.keyed.get(key))])
            for waiter in ending:  # a stop, or the few cells being withdrawn
                try:
                    self._still_placing(waiter.kernel_id, waiter.msg_id)
                except PlacementFailed as exc:
                    waits.forget(waiter)
                    waiter.future.set_exception(exc)
            if releases != waits.releases_seen:
                waits.releases_seen = releases
                for waiter in [w for w in waits.pauses
                               if w.releases is not None and w.releases != releases]:
                    waits.forget(waiter)
                    waiter.future.set_result(releases)
            if waits.turns:
                for cell in self.cell_queue.new_turns(releases):
                    waiter = waits.turns.get(cell)
                    if waiter is not None:
                        waits.forget(waiter)
                        waiter.future.set_result(releases)
            if waits.turns and self.cell_queue.order.changes_with_time:
                return ORDER_RECHECK_S  # its keys drift: whose turn it is may change
            return math.inf if waits.turns or waits.pauses else None

    async def _placement_pause(self, kernel_id: str, msg_id: str, seconds: float,
                               releases: int | None = None) -> None:
        """Sleep up to ``seconds``, less when GPUs are released (after ``releases`` were
        counted); raises PlacementFailed when the cell was withdrawn or the scheduler stops.
        Woken by the dispatcher (a release, a withdrawal, a stop) or its own timer, by no
        other cell's try."""
        deadline = time.monotonic() + seconds
        loop = asyncio.get_running_loop()
        while True:
            with self._placement_cv:
                self._still_placing(kernel_id, msg_id)
                left = deadline - time.monotonic()
                if left <= 0 or (releases is not None and self._gpu_releases != releases):
                    return
                waiter = _GpuWaiter(kernel_id, msg_id, loop.create_future(), releases)
                self._gpu_waits.add(waiter)
            if await self._await_gpu_wait(waiter, left) is not None:
                return

    # -- placing a cell -----------------------------------------------------------------------

    async def place_execute_async(self, kernel_id: str, msg_id: str,
                                  metadata: dict) -> tuple[int, list[int]]:
        """The front's placement, as a coroutine on its loop (``FrontHooks``): it holds no
        thread while the cell waits (for GPUs, its turn, its kernel's replicas)."""
        started = time.monotonic()
        try:
            placed = await self.mode.place_execute_async(kernel_id, msg_id, metadata)
        except PlacementFailed:
            self.metrics.cell_failures.inc()
            raise
        finally:
            with self._placement_cv:
                self._withdrawn_cells.discard((kernel_id, msg_id))
        self.metrics.cell_queue.observe(time.monotonic() - started)
        return placed

    def place_execute(self, kernel_id: str, msg_id: str, metadata: dict) -> tuple[int, list[int]]:
        """``place_execute_async`` for a caller on a thread of its own: it waits (never call
        it on the fronts' loop, which runs the coroutine)."""
        return FrontLoop.shared().spawn(
            self.place_execute_async(kernel_id, msg_id, metadata)).result()

    async def _place_in_cell_container(self, kernel_id: str,
                                       msg_id: str) -> tuple[int, list[int]]:
        """A per-cell container's cell: through the cluster-wide cell queue (cell_containers.py;
        its wait for a host, too, holds no thread)."""
        async with self.lock.held():
            entry = self.kernels.get(kernel_id)
            kernel = self.cluster.kernels.get(kernel_id)
            if entry is None or kernel is None:
                raise PlacementFailed(f"kernel {kernel_id} is not known to the scheduler")
            entry.cell_arrived[msg_id] = time.monotonic()
            request = kernel.request
        return await self.place_cell(kernel_id, msg_id, request)

    async def _place_on_replicas(self, kernel_id: str, msg_id: str) -> tuple[int, list[int]]:
        """A long-running kernel's cell: the session's GPUs (reservation), or GPUs committed
        now on a replica's host (or one a replica migrates to), waiting while none can."""
        await self._wait_for_replicas(kernel_id, msg_id)
        async with self.lock.held():
            entry = self.kernels.get(kernel_id)
            kernel = self.cluster.kernels.get(kernel_id)
            if entry is None or kernel is None:
                raise PlacementFailed(f"kernel {kernel_id} is not known to the scheduler")
            self._active(entry)
            request = kernel.request
            entry.cell_arrived[msg_id] = time.monotonic()
            if len(entry.cell_arrived) > 1024:  # cells that never started (failed placement)
                entry.cell_arrived.pop(next(iter(entry.cell_arrived)))
            if entry.session_gpus is not None and entry.session_gpus[0] in entry.replicas:
                rid, host_id, ids = entry.session_gpus
                entry.executions[msg_id] = (rid, host_id)
                entry.last_cell_gpus[rid] = list(ids)
                return rid, list(ids)
        return await self._wait_for_gpus(kernel_id, msg_id, request)

    async def _wait_for_gpus(self, kernel_id: str, msg_id: str,
                             request: ResourceSpec) -> tuple[int, list[int]]:
        """Commit the cell's GPUs on a replica's host, or on a host a replica migrates to; while
        neither can, the cell waits in the cell queue (told why, through its front), trying
        again in its turn (``cell_queue.py``) whenever GPUs are released and at least every few
        seconds, and fails only after ``cell_queue_timeout_s`` with the reason. Between tries
        it holds no thread."""
        started = time.monotonic()
        deadline = started + self.cell_queue_timeout_s
        async with self.lock.held():
            entry = self.kernels.get(kernel_id)
            hints = entry.hints if entry is not None else None
            gpus_total = self.cluster.total_gpus
        with self._placement_cv:
            self.cell_queue.set_capacity(gpus_total)
            cell = self.cell_queue.join(kernel_id, msg_id, user=hints.user if hints else "",
                                        notebook=hints.notebook if hints else "",
                                        gpus=request.gpus)
        placed = None
        try:
            told = ""
            failed_migrations = 0
            for attempt in itertools.count():
                releases = await self._wait_turn(kernel_id, msg_id, cell, deadline)
                # the try's first pass on the loop: a cell that takes over its replica's held
                # GPUs is placed here; one that must call a Local Scheduler (CommitGpus, a
                # migration) goes on with that pass on a thread, while the call blocks
                async with self.lock.held():  # taken without stopping the loop
                    first = self._try_held(kernel_id, msg_id, request)
                if isinstance(first, _Pass):
                    placed, why, migration_failed = await run_blocking(
                        lambda first=first: self._try_place(kernel_id, msg_id, request, first))
                else:
                    placed, why, migration_failed = first, "", False
                with self._placement_cv:
                    self.cell_queue.tried(cell, releases, placed is not None)
                    self._placement_cv.notify_all()
                if placed is not None:
                    if told:
                        log.info("kernel %s: cell %s placed after waiting %.1fs for GPUs",
                                 kernel_id, msg_id[:8], time.monotonic() - started)
                    return placed
                waited = time.monotonic() - started
                failed_migrations += migration_failed
                if failed_migrations >= max(1, self.migration_retries):
                    raise PlacementFailed(f"{why} ({failed_migrations} migration(s) failed; "
                                          "global_scheduler.migration_retries)")
                if time.monotonic() >= deadline:
                    raise PlacementFailed(
                        f"the cell waited {waited:.0f}s for {request.gpus} GPU(s) "
                        f"(global_scheduler.cell_queue_timeout_s = "
                        f"{self.cell_queue_timeout_s:g}s) and none could be bound: {why}")
                if not told:
                    told = why
                    with self._placement_cv:
                        queue_note = self.cell_queue.explain(cell)
                    self._tell_waiting(kernel_id, msg_id, request, f"{why}; {queue_note}")
                await self._placement_pause(kernel_id, msg_id, min(2.0, 0.25 * 2 ** attempt),
                                            releases)
            raise AssertionError("unreachable")
        finally:
            if placed is None:
                with self._placement_cv:
                    self.cell_queue.leave(cell)
                    self._placement_cv.notify_all()

    async def _wait_turn(self, kernel_id: str, msg_id: str, cell: WaitingCell,
                         deadline: float) -> int:
        """Wait until the cell queue says it is ``cell``'s turn to try; returns the release
        count its try starts from. A cell that is withdrawn, or whose deadline passes, stops
        waiting (PlacementFailed; its deadline is told by the caller after one more try).
        It looks once itself, then sleeps until the dispatcher gives it its turn (a try or a
        leave of a cell ahead, a release) or ends its wait (a withdrawal, a stop), or its
        deadline."""
        loop = asyncio.get_running_loop()
        while True:
            with self._placement_cv:
                self._still_placing(kernel_id, msg_id)
                releases = self._gpu_releases
                if self.cell_queue.may_try(cell, releases) or time.monotonic() >= deadline:
                    return releases
                waiter = _GpuWaiter(kernel_id, msg_id, loop.create_future(), cell=cell)
                self._gpu_waits.add(waiter)
            given = await self._await_gpu_wait(waiter, deadline - time.monotonic())
            if given is not None:
                return given

    def _tell_waiting(self, kernel_id: str, msg_id: str, request: ResourceSpec,
                      why: str) -> None:
        with self.lock:
            entry = self.kernels.get(kernel_id)
            front = entry.front if entry is not None else None
        log.info("kernel %s: cell %s waits for %d GPU(s): %s", kernel_id, msg_id[:8],
                 request.gpus, why)
        if front is not None:
            front.cell_waiting(msg_id, (
                f"waiting for {request.gpus} GPU(s): {why}. The cell runs as soon as GPUs "
                f"free up (it waits up to {self.cell_queue_timeout_s:g}s); interrupt the "
                "kernel to withdraw it."))

    def _tell_migrating(self, kernel_id: str, msg_id: str, why: str) -> None:
        with self.lock:
            entry = self.kernels.get(kernel_id)
            front = entry.front if entry is not None else None
        if front is not None:
            front.cell_migrating(msg_id, why)

    # -- the scheduling cycle (notebookos.policies.cycle), applied through the Local Schedulers

    def _cycle(self, entry: KernelEntry, kernel, request: ResourceSpec,  # noqa: ANN001
               refused: dict[int, str], share_refused: str) -> CycleResult:
        """One scheduling cycle on the cluster model and what this scheduler knows beyond it
        (hosts that refused, a replica change under way, who shares which device). Lock
        held."""
        profile = self.profile
        change = ""
        if self.policy.supports_migration:
            change = self._short_of_replicas(entry) or (
                "a replica of the kernel is moving" if self.migration_running(entry.kernel_id)
                else "")
        sharing = (self._sharing_view(entry, kernel)
                   if profile.shares and not share_refused else None)
        snapshot = Snapshot(self.cluster, {**self._starting(entry, kernel),
                                           **self._on_draining_hosts(entry), **refused},
                            change, sharing, share_refused, self._unavailable_hosts())
        result = run_cycle(snapshot, kernel, request, profile)
        self._record_cycle(snapshot, kernel.kernel_id, request, result)
        return result

    @staticmethod
    def _starting(entry: KernelEntry, kernel) -> dict[int, str]:  # noqa: ANN001 - cluster Kernel
        """The kernel's replicas the cluster model holds that are not ready yet (a replacement
        or a migration target still starting), as refused: the kernel's front cannot reach one,
        and a cell placed there was placed again at once, on it again, and failed after four
        placements within a millisecond ("replica 210 chosen for the cell is not connected";
        the fault campaign, seed 14). Lock held."""
        return {rid: "it is still starting" for rid in kernel.replicas
                if rid not in entry.replicas}

    def _on_draining_hosts(self, entry: KernelEntry) -> dict[int, str]:
        """The kernel's replicas on hosts that are draining (host_drain.py), as refused: a
        cell runs on another replica where there is one, so that the drain is not kept
        waiting by cell after cell. Nothing when every replica is on one (the cluster is
        stopping). Lock held."""
        draining = {rid: f"its host {r.host_id} is draining"
                    for rid, r in entry.replicas.items()
                    if (link := self.hosts.get(r.host_id)) is not None and link.draining}
        return draining if len(draining) < len(entry.replicas) else {}

    def _cycle_pass(self, kernel_id: str, request: ResourceSpec, refused: dict[int, str],
                    share_refused: str) -> _Pass:
        """One scheduling cycle for a cell of ``kernel_id`` (``_cycle``), under the lock."""
        with self.lock:
            entry = self.kernels.get(kernel_id)
            kernel = self.cluster.kernels.get(kernel_id)
            if entry is None or kernel is None or entry.state == "stopping":
                raise PlacementFailed(f"kernel {kernel_id} was stopped")
            result = self._cycle(entry, kernel, request, refused, share_refused)
            return _Pass(entry, kernel, result, self._may_share(entry))

    def _try_held(self, kernel_id: str, msg_id: str, request: ResourceSpec
                  ) -> tuple[int, list[int]] | _Pass:
        """The first pass of ``_try_place``, on the fronts' loop, as far as it goes without a
        call to a Local Scheduler: when the cycle runs the cell on a replica whose previous
        cell's GPUs its host still holds for release (a notebook's cells back to back), the
        cell takes them over (``HostLink.take_over_held``, no call) and is placed here: (the
        replica, device ids). Otherwise the pass, for ``_try_place`` to go on with on a thread
        of the placement pool. (Every such cell went to a thread and back to the loop: two
        hand-offs, issue 36.)"""
        step = self._cycle_pass(kernel_id, request, {}, "")
        result = step.result
        if result.status is Status.SUCCESS and result.action is Action.EXECUTE \
                and not step.shareable:
            rid, host_id = result.replica_id, result.host_id
            link = self.hosts.get(host_id)
            device_ids = (link.take_over_held(kernel_id, rid, msg_id, request.gpus)
                          if link is not None else None)
            if device_ids is not None:
                with self.lock:
                    self._record_commit(step.entry, step.kernel, msg_id, rid, host_id, request,
                                        device_ids)
                return rid, device_ids
        return step

    def _try_place(self, kernel_id: str, msg_id: str, request: ResourceSpec,
                   first: _Pass | None = None
                   ) -> tuple[tuple[int, list[int]] | None, str, bool]:
        """One try: run the scheduling cycle (``notebookos.policies.cycle``) and apply its
        decision: commit on the replica's host it chose, share a device there, or migrate a
        replica to a host that can bind the GPUs now and commit there. A host that refuses
        what the model said it could take is told to the next cycle (``Snapshot.refused``),
        which passes over it. ``first``: the first pass's cycle, run already
        (``_try_held``). Returns ((replica, device ids) or None, why not, whether a
        migration was tried and failed)."""
        refused: dict[int, str] = {}
        share_refused = ""
        for _ in range(64):  # each pass refuses a replica or the share plans: bounded
            step, first = first or self._cycle_pass(kernel_id, request, refused,
                                                    share_refused), None
            entry, kernel, result, shareable = step
            if result.status is Status.ERROR \
                    or result.status is Status.UNSCHEDULABLE_AND_UNRESOLVABLE:
                raise PlacementFailed(result.reason)
            if result.status is Status.UNSCHEDULABLE:
                if self.on_capacity_wanted is not None:
                    self.on_capacity_wanted(request.gpus)
                return None, result.reason, False
            if result.status is Status.WAIT:
                return None, result.reason, False
            if result.action is Action.EXECUTE:
                rid, host_id = result.replica_id, result.host_id
                link = self.hosts.get(host_id)
                device_ids, reason = (link.commit_gpus(kernel_id, rid, msg_id, request.gpus,
                                                       shareable=shareable)
                                      if link is not None else (None, f"host {host_id} is gone"))
                if device_ids is None:
                    log.debug("kernel %s: replica %d cannot run %s now: %s", kernel_id, rid,
                              msg_id[:8], reason)
                    refused[rid] = reason
                    continue
                with self.lock:
                    self._record_commit(entry, kernel, msg_id, rid, host_id, request,
                                        device_ids)
                return (rid, device_ids), "", False
            if result.action is Action.SHARE:
                placed, not_shared = self._apply_share(kernel_id, msg_id, request, result)
                if placed is not None:
                    return placed, "", False
                share_refused = not_shared or "; not shared: the hosts refused"
                continue
            return self._apply_migration(kernel_id, msg_id, request, result, shareable)
        raise PlacementFailed(f"kernel {kernel_id}: the scheduling cycle did not settle")

    def _apply_migration(self, kernel_id: str, msg_id: str, request: ResourceSpec,
                         result: CycleResult, shareable: bool
                         ) -> tuple[tuple[int, list[int]] | None, str, bool]:
        """The cycle's post-filter moves ``result.replica_id`` to ``result.host_id``: migrate
        it, then commit the cell's GPUs there."""
        why = result.reason
        self._tell_migrating(kernel_id, msg_id, f"replica {result.replica_id} moved to "
                             f"{result.host_id} to run the cell: {why}")
        try:
            rid, host_id = self.migrate_replica(kernel_id, result.replica_id, result.host_id,
                                                request, reason="contention")
        except StartError as exc:
            if self.on_capacity_wanted is not None:
                self.on_capacity_wanted(request.gpus)
            return None, f"{why}, and migrating a replica failed: {exc}", True
        link = self.hosts.get(host_id)
        device_ids, reason = (link.commit_gpus(kernel_id, rid, msg_id, request.gpus,
                                               shareable=shareable)
                              if link is not None else (None, f"host {host_id} is gone"))
        if device_ids is None:
            return (None, f"{why}; the replica moved to {host_id}, which cannot bind them: "
                    f"{reason}", False)
        with self.lock:
            entry = self.kernels.get(kernel_id)
            kernel = self.cluster.kernels.get(kernel_id)
            if entry is None or kernel is None:
                raise PlacementFailed(f"kernel {kernel_id} was stopped during migration")
            self._record_commit(entry, kernel, msg_id, rid, host_id, request, device_ids)
        return (rid, device_ids), "", False

    def _record_commit(self, entry: KernelEntry, kernel, msg_id: str, rid: int,  # noqa: ANN001
                       host_id: str, request: ResourceSpec, device_ids: list[int]) -> None:
        """A Local Scheduler committed GPUs for ``rid``: mirror it in the cluster model and
        remember the executor and the cell's GPUs. Called with the lock held."""
        host = self.cluster.hosts.get(host_id)
        replica = kernel.replicas.get(rid)
        if host is not None and replica is not None:
            try:
                host.commit(replica.owner, request, device_ids)
            except AccountingError as exc:
                log.warning("accounting differs from host %s: %s", host_id, exc)
        kernel.executor = rid
        entry.executions[msg_id] = (rid, host_id)
        entry.last_cell_gpus[rid] = device_ids
        entry.gpu_commits[msg_id] = (time.monotonic(), len(device_ids))

    # -- the fronts' hooks: on the loop they never wait for the lock (state_lock.LoopChanges) --

    def release_execute(self, kernel_id: str, msg_id: str) -> None:
        self._loop_changes.make(self._release_and_tell, kernel_id, msg_id)

    def execute_started(self, kernel_id: str, replica_id: int, msg_id: str) -> None:
        self._loop_changes.make(self._execute_started, kernel_id, replica_id, msg_id,
                                time.monotonic())  # when it was seen, not made

    def execute_finished(self, kernel_id: str, replica_id: int, msg_id: str) -> None:
        self._loop_changes.make(self._execute_finished, kernel_id, replica_id, msg_id)

    def execute_abandoned(self, kernel_id: str, msg_id: str) -> None:
        """No replica ran ``msg_id`` (all yielded, or were lost before it started); it may run
        under another id. Its arrival goes: kept, it held the kernel busy to hibernation for
        ever (the fault campaign: a cell resubmitted after a rebuild from the checkpoint, its
        GPUs committed before the executor was lost)."""
        self._loop_changes.make(self._execute_abandoned, kernel_id, msg_id)

    def _release_and_tell(self, kernel_id: str, msg_id: str) -> None:
        try:
            self._release_execute(kernel_id, msg_id)
        finally:
            self._kernel_changed()  # a drain waiting for the cell to end moves the replica now

    def _release_execute(self, kernel_id: str, msg_id: str) -> None:
        with self.lock:
            entry = self.kernels.get(kernel_id)
            if entry is None:
                return
            held = entry.executions.pop(msg_id, None)
            if held is None:
                # Given up without running here (its executor was lost first and the cell was
                # resubmitted under another id, or it was never placed): it no longer waits to
                # start. A leftover arrival kept the kernel busy to hibernation for ever. A cell
                # that ran keeps its arrival aside (``released_arrivals``) for its
                # execute_input, which a short cell's reply can overtake (the interactivity
                # delay is observed then), and which a resent cell the replicas answer from
                # their record never has (chaos seed 12: the kernel never hibernated again).
                entry.cell_arrived.pop(msg_id, None)
                return
            arrived = entry.cell_arrived.pop(msg_id, None)
            if arrived is not None:  # released before its execute_input: no longer waiting
                entry.released_arrivals[msg_id] = arrived
                if len(entry.released_arrivals) > RELEASED_ARRIVALS_KEPT:
                    entry.released_arrivals.pop(next(iter(entry.released_arrivals)))
            committed = entry.gpu_commits.pop(msg_id, None)
            if committed is not None:  # the cell's GPU time: its GPUs x commit -> release
                entry.gpu_seconds += committed[1] * (time.monotonic() - committed[0])
            self._active(entry)
            rid, host_id = held
            if entry.session_gpus is not None:
                return  # bound for the kernel's life, released when it stops
            with self._placement_cv:
                self.cell_queue.finished(kernel_id, msg_id)
            host = self.cluster.hosts.get(host_id)
            kernel = self.cluster.kernels.get(kernel_id)
            replica = kernel.replicas.get(rid) if kernel is not None else None
            if host is not None and replica is not None \
                    and host.commitment_of(replica.owner) is not None:
                host.release(replica.owner)
            self._sharing_released(kernel_id, msg_id, host_id)
            link = self.hosts.get(host_id)
        if link is not None:  # not waited for: the front forwards the idle meanwhile
            link.release_gpus_async(local_scheduler_pb2.ReleaseGpusRequest(
                kernel_id=kernel_id, replica_id=rid, request_id=msg_id))
        self._gpus_released()  # cells waiting for GPUs try again
        self.mode.cell_released(kernel_id)

    def _execute_started(self, kernel_id: str, replica_id: int, msg_id: str,
                         now: float) -> None:
        with self.lock:
            entry = self.kernels.get(kernel_id)
            arrived = None
            if entry is not None:
                arrived = entry.cell_arrived.pop(msg_id, None)
                if arrived is None:
                    arrived = entry.released_arrivals.pop(msg_id, None)
            if arrived is not None:
                entry.last_interactivity_ms[replica_id] = (now - arrived) * 1000
                entry.kernel_interactivity_ms = entry.last_interactivity_ms[replica_id]
                self.metrics.cell_interactivity_delay.observe(now - arrived)

    def _execute_abandoned(self, kernel_id: str, msg_id: str) -> None:
        with self.lock:
            entry = self.kernels.get(kernel_id)
            if entry is not None:
                entry.cell_arrived.pop(msg_id, None)

    def message_dropped(self, kernel_id: str, reason: str) -> None:
        """A kernel's front dropped a message (``bad_signature`` or ``malformed``)."""
        self.metrics.dropped_messages.labels(reason=reason).inc()

    def _execute_finished(self, kernel_id: str, replica_id: int, msg_id: str) -> None:
        with self.lock:
            kernel = self.cluster.kernels.get(kernel_id)
            if kernel is not None and replica_id in kernel.replicas:
                kernel.executor = replica_id

    def _holds_gpus(self, entry: KernelEntry, replica_id: int) -> bool:
        if entry.session_gpus is not None and entry.session_gpus[0] == replica_id:
            return True
        return any(rid == replica_id for rid, _ in entry.executions.values())

    def _release_orphaned(self, link: HostLink, kernel_id: str, replica_id: int) -> None:
        with self.lock:
            entry = self.kernels.get(kernel_id)
            if entry is None or self._holds_gpus(entry, replica_id):
                return
        log.warning("kernel %s: releasing GPUs replica %d holds on %s for a request this "
                    "scheduler does not know", kernel_id, replica_id, link.host_id)
        try:
            link.stub.ReleaseGpus(local_scheduler_pb2.ReleaseGpusRequest(
                kernel_id=kernel_id, replica_id=replica_id, all_requests=True), timeout=5)
        except grpc.RpcError as exc:
            log.info("releasing orphaned GPUs on %s: %s", link.host_id, exc.details())

