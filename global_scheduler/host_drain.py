"""Moving a host's replicas off before the host stops (issue 37: a node drained for maintenance).

A Local Scheduler that gets SIGTERM (``docker node update --availability drain``, a rolling
update, an operator's ``systemctl stop``) calls ``DrainHost`` before it stops anything. The
host then takes no new replica (``HostLink.draining``: the container cycle skips it) and runs
no new cell where another replica of the kernel can (``execution._cycle`` refuses replicas on
draining hosts), and each replica on it is migrated to another host (``migrate_replica``,
placed by the container cycle) once the cell it runs, if any, has finished. Without the drain
the host's replicas were stopped with it and replaced afterwards, and a cell running on one was
failed and answered by the others' election.

The drain is a coroutine on the loop (``drain_host_async``; issue 32): each replica's move (a
decision and its migration, Local Scheduler calls) is awaited in the ``gs-work`` pool, and the
waits for a cell to end hold no thread. The autoscaler's scale-in runs it from its thread
(``drain_host``).

When every host asks at once the whole cluster is stopping (``notebookos up`` stopping, ``docker
compose down``): after ``DRAIN_SETTLE_S`` no host is left to take a replica and the call returns
at once, having moved nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from notebookos.global_scheduler.cycle_runner import REPLICAS
from notebookos.global_scheduler.errors import StartError
from notebookos.global_scheduler.front_loop import FrontLoop
from notebookos.policies.cycle import Status
from notebookos.proto import global_scheduler_pb2

log = logging.getLogger(__name__)

DRAIN_SETTLE_S = 1.0  # hosts that ask within this long are stopping together: none takes another's
DRAIN_RECHECK_S = 1.0  # a replica that cannot move yet is looked at again this soon at the latest


class HostDrainMixin:
    async def DrainHost(self, request, context):  # noqa: N802
        """On the loop (grpc_loop.py): the request checked here and against the registry under
        the lock, awaited; then the drain (``drain_host_async``), which ends when its caller
        goes away (the call cancelled), as before."""
        if not request.deadline_s > 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"deadline_s must be positive, got {request.deadline_s}")
        refused = None
        async with self._locked():
            link = self.hosts.get(request.host_id)
            if link is None:
                refused = (grpc.StatusCode.NOT_FOUND,
                           f"host {request.host_id!r} is not registered")
            elif request.instance_id and link.instance_id != request.instance_id:
                refused = (grpc.StatusCode.FAILED_PRECONDITION,
                           f"host {request.host_id!r} registered again since (instance "
                           f"{link.instance_id}, not {request.instance_id})")
        if refused is not None:
            await context.abort(*refused)
        moved, stayed, detail = await self.drain_host_async(
            request.host_id, time.monotonic() + request.deadline_s)
        return global_scheduler_pb2.DrainHostResponse(moved=moved, stayed=stayed, detail=detail)

    def drain_host(self, host_id: str, deadline: float, *, reason: str = "drain",
                   settle: bool = True) -> tuple[int, int, str]:
        """``drain_host_async`` for a thread (the autoscaler's scale-in): run on the fronts'
        loop, this thread blocked until it ends."""
        return FrontLoop.shared().spawn(self.drain_host_async(
            host_id, deadline, reason=reason, settle=settle)).result()

    async def drain_host_async(self, host_id: str, deadline: float, *, reason: str = "drain",
                               settle: bool = True) -> tuple[int, int, str]:
        """Migrate every replica off ``host_id`` by ``deadline`` (monotonic); returns (moved,
        stayed, why some stayed). On the loop: the looks at the host's replicas under the
        lock, awaited; each replica's move (``_drain_one``: a decision and its migration) in
        the ``gs-work`` pool, awaited; the waits for a cell to end or another change of a
        kernel's replicas on the kernels' changes (``_kernels_changed.signal``), holding no
        thread. Cancelled (its caller went away), it ends after the move under way. ``reason``
        labels the migrations (drain, scale_in); ``settle``: wait ``DRAIN_SETTLE_S`` for
        other hosts stopping at the same time (not for a scale-in, which the scheduler itself
        decided)."""
        async with self._locked():
            link = self.hosts.get(host_id)
            if link is None:
                return 0, 0, f"host {host_id} is not registered"
            link.draining = True
            self._kernel_changed()  # cells waiting on the host's replicas look again
            on_host = self._replicas_on(host_id)
        log.info("host %s is draining: %d replica(s) to move", host_id, len(on_host))
        if on_host and settle:  # hosts stopping together ask within this long
            await asyncio.sleep(max(0.0, min(DRAIN_SETTLE_S, deadline - time.monotonic())))
        moved = 0
        left: dict[tuple[str, int], str] = {}  # replicas that will not move, and why
        changed = self._kernels_changed.signal
        while not self._stop.is_set():
            woken = changed.future()  # before the look: a change after it wakes us
            waiting = False
            async with self._locked():
                on_host = self._replicas_on(host_id)
            for kernel_id, replica_id in on_host:
                if (kernel_id, replica_id) in left:
                    continue
                outcome = await self._pool.run(self._drain_one, kernel_id, replica_id, reason)
                if outcome is True:
                    moved += 1
                elif outcome is None:
                    waiting = True
                else:
                    left[(kernel_id, replica_id)] = outcome
            if not waiting or time.monotonic() >= deadline:
                break
            await changed.wait(woken, max(0.0, min(deadline - time.monotonic(),
                                                   DRAIN_RECHECK_S)))
        async with self._locked():
            stayed = self._replicas_on(host_id)
        reasons = sorted({left.get(r, "the deadline passed first") for r in stayed})
        detail = "; ".join(reasons)
        log.info("host %s drained: %d replica(s) moved, %d stayed%s", host_id, moved,
                 len(stayed), f" ({detail})" if detail else "")
        return moved, len(stayed), detail

    def _replicas_on(self, host_id: str) -> list[tuple[str, int]]:
        with self.lock:
            return [(entry.kernel_id, rid) for entry in self.kernels.values()
                    for rid, replica in entry.replicas.items() if replica.host_id == host_id]

    def _drain_one(self, kernel_id: str, replica_id: int, reason: str) -> bool | None | str:
        """Move one replica: True when it moved, None when it cannot move yet (it runs a cell,
        another change of the kernel's replicas is under way), else why it will not move."""
        with self.lock:
            entry = self.kernels.get(kernel_id)
            kernel = self.cluster.kernels.get(kernel_id)
            if entry is None or kernel is None or replica_id not in entry.replicas:
                return True  # gone meanwhile: nothing left to move
            if self._not_movable_yet(kernel_id, replica_id):
                return None
            exclude = [r.host_id for r in entry.replicas.values()]
            snapshot, result = self._decide_containers(kernel.request, 1, exclude=exclude)
            self._record_cycle(snapshot, kernel_id, kernel.request, result, REPLICAS)
            if result.status is not Status.SUCCESS:
                return f"no other host can take a replica of {kernel_id}: {result.reason}"
            target = result.hosts[0]
        try:
            self.migrate_replica(kernel_id, replica_id, target, reason=reason)
        except StartError as exc:
            with self.lock:
                if exc.code is grpc.StatusCode.UNAVAILABLE or self._not_movable_yet(kernel_id,
                                                                                    replica_id):
                    return None  # a cell or another change got there first: again after it
            return f"{kernel_id}: {exc}"
        return True

    def _not_movable_yet(self, kernel_id: str, replica_id: int) -> bool:
        """The replica runs a cell, or another change of the kernel's replicas is under way
        (a migration then would leave the group without a majority). Lock held."""
        entry = self.kernels.get(kernel_id)
        if entry is None:
            return False
        return (any(rid == replica_id for rid, _ in entry.executions.values())
                or bool(self._short_of_replicas(entry)) or self.migration_running(kernel_id))


__all__ = ["DRAIN_RECHECK_S", "DRAIN_SETTLE_S", "HostDrainMixin"]
