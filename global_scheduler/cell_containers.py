"""Per-cell containers, for the policies whose ``container_lifetime`` is ``CELL`` (``batch``,
``lcp``). Mixed into ``GlobalSchedulerService``.

Such a kernel is *parked* between cells: no replica runs and its namespace is the store
checkpoint the last cell's container wrote. A cell:

1. waits in the cluster-wide cell queue until a host can bind its GPUs now: in its turn, the
   container cycle (``notebookos.policies.container_cycle``, the one the simulator runs: the
   policy's filter and score, best fit) decides the host. ``batch`` serves the queue strictly
   in arrival order (``policy.backfill`` is False: nobody overtakes a blocked head); ``lcp``
   lets any waiting cell that fits go. The GPUs are set aside on the host (pending) the moment
   it is chosen. A cell that cannot be served within ``cell_queue_timeout_s`` fails with an
   error reply that says why. The wait is a coroutine on the fronts' loop (``place_cell``,
   ``_take_cell_slot``), as a replicated kernel's wait for GPUs is (execution.py): it holds no
   thread, and awaits ``_cell_cv``'s signal (``loop_waits.SignallingCondition``), which every
   event that could let a cell go notifies (a release, a cell leaving the queue, a kernel
   parked, a host added, an interrupt, a stop); each look at the queue runs under the lock and
   calls no Local Scheduler;
2. gets a container on that host: ``batch`` starts a cold replica process, ``lcp`` promotes a
   prewarmed process from the host's warm pool (whose target the GS sets to the policy's
   ``warm_containers_per_host``; the Local Scheduler refills it with fresh processes, so a
   process that held one user's state never serves another). The container restores the
   namespace from the checkpoint when one exists;
3. commits the GPUs there and runs (the container start and the commit call Local Schedulers,
   so they run on a thread of the placement pool, ``run_blocking``, while they run);
4. after the reply: the GPUs are released at once; the container is stopped once its
   checkpoint of the cell is durable (its ``replica_status`` shows ``checkpoint_count`` caught up
   with ``execution_count`` and no ``checkpoint_pending``, which covers a silent cell, or
   ``cell_checkpoint_timeout_s`` passed, which is reported in the kernel's message), and the
   kernel is parked again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import grpc

from notebookos.cluster import AccountingError
from notebookos.global_scheduler.cell_walk import QueueWalk
from notebookos.global_scheduler.control import ControlError, control_request
from notebookos.global_scheduler.cycle_runner import (
    FIRST_CONTAINER,
    CycleRunnerMixin,
)
from notebookos.global_scheduler.errors import StartError
from notebookos.global_scheduler.front import PlacementFailed
from notebookos.global_scheduler.kernels import KernelEntry, ReplicaLink
from notebookos.global_scheduler.loop_dispatch import LoopDispatcher
from notebookos.global_scheduler.loop_waits import run_blocking
from notebookos.policies.cell_order import WaitingCell
from notebookos.policies.cycle import CycleResult, Snapshot, Status
from notebookos.resources import ResourceSpec

log = logging.getLogger(__name__)

CELL_CONTAINER_ENV = {"NOTEBOOKOS_CELL_CONTAINER": "1"}
LAST_CONTAINER_PARKING = "the kernel's last container is still there (its checkpoint is awaited)"


@dataclass
class CellWaiter:
    kernel_id: str
    msg_id: str
    request: ResourceSpec
    arrived: float
    cell: WaitingCell  # as the cell order sees it (the service's cell_queue)
    cancelled: bool = False
    # settled by the queue's dispatcher: the host its GPUs were set aside on, or why it failed
    outcome: asyncio.Future[str] = field(default=None, repr=False)  # type: ignore[assignment]


def _client_msg_id(msg_id: str) -> str:
    return msg_id.split(":retry", 1)[0]


def _slot_owner(kernel_id: str, msg_id: str) -> str:
    return f"cell-slot:{kernel_id}:{msg_id}"


class CellContainerMixin(CycleRunnerMixin):
    # -- starting a kernel ----------------------------------------------------------------------

    def _host_for_first_container(self, kernel_id: str, request: ResourceSpec) -> str:
        """The container that answers the first kernel_info needs no GPUs: the container
        cycle's host for it (``ANSWER_ONLY``: a host the policy accepts for the request, else
        any that can hold its subscription, the most idle first). Raises StartError when none
        can. Lock held."""
        snapshot, result = self._decide_first_container(request)
        self._record_cycle(snapshot, kernel_id, request, result, FIRST_CONTAINER)
        if result.placed:
            return result.host_id
        if result.status is Status.ERROR:
            raise StartError(grpc.StatusCode.INTERNAL, f"kernel {kernel_id}: {result.reason}")
        raise StartError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                         self._why_no_hosts(request, 1, len(snapshot.unavailable_hosts)))

    async def _start_first_container(self, kernel_id: str) -> None:
        """Start one container so the kernel answers its first kernel_info (the reply is cached
        for the parked kernel); the caller parks it. Raises StartError. On the loop: the host
        chosen under the awaited lock, the container's wait to answer holding no thread."""
        async with self._locked():
            request = self.cluster.kernels[kernel_id].request
            host_id = self._host_for_first_container(kernel_id, request)
        await self._add_replicas(kernel_id, 1, join=False, on_host=host_id,
                                       prewarmed=self.uses_warm_pool,
                                       extra_env=CELL_CONTAINER_ENV)

    # -- a cell ---------------------------------------------------------------------------------

    async def place_cell(self, kernel_id: str, msg_id: str, request: ResourceSpec
                         ) -> tuple[int, list[int]]:
        """Queue, start the cell's container, commit its GPUs; raises PlacementFailed. A
        coroutine on the fronts' loop: neither the wait for a host nor the container's start
        holds a thread; the Local Scheduler calls run in a pool, awaited."""
        host_id = await self._take_cell_slot(kernel_id, msg_id, request)
        return await self._start_cell_container(kernel_id, msg_id, request, host_id)

    async def _start_cell_container(self, kernel_id: str, msg_id: str, request: ResourceSpec,
                                    host_id: str) -> tuple[int, list[int]]:
        """Start the cell's container on ``host_id``, where its GPUs were set aside, and commit
        them, on the loop: the decisions under the awaited lock, the container started by
        ``_add_replicas`` (its wait to answer holds no thread), the commit (a Local
        Scheduler call) on a placement pool thread. Raises PlacementFailed, the slot given
        up."""
        slot = _slot_owner(kernel_id, msg_id)
        t0 = time.monotonic()
        rid: int | None = None
        try:
            async with self._locked():
                entry = self.kernels[kernel_id]
                restore = entry.checkpoint_count > 0
                entry.state = "idle"
            started = await self._start_retrying_async(
                kernel_id, "container start", lambda: self._add_replicas(
                    kernel_id, 1, join=False, on_host=host_id, restore=restore,
                    prewarmed=self.uses_warm_pool, extra_env=CELL_CONTAINER_ENV))
            rid = started[0]
            started_ms = (time.monotonic() - t0) * 1000
            link = self.hosts.get(host_id)
            if link is None:
                raise PlacementFailed(f"host {host_id} left while the cell's container started")
            device_ids, reason = await run_blocking(
                lambda: link.commit_gpus(kernel_id, rid, msg_id, request.gpus))
            if device_ids is None:
                raise PlacementFailed(f"could not bind the GPUs set aside for the cell: "
                                      f"{reason}")
            async with self._locked():
                entry = self.kernels.get(kernel_id)
                kernel = self.cluster.kernels.get(kernel_id)
                if entry is None or kernel is None:
                    raise PlacementFailed(f"kernel {kernel_id} was stopped while its cell's "
                                          "container started")
                self._cancel_slot(host_id, slot)
                self._record_commit(entry, kernel, msg_id, rid, host_id, request, device_ids)
                rl = entry.replicas[rid]
                entry.last_container_start_ms = started_ms
                entry.last_cell_pid = rl.pid
                entry.last_cell_from_prewarm_pool = rl.from_prewarm_pool
            log.info("kernel %s: cell %s in container %d on %s (pid %d, %s) after %.0f ms",
                     kernel_id, msg_id[:8], rid, host_id, rl.pid,
                     "warm" if rl.from_prewarm_pool else "cold", started_ms)
            return rid, device_ids
        except (StartError, AccountingError, PlacementFailed) as exc:
            async with self._locked():
                self._cancel_slot(host_id, slot)
                self._cell_cv.notify_all()
            if rid is not None:
                await run_blocking(lambda: self._park(kernel_id))
            else:
                async with self._locked():
                    entry = self.kernels.get(kernel_id)
                    if entry is not None and not entry.replicas and entry.state == "idle":
                        entry.state = "parked"
            if isinstance(exc, PlacementFailed):
                raise
            raise PlacementFailed(f"could not start the cell's container on host {host_id}: "
                                  f"{exc}") from exc

    def _cancel_slot(self, host_id: str, slot: str) -> None:
        host = self.cluster.hosts.get(host_id)
        if host is not None and host.reservation_of(slot) is not None:
            host.cancel_reservation(slot)

    @property
    def _cell_dispatcher(self) -> LoopDispatcher:
        """The one coroutine that serves the cell queue (loop_dispatch.py), on ``_cell_cv``'s
        signal."""
        dispatcher = self.__dict__.get("_cell_dispatch")
        if dispatcher is None:
            dispatcher = LoopDispatcher(self._cell_cv.signal, self._serve_cell_queue,
                                        "cell-queue", lock=self.lock)
            self.__dict__["_cell_dispatch"] = dispatcher
        return dispatcher

    async def _take_cell_slot(self, kernel_id: str, msg_id: str,
                              request: ResourceSpec) -> str:
        """Wait in the cell queue until a host can bind ``request`` now, in the turn the cell
        order gives it; set its GPUs aside (pending) and return the host id. A coroutine on the
        fronts' loop that awaits its own future, and nothing else: the queue's dispatcher
        (``_serve_cell_queue``, woken by ``_cell_cv``'s signal) resolves it with the host, or
        with the PlacementFailed that ends the wait. It holds neither a thread nor the lock."""
        loop = asyncio.get_running_loop()
        async with self.lock.held():
            entry = self.kernels.get(kernel_id)
            hints = entry.hints if entry is not None else None
            with self._placement_cv:
                self.cell_queue.set_capacity(self.cluster.total_gpus)
                cell = self.cell_queue.join(kernel_id, msg_id,
                                            user=hints.user if hints else "",
                                            notebook=hints.notebook if hints else "",
                                            gpus=request.gpus)
            waiter = CellWaiter(kernel_id, msg_id, request, time.monotonic(), cell,
                                outcome=loop.create_future())
            self._cell_waiters.append(waiter)
        self._cell_dispatcher.kick()  # its first look: with the others, in one walk
        placed = False
        try:
            host_id = await waiter.outcome
            placed = True
            return host_id
        finally:
            if not placed:  # also when the task is cancelled (the loop stops)
                self._cell_wait_ended(waiter)

    def _cell_wait_ended(self, waiter: CellWaiter) -> None:
        """The waiter's coroutine ended without taking its host: the dispatcher did not settle
        it (it was cancelled): out of the queue; or it settled it with a host the coroutine
        did not take: the GPUs set aside go back. The queue looks again."""
        outcome = waiter.outcome
        with self._cell_cv:
            if outcome is None or not outcome.done() or outcome.cancelled():
                if waiter in self._cell_waiters:
                    self._cell_waiters.remove(waiter)
                    with self._placement_cv:
                        self.cell_queue.leave(waiter.cell)
            elif outcome.exception() is None:
                self._cancel_slot(outcome.result(), _slot_owner(waiter.kernel_id,
                                                                waiter.msg_id))
            else:
                return  # failed by the dispatcher: already out of the queue
            self._cell_cv.notify_all()

    def _serve_cell_queue(self) -> float | None:
        """One step of the cell queue's dispatcher (loop_dispatch.py): one walk over the
        waiting cells in the cell order that settles the ones that may go now (their GPUs set
        aside on the chosen host) and the ones that stop waiting (PlacementFailed), and leaves
        the others asleep. How long until a waiter must be looked at again (its deadline, or
        the order's recheck), or None when none waits. Lock held; calls no Local Scheduler.

        Who may go is the rule each waiter applied for itself when it looked: without backfill
        (batch) only the first cell still waiting; with backfill (lcp) a cell when no cell
        still waiting ahead of it could take a host now."""
        with self._cell_cv:
            waiting = [w for w in self._cell_waiters if not w.outcome.done()]
            self._cell_waiters[:] = waiting
            if not waiting:
                return None
            now = time.monotonic()
            with self._placement_cv:
                order = self.cell_queue.order
                ordered = sorted(waiting, key=lambda w: order.key(w.cell, now))
            walk = QueueWalk(self)
            sleep_s: float | None = None
            for waiter in ordered:
                try:
                    host_id = self._look_for_cell_slot(waiter, now, walk)
                except PlacementFailed as exc:
                    self._settle_cell(waiter, exc)
                    continue
                except Exception as exc:  # noqa: BLE001 - the cell's wait ends with it, as
                    self._settle_cell(waiter, exc)  # it did when each waiter looked itself
                    log.exception("kernel %s: a look at the cell queue failed",
                                  waiter.kernel_id)
                    continue
                if host_id is not None:
                    self._settle_cell(waiter, host_id)
                    continue
                walk.still_waiting(waiter)
                with self._placement_cv:
                    wait_s = self.cell_queue.wait_s(waiter.arrived + self.cell_queue_timeout_s,
                                                    now)
                sleep_s = wait_s if sleep_s is None else min(sleep_s, wait_s)
            self._cell_waiters[:] = [w for w in self._cell_waiters if not w.outcome.done()]
            return sleep_s if self._cell_waiters else None

    def _settle_cell(self, waiter: CellWaiter, outcome: str | BaseException) -> None:
        """End a waiter's wait: its host (its GPUs set aside, its turn taken in the queue), or
        the exception its coroutine raises (out of the queue). Lock held."""
        if isinstance(outcome, BaseException):
            with self._placement_cv:
                self.cell_queue.leave(waiter.cell)
            waiter.outcome.set_exception(outcome)
        else:
            waiter.outcome.set_result(outcome)

    def _look_for_cell_slot(self, waiter: CellWaiter, now: float,
                            walk: QueueWalk) -> str | None:
        """One waiting cell's turn in the dispatcher's walk: the host its GPUs were set aside
        on, or None (it waits on). Raises PlacementFailed when the cell stops waiting. Lock
        held."""
        kernel_id, msg_id, request = waiter.kernel_id, waiter.msg_id, waiter.request
        entry = self.kernels.get(kernel_id)
        if entry is None or entry.state in ("stopping", "failed") or self._stop.is_set():
            raise PlacementFailed(f"kernel {kernel_id} was stopped while its cell waited")
        if waiter.cancelled:
            raise PlacementFailed("the cell was interrupted while it waited for a host")
        if _client_msg_id(msg_id) in entry.lost_cells:
            raise PlacementFailed(
                "the container running this cell was lost before the cell completed; the "
                "cell is not run again (a cell runs at most once), the namespace is that of "
                "the last completed cell")
        never = walk.never_fits(request)
        if never:  # waiting would block the queue for nothing
            raise PlacementFailed(never)
        if walk.may_go(waiter):
            result = walk.decide(waiter)
            if result.placed:  # the effect: the GPUs set aside on its host
                self.cluster.hosts[result.host_id].reserve(_slot_owner(kernel_id, msg_id),
                                                           request)
                walk.model_changed()
                with self._placement_cv:
                    self.cell_queue.tried(waiter.cell, 0, placed=True)
                return result.host_id
            if result.status in (Status.ERROR, Status.UNSCHEDULABLE_AND_UNRESOLVABLE):
                raise PlacementFailed(result.reason)
            if result.status is Status.UNSCHEDULABLE and self.on_capacity_wanted is not None:
                self.on_capacity_wanted(request.gpus)
        if now >= waiter.arrived + self.cell_queue_timeout_s:
            raise PlacementFailed(self._why_still_waiting(request, walk.ahead))
        return None

    def _parked(self, waiter: CellWaiter) -> bool:
        """The waiter's kernel has no container now (its previous cell's is gone)."""
        entry = self.kernels.get(waiter.kernel_id)
        return entry is not None and not entry.replicas and not entry.parking

    def _decide_cell_host(self, waiter: CellWaiter) -> tuple[Snapshot, CycleResult]:
        """The container cycle (``notebookos.policies.container_cycle``) for ``waiter``'s
        container: the host it starts on, or why not now (``WAIT`` while the kernel's last
        container is still there). Lock held."""
        change = "" if self._parked(waiter) else LAST_CONTAINER_PARKING
        return self._decide_containers(waiter.request, replica_change=change)

    def _why_still_waiting(self, request: ResourceSpec, ahead: int) -> str:
        order = (f"in {self.cell_queue.order.name} order"
                 + (" with backfill" if self.policy.backfill else ", no backfill"))
        return (f"no host could bind {request.gpus} GPU(s) for this cell within "
                f"{self.cell_queue_timeout_s:g}s (policy {self.policy.name}: one container per "
                f"cell, queue served {order}; {ahead} cell(s) ahead of this one; "
                f"{self.cluster.committed_gpus} of {self.cluster.total_gpus} GPU(s) committed)")

    def cancel_waiting_cells(self, kernel_id: str) -> int:
        """An interrupt: the kernel's cells that wait for a host stop waiting."""
        with self._cell_cv:
            waiting = [w for w in self._cell_waiters if w.kernel_id == kernel_id]
            for w in waiting:
                w.cancelled = True
            self._cell_cv.notify_all()
        return len(waiting)

    def queued_cells(self, kernel_id: str) -> int:
        return sum(1 for w in self._cell_waiters if w.kernel_id == kernel_id)

    # -- after a cell ---------------------------------------------------------------------------

    def _cell_released(self, kernel_id: str) -> None:
        """A cell's GPUs were released: wake the queue and park the kernel in the background."""
        with self._cell_cv:
            self._cell_cv.notify_all()
        self._pool.submit(self._park, kernel_id)

    def _park(self, kernel_id: str) -> None:
        """Stop the kernel's containers once their checkpoint is durable; the kernel is parked."""
        with self.lock:
            entry = self.kernels.get(kernel_id)
            if entry is None or entry.executions or not entry.replicas or entry.parking \
                    or entry.state == "stopping":
                return
            entry.parking = True
            replicas = list(entry.replicas.values())
        try:
            counts = [self._await_checkpoint(entry, r) for r in replicas]
            with self.lock:
                kernel = self.cluster.kernels.get(kernel_id)
                for r in replicas:
                    entry.replicas.pop(r.replica_id, None)
                    if kernel is not None and r.replica_id in kernel.replicas:
                        self.cluster.remove_replica(kernel_id, r.replica_id)
                known = [c for c in counts if c is not None]
                if known:
                    entry.checkpoint_count = max([entry.checkpoint_count, *known])
                if entry.front is not None:  # stopped on purpose, its checkpoint durable
                    entry.front.set_replicas([], planned=True)
            for r in replicas:
                self._stop_replica_quietly(r.host_id, kernel_id, r.replica_id)
        finally:
            with self._cell_cv:
                entry.parking = False
                if entry.state not in ("stopping", "failed") and not entry.replicas:
                    entry.state = "parked"
                if kernel_id in self.kernels:
                    self._save_kernel(entry)
                self._cell_cv.notify_all()

    def _await_checkpoint(self, entry: KernelEntry, replica: ReplicaLink,
                          strict: bool = False) -> int | None:
        """Wait until the container's checkpoint covers its last cell; its checkpoint count.
        ``strict``: None when it does not within ``cell_checkpoint_timeout_s`` (hibernation
        then waits), instead of the count it got to (a parked container is stopped anyway)."""
        deadline = time.monotonic() + self.cell_checkpoint_timeout_s
        status: dict = {}
        while time.monotonic() < deadline and not self._stop.is_set():
            try:
                status = control_request(replica.endpoint, entry.key, entry.signature_scheme,
                                         "replica_status_request", {}, timeout_s=5)
            except ControlError as exc:
                log.warning("kernel %s: container %d: %s", entry.kernel_id, replica.replica_id,
                            exc)
                return None
            caught_up = (int(status.get("checkpoint_count", 0))
                         >= int(status.get("execution_count", 0)))
            if caught_up and not status.get("checkpoint_pending", False):  # a silent cell
                return int(status.get("checkpoint_count", 0))  # leaves the counts equal
            self._stop.wait(0.05)
        done, count = status.get("checkpoint_count", "?"), status.get("execution_count", "?")
        if strict:
            return None
        with self.lock:
            entry.message = (f"the checkpoint after cell [{count}] was not written within "
                             f"{self.cell_checkpoint_timeout_s:g}s; the next cell starts from "
                             f"the state after cell [{done}]")
        log.warning("kernel %s: %s", entry.kernel_id, entry.message)
        return int(done) if isinstance(done, int) else None

    def _lose_cell_container(self, entry: KernelEntry, replica_id: int, why: str) -> None:
        """A cell's container died: no replacement (the next cell starts a new one); a cell it
        was running fails instead of running twice. Called with the lock held."""
        entry.replicas.pop(replica_id, None)
        for msg_id in self._forget_replica(entry, replica_id):
            entry.lost_cells.add(_client_msg_id(msg_id))
            entry.message = f"a cell's container was lost mid-cell: {why}"
        if not entry.replicas and entry.state not in ("stopping", "starting"):
            entry.state = "parked"
        log.warning("kernel %s: container %d lost: %s", entry.kernel_id, replica_id, why)
        self._save_kernel(entry)
        self._cell_cv.notify_all()
