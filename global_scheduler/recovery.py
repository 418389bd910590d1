"""Keeping kernels whole: losing a replica, replacing it (Raft membership changes), rebuilding a
group that lost its majority from the last checkpoint, moving a replica to another host. Mixed
into ``GlobalSchedulerService``.

A lost replica's replacement (or the rebuild) runs as a coroutine on the fronts' loop
(``_recover_replica_count``, issue 32): its decisions under the lock, awaited; its blocking
steps (membership changes, status asked of replicas, Local Scheduler calls) in the
``gs-work`` pool; the wait for the new replicas to answer on the loop, holding no thread (it
held a ``gs-work`` thread for the whole wait before). A migration is a coroutine the same way
(``migrate_replica_async``; ``migrate_replica`` for a thread that asks for one and waits)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent import futures

import grpc

from notebookos.global_scheduler import background
from notebookos.global_scheduler.control import ControlError, control_request
from notebookos.global_scheduler.cycle_runner import MIGRATION, SESSION_GPUS, CycleRunnerMixin
from notebookos.global_scheduler.errors import StartError
from notebookos.global_scheduler.front import ReplicaEndpoint
from notebookos.global_scheduler.front_loop import FrontLoop
from notebookos.global_scheduler.kernels import KernelEntry
from notebookos.policies.cycle import ONE_REPLICA_STAYS, Status
from notebookos.proto import local_scheduler_pb2
from notebookos.resources import ResourceSpec

log = logging.getLogger(__name__)

MIGRATION_WAIT_S = 120.0  # how long a migration waits for the kernel's other membership change

RECOVERY_ATTEMPTS = 6  # a kernel with no replica left is declared failed after these
RECOVERY_BACKOFF_MAX_S = 8.0


class RecoveryMixin(CycleRunnerMixin):
    def _lose_replica(self, entry: KernelEntry, replica_id: int, why: str) -> None:
        """A replica or container is gone (died, or its host was lost): as the kernel mode says
        (a per-cell container is not replaced: cell_containers.py). Lock held."""
        self.mode.lose_container(entry, replica_id, why)

    def _lose_and_replace(self, entry: KernelEntry, replica_id: int, why: str) -> None:
        """A long-running replica is gone: drop it from the front and accounting, start its
        replacement (a task on the loop: ``_restore_replica_count``). Lock held."""
        lost = entry.replicas.pop(replica_id, None)
        if lost is not None:
            entry.raft_removals.append(replica_id)
            entry.removal_addresses[replica_id] = lost.raft_address
        self._forget_replica(entry, replica_id)
        entry.state = "degraded"
        entry.message = why
        log.warning("kernel %s: %s; %d replica(s) left", entry.kernel_id, why,
                    len(entry.replicas))
        self._save_kernel(entry)
        self._restore_replica_count(entry.kernel_id)  # a task on the loop

    def _forget_replica(self, entry: KernelEntry, replica_id: int) -> list[str]:
        """Drop a lost replica (already out of ``entry.replicas``) from the cluster model, the
        cells it was running and the front; returns those cells' request ids. Lock held."""
        kernel = self.cluster.kernels.get(entry.kernel_id)
        if kernel is not None and replica_id in kernel.replicas:
            self.cluster.remove_replica(entry.kernel_id, replica_id)
        running = [m for m, (rid, _) in entry.executions.items() if rid == replica_id]
        with self._placement_cv:
            for msg_id in running:
                del entry.executions[msg_id]
                committed = entry.gpu_commits.pop(msg_id, None)
                if committed is not None:  # its GPUs were held until the replica was lost
                    entry.gpu_seconds += committed[1] * (time.monotonic() - committed[0])
                self.cell_queue.finished(entry.kernel_id, msg_id)
        if entry.front is not None:
            entry.front.set_replicas(entry.endpoints())
        return running

    def _restore_replica_count(self, kernel_id: str) -> asyncio.Future | futures.Future:
        """Start the kernel's recovery (``_recover_replica_count``) on the fronts' loop and
        return at once: from the loop, a task kept in ``_effects``; from any other thread (a
        migration that failed, a hibernation that gave up, a restart of the scheduler),
        handed to the loop. Returns the task (or its future for other threads); a failure
        is logged."""
        loop = FrontLoop.shared()
        recovery = self._recover_replica_count(kernel_id)
        if _running_loop() is loop.loop:
            return background.spawn(recovery, self._effects)
        future = loop.spawn(recovery)
        future.add_done_callback(background.log_failure)
        return future

    async def _recover_replica_count(self, kernel_id: str) -> None:
        """Bring the kernel back to R replicas: replacements join the running group while it has
        a Raft majority; without one, the group is rebuilt from the store's last checkpoint.

        A coroutine on the loop: its decisions under the lock, awaited (``_locked``); the
        blocking steps (Raft membership changes, the replicas' status asked, the Local
        Schedulers' calls) awaited in the ``gs-work`` pool; the wait for a new replica to
        answer on the loop (``_add_replicas``), holding no thread."""
        async with self._locked():
            entry = self.kernels.get(kernel_id)
            if entry is None:
                return
            guard = self._recovery_guards.setdefault(kernel_id, asyncio.Lock())
        if guard.locked():
            return  # a recovery of this kernel is running; it re-reads the state each attempt
        await guard.acquire()  # free: taken at once
        try:
            pool = self._pool
            await self._remove_lost_members_now(kernel_id)
            await asyncio.sleep(0.5)  # let failures that happened together all be reported
            attempt = 0
            quorum_lost = False
            while not self._stop.is_set():
                attempt += 1
                async with self._locked():
                    entry = self.kernels.get(kernel_id)
                    # a kernel going to sleep or asleep keeps its state: its replicas are
                    # stopped on purpose, and a hibernation that gives up asks for them again
                    # (hibernation._stay_awake); "idle" written over "hibernating" made that
                    # hibernation give up without re-arming its clock: awake for good
                    if entry is None or entry.state in ("stopping", "failed", "hibernating",
                                                        "hibernated"):
                        return
                    live = len(entry.replicas)
                    missing = self.replicas_per_kernel - live
                    if missing <= 0:
                        if entry.state == "degraded":  # a rebuild's message stays visible
                            entry.message = ""
                        entry.state = "idle"
                        self._save_kernel(entry)
                        return
                    rebuild = quorum_lost or live * 2 <= self.replicas_per_kernel
                    membership = self._membership_guards.setdefault(kernel_id, asyncio.Lock())
                if not rebuild and await pool.run(self._quorum_lost, kernel_id):
                    rebuild = quorum_lost = True
                started = time.monotonic()
                try:
                    async with membership:  # after a migration running now
                        if rebuild:
                            new_ids = await self._rebuild_from_checkpoint(kernel_id)
                        else:
                            new_ids = await self._add_replicas(kernel_id, 1, join=True)
                    self.metrics.placement.labels(
                        operation="rebuild" if rebuild else "replica_replacement",
                    ).observe(time.monotonic() - started)
                    if rebuild:
                        self.metrics.rebuilds.labels(outcome="succeeded").inc()
                    await pool.run(self._rebind_session_gpus, kernel_id, new_ids)
                except StartError as exc:
                    if rebuild:
                        self.metrics.rebuilds.labels(outcome="failed").inc()
                    log.warning("kernel %s: recovery attempt %d failed: %s", kernel_id,
                                attempt, exc)
                    if attempt >= RECOVERY_ATTEMPTS:
                        async with self._locked():
                            entry = self.kernels.get(kernel_id)
                            if entry is not None and len(entry.replicas) == 0:
                                entry.state = "failed"
                                entry.message = ("every replica was lost and the rebuild "
                                                 "failed; see the log")
                                self._save_kernel(entry)
                                return
                    # a kernel that still has a majority keeps trying (the host that refused
                    # may free up, another may register): degraded must not become permanent
                    await asyncio.sleep(min(RECOVERY_BACKOFF_MAX_S, 0.5 * 2 ** (attempt - 1)))
        finally:
            guard.release()

    async def _remove_lost_members_now(self, kernel_id: str) -> None:
        """Take lost replicas out of the Raft group at once, while it keeps a majority, rather
        than after the 0.5 s in which failures that came together are gathered: a cell sent to
        an executor that was just killed waits in its election for that executor's LEAD until
        the member is removed (then every member left has yielded, the election fails and the
        front resubmits the cell), so this is time the user waits for the next cell (issue 36:
        0.5 of the 1.0 s after a SIGKILL). A failure here is retried by the replacement."""
        async with self._locked():
            entry = self.kernels.get(kernel_id)
            if entry is None or not entry.raft_removals \
                    or len(entry.replicas) * 2 <= self.replicas_per_kernel:
                return
            members = [r.endpoint for r in entry.replicas.values() if r.ready]
        if not members:
            return
        try:
            async with self._membership_guard(kernel_id):
                await self._pool.run(self._remove_lost_members, entry, members)
        except StartError as exc:
            log.info("kernel %s: removing lost replicas at once failed (retried before the "
                     "replacement joins): %s", kernel_id, exc)

    def _quorum_lost(self, kernel_id: str, confirm_after_s: float = 1.0) -> bool:
        """Whether the kernel's Raft group cannot commit although most of its replicas live:
        every live member that answers says it has no quorum, twice ``confirm_after_s``
        apart. The group then counts members this scheduler no longer knows (a membership
        change it took for done that was rolled back, say): no replacement can join (the
        membership change never commits; this loop used to retry it for good) and no cell can
        run, so it is rebuilt from its last checkpoint, as a group that lost its majority."""
        for check in range(2):
            if check:
                self._stop.wait(confirm_after_s)
            with self.lock:
                entry = self.kernels.get(kernel_id)
                if entry is None:
                    return False
                members = [r.endpoint for r in entry.replicas.values() if r.ready]
                key, scheme = entry.key, entry.signature_scheme
            answers = []
            views = []
            for member in members:
                try:
                    status = control_request(member, key, scheme, "replica_status_request", {},
                                             timeout_s=5)
                except ControlError:
                    continue
                answers.append(bool(status.get("has_quorum", True)))
                views.append(f"replica {status.get('replica_id')}: Raft view "
                             f"{status.get('raft_members')}, leader {status.get('raft_leader')}")
            if not answers or any(answers):
                return False
        log.warning("kernel %s: no live replica of its Raft group has a quorum (the group "
                    "counts members that are gone): rebuilding it from its last checkpoint (%s)",
                    kernel_id, "; ".join(views))
        return True

    async def _rebuild_from_checkpoint(self, kernel_id: str) -> list[int]:
        """The group lost its majority: stop the survivors (they cannot commit anything) and
        start a fresh group whose replicas load the store's checkpoint; returns their ids. The
        freshest survivor writes that checkpoint first where one can (``_survivor_checkpoint``):
        then nothing it applied is lost. On the loop, as ``_recover_replica_count``: the
        survivors' status and stops in the ``gs-work`` pool, the new group awaited
        (``_add_replicas``)."""
        pool = self._pool
        async with self._locked():
            entry = self.kernels[kernel_id]
            survivors = list(entry.replicas.values())
            entry.state = "recovering"
            entry.message = ("Raft majority lost: rebuilding the kernel from its last "
                             "checkpoint; cells since then are lost")
        survivor = await pool.run(self._survivor_checkpoint, entry, survivors)
        async with self._locked():
            if survivor is not None:
                rid, count = survivor
                entry.checkpoint_count = max(entry.checkpoint_count, count)
                entry.message = (f"Raft majority lost: rebuilding the kernel from a checkpoint "
                                 f"of the state replica {rid} held after cell [{count}]")
            log.warning("kernel %s: %s", kernel_id, entry.message)
            for r in survivors:
                entry.replicas.pop(r.replica_id, None)
                if r.replica_id in self.cluster.kernels[kernel_id].replicas:
                    self.cluster.remove_replica(kernel_id, r.replica_id)
            entry.raft_removals.clear()
            entry.removal_addresses.clear()
            if entry.front is not None:
                entry.front.set_replicas([])
            self._save_kernel(entry)
        for r in survivors:
            await pool.run(self._stop_replica_quietly, r.host_id, kernel_id, r.replica_id)
        new_ids = await self._add_replicas(
            kernel_id, self.replicas_per_kernel, join=False, restore=True,
            extra_env=None if survivor is None else
            {"NOTEBOOKOS_RESTORED_FROM_SURVIVOR": f"replica {survivor[0]}"})
        async with self._locked():
            entry.state = "idle"
            entry.message = ("rebuilt from the last checkpoint after losing the Raft majority"
                             if survivor is None else
                             f"rebuilt after losing the Raft majority from a checkpoint of "
                             f"the state replica {survivor[0]} held after cell "
                             f"[{survivor[1]}]")
            self._save_kernel(entry)
        return new_ids

    def _survivor_checkpoint(self, entry: KernelEntry,
                             survivors: list) -> tuple[int, int] | None:
        """Have the survivor that applied the most cells write a checkpoint of its state
        (``write_checkpoint_request``) before the group is rebuilt from the store: the last
        checkpoint an executor wrote may be older (a SIGKILL right after a cell). Returns
        (replica id, the last cell it applied) when the store's checkpoint now holds its state
        (written now, or as recent already), or None (none answered or could: the store's
        checkpoint stands, and the rebuilt group says that later work may be lost)."""
        ranked = []
        for r in survivors:
            try:
                status = control_request(r.endpoint, entry.key, entry.signature_scheme,
                                         "replica_status_request", {}, timeout_s=5)
            except ControlError as exc:
                log.warning("kernel %s: survivor replica %d did not say what it holds (%s): "
                            "its state cannot be the checkpoint to rebuild from",
                            entry.kernel_id, r.replica_id, exc)
                continue
            if status.get("diverged"):
                log.warning("kernel %s: survivor replica %d diverged from the committed state: "
                            "its state cannot be the checkpoint to rebuild from",
                            entry.kernel_id, r.replica_id)
                continue
            log_end = tuple(int(v) for v in status.get("raft_log_end") or (0, 0))
            count = int(status.get("execution_count") or 0)
            # Raft's vote rule first (the last entry's term, then its index): the survivor
            # whose log a new leader would have had, had a quorum remained
            ranked.append((log_end, count, r))
        for _log_end, count, r in sorted(ranked, key=lambda c: (c[0], c[1]), reverse=True):
            try:
                # entries in its log it had not learned were committed are applied first
                # (``RaftLog.apply_unconfirmed_tail``): the executor's last Completion, when it
                # was killed right after its cell; a checkpoint older than the store's is not
                # written (the replica answers 0)
                reply = control_request(r.endpoint, entry.key, entry.signature_scheme,
                                        "write_checkpoint_request",
                                        {"apply_unconfirmed_tail": True}, timeout_s=60)
            except ControlError as exc:
                log.warning("kernel %s: replica %d could not write its state as the "
                            "checkpoint: %s", entry.kernel_id, r.replica_id, exc)
                continue
            if reply.get("status") == "ok":
                written = int(reply.get("checkpoint_count") or 0)
                count = int(reply.get("execution_count") or count)  # its unconfirmed tail too
                if not written and count < entry.checkpoint_count:
                    log.info("kernel %s: the store's checkpoint (cell [%d]) is newer than what "
                             "replica %d holds (cell [%d]): rebuilding from it",
                             entry.kernel_id, entry.checkpoint_count, r.replica_id, count)
                    return None  # the store's checkpoint is newer than what any survivor holds
                if not written:  # the store's checkpoint is as recent as its state
                    log.info("kernel %s: the store's checkpoint is as recent as replica %d's "
                             "state (cell [%d]): rebuilding from it", entry.kernel_id,
                             r.replica_id, count)
                    return r.replica_id, count
                log.info("kernel %s: replica %d wrote its state after cell [%d] as the "
                         "checkpoint to rebuild from", entry.kernel_id, r.replica_id, written)
                return r.replica_id, written
            log.warning("kernel %s: replica %d could not write its state as the checkpoint: "
                        "%s", entry.kernel_id, r.replica_id, reply.get("reason"))
        return None

    def _rebind_session_gpus(self, kernel_id: str, new_ids: list[int]) -> None:
        """Reservation (GPUs bound at placement): the replica holding the kernel's GPUs was
        replaced, so another commits them: the one the container cycle chooses
        (``SESSION_GPUS``: the replacement on its own host first, else another live replica
        whose host can). A host that refuses the commit is passed over by the next cycle
        (``Snapshot.refused``). The old commitment left the cluster model with the old replica;
        it is released on the old Local Scheduler too when that one is still reachable."""
        if not self.binding.binds_at_placement:
            return
        with self.lock:
            entry = self.kernels.get(kernel_id)
            kernel = self.cluster.kernels.get(kernel_id)
            if entry is None or kernel is None or entry.session_gpus is None:
                return
            old_rid, old_host, _ = entry.session_gpus
            if old_rid in entry.replicas:
                return  # the holder is alive
            entry.session_gpus = None
            old_link = self.hosts.get(old_host)
            spec = kernel.request
        if old_link is not None:
            try:
                old_link.stub.ReleaseGpus(local_scheduler_pb2.ReleaseGpusRequest(
                    kernel_id=kernel_id, replica_id=old_rid, all_requests=True), timeout=5)
            except grpc.RpcError as exc:  # NOT_FOUND: it went with the replica
                log.debug("kernel %s: releasing the old session GPUs on %s: %s", kernel_id,
                          old_host, exc.details())
        refused: dict[int, str] = {}
        while True:
            with self.lock:
                kernel = self.cluster.kernels.get(kernel_id)
                if kernel is None or self.kernels.get(kernel_id) is not entry:
                    return  # stopped meanwhile
                snapshot, result = self._decide_session_gpus(kernel, new_ids, refused)
                self._record_cycle(snapshot, kernel_id, spec, result, SESSION_GPUS)
                rid = result.replica_id
                if result.placed and rid not in entry.replicas:  # not started: pass it over
                    refused[rid] = f"replica {rid} is not running"
                    continue
            if not result.placed:
                log.warning("kernel %s: no replica could take the session's GPUs (%s: %s)",
                            kernel_id, result.status, result.reason)
                break
            try:  # the Local Scheduler's CommitGpus: outside the lock
                self._bind_for_session(entry, spec, rid)
            except StartError as exc:
                refused[rid] = str(exc)
                continue
            log.info("kernel %s: session GPUs %s now committed to replica %d on %s",
                     kernel_id, entry.session_gpus[2], rid, entry.session_gpus[1])
            break
        with self.lock:
            self._save_kernel(entry)

    def migrate_replica(self, kernel_id: str, replica_id: int | None, target_host: str | None,
                        request: ResourceSpec | None = None, *,
                        reason: str = "operator") -> tuple[int, str]:
        """``migrate_replica_async`` for a thread (a cell's contention migration in the
        placement pool, a drain's move in ``gs-work``): run on the fronts' loop, this thread
        blocked on its result. Never call it on the loop: await ``migrate_replica_async``."""
        loop = FrontLoop.shared()
        if loop.on_loop():
            raise RuntimeError("migrate_replica called on the fronts' loop: await "
                               "migrate_replica_async()")
        return loop.spawn(self.migrate_replica_async(kernel_id, replica_id, target_host,
                                                     request, reason=reason)).result()

    async def migrate_replica_async(self, kernel_id: str, replica_id: int | None,
                                    target_host: str | None,
                                    request: ResourceSpec | None = None, *,
                                    reason: str = "operator") -> tuple[int, str]:
        """Replace one replica by a new one on another host; returns (new id, host).

        The old replica leaves the Raft group and stops; the new one joins and catches up.
        Raises StartError (RESOURCE_EXHAUSTED when no host can take it now). ``reason``
        (contention, scale_in, drain, operator) labels the migration in the metrics. A
        coroutine on the loop: the kernel's membership guard awaited, the decisions under the
        awaited lock, the Local Schedulers' calls in ``gs-work``, the new replica's wait to
        answer on the loop (it holds no thread)."""
        guard = self._membership_guard(kernel_id)
        try:
            try:
                await asyncio.wait_for(guard.acquire(), MIGRATION_WAIT_S)
            except TimeoutError:
                raise StartError(grpc.StatusCode.UNAVAILABLE,
                                 f"kernel {kernel_id}: another change of its replicas has run "
                                 f"for over {MIGRATION_WAIT_S:g}s; try the migration later"
                                 ) from None
            try:
                result = await self._migrate_replica(kernel_id, replica_id, target_host,
                                                     request)
            finally:
                guard.release()
        except StartError:
            self.metrics.migrations.labels(reason=reason, outcome="failed").inc()
            raise
        self.metrics.migrations.labels(reason=reason, outcome="succeeded").inc()
        return result

    def _membership_guard(self, kernel_id: str) -> asyncio.Lock:
        """The lock one change of a kernel's replicas holds (a migration, a replacement or a
        rebuild): each stops or adds a Raft member, and two at once can leave the group without
        a majority (two migrations each stopping a replica before its replacement joined left
        one of three members alive, and the membership change hung). Every holder is a
        coroutine on the fronts' loop, so it is an asyncio lock: a change waiting for another
        holds no thread; ``locked()`` may be read from any thread."""
        with self.lock:
            return self._membership_guards.setdefault(kernel_id, asyncio.Lock())

    def migration_running(self, kernel_id: str) -> bool:
        """Whether a change of the kernel's replicas holds its membership guard now."""
        return self._membership_guard(kernel_id).locked()

    def _migration_by_cycle(self, kernel, request: ResourceSpec,  # noqa: ANN001
                            replica_id: int | None) -> tuple[int, str]:
        """The migration cycle for a move no cell asked for: (the replica, its target host),
        or a ``StartError`` that says why none. Lock held."""
        snapshot, result = self._decide_migration(kernel, request, replica_id)
        self._record_cycle(snapshot, kernel.kernel_id, request, result, MIGRATION)
        if result.status is Status.SUCCESS:
            return result.replica_id, result.host_id
        code = {Status.UNSCHEDULABLE: grpc.StatusCode.RESOURCE_EXHAUSTED,
                Status.WAIT: grpc.StatusCode.UNAVAILABLE,
                Status.ERROR: grpc.StatusCode.INTERNAL}.get(
                    result.status, grpc.StatusCode.FAILED_PRECONDITION)
        raise StartError(code, result.reason)

    async def _migrate_replica(self, kernel_id: str, replica_id: int | None,
                               target_host: str | None,
                               request: ResourceSpec | None) -> tuple[int, str]:
        """The migration itself, the kernel's membership guard held (on the loop)."""
        pool = self._pool
        async with self._locked():
            entry = self.kernels.get(kernel_id)
            kernel = self.cluster.kernels.get(kernel_id)
            if entry is None or kernel is None:
                raise StartError(grpc.StatusCode.NOT_FOUND, f"no kernel {kernel_id!r}")
            short = self._short_of_replicas(entry) if len(entry.replicas) >= 2 else ""
            if short:
                raise StartError(grpc.StatusCode.FAILED_PRECONDITION, short)
            need = request or kernel.request
            if replica_id is not None and replica_id not in entry.replicas:
                raise StartError(grpc.StatusCode.NOT_FOUND,
                                 f"kernel {kernel_id} has no replica {replica_id}")
            if replica_id is None or target_host is None:
                replica_id, chosen = self._migration_by_cycle(kernel, need, replica_id)
                target_host = target_host or chosen
            elif (link := self.hosts.get(target_host)) is not None and (
                    link.draining or link.unreachable_since):
                raise StartError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"host {target_host} takes no new replica now: it is "
                                 + ("draining" if link.draining else
                                    "not answering (its Local Scheduler)"))
            victim = entry.replicas.get(replica_id)
            if victim is None:
                raise StartError(grpc.StatusCode.NOT_FOUND,
                                 f"kernel {kernel_id} has no replica {replica_id}")
            if len(entry.replicas) < 2:
                # A migration takes the replica out of its Raft group and a new one joins the
                # others: with no other member, the new one would start empty.
                raise StartError(grpc.StatusCode.FAILED_PRECONDITION, ONE_REPLICA_STAYS)
            if target_host not in self.cluster.hosts:
                raise StartError(grpc.StatusCode.NOT_FOUND, f"no host {target_host!r}")
            if any(r.host_id == target_host for r in entry.replicas.values()):
                raise StartError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"host {target_host} already holds a replica of {kernel_id}")
            if any(rid == replica_id for rid, _ in entry.executions.values()):
                raise StartError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"replica {replica_id} is executing a cell")
            victim_link = self.hosts.get(victim.host_id)
        log.info("kernel %s: migrating replica %d from %s to %s", kernel_id, replica_id,
                 victim.host_id, target_host)
        if victim_link is not None:
            try:
                await pool.run(victim_link.stub.PrepareReplicaToMigrate,
                               local_scheduler_pb2.PrepareReplicaToMigrateRequest(
                                   kernel_id=kernel_id, replica_id=replica_id, timeout_s=10),
                               timeout=15)
            except grpc.RpcError as exc:
                log.info("prepare-to-migrate of %s/%d: %s", kernel_id, replica_id,
                         exc.details())
        async with self._locked():  # out of the group first (one membership change at a time)
            entry.replicas.pop(replica_id, None)
            entry.raft_removals.append(replica_id)
            entry.removal_addresses[replica_id] = victim.raft_address
            if replica_id in kernel.replicas:
                self.cluster.remove_replica(kernel_id, replica_id)
            if entry.front is not None:
                entry.front.set_replicas(entry.endpoints())
        t0 = time.monotonic()
        await pool.run(self._stop_replica_quietly, victim.host_id, kernel_id, replica_id)
        t1 = time.monotonic()
        try:
            new_ids = await self._add_replicas(kernel_id, 1, join=True, on_host=target_host)
        except StartError:
            self._restore_replica_count(kernel_id)  # on the loop
            raise
        log.info("kernel %s: replica %d replaced by %d on %s (stop %.2fs, start+join %.2fs)",
                 kernel_id, replica_id, new_ids[0], target_host, t1 - t0, time.monotonic() - t1)
        self.metrics.placement.labels(operation="migration").observe(time.monotonic() - t0)
        await pool.run(self._rebind_session_gpus, kernel_id, new_ids)
        return new_ids[0], target_host

    def _short_of_replicas(self, entry: KernelEntry) -> str:
        """Why a replica of the kernel cannot be moved now, or "": a lost one is still being
        replaced (stopping another would leave the group without a Raft majority). Lock held."""
        if entry.raft_removals or len(entry.replicas) < self.replicas_per_kernel:
            return (f"kernel {entry.kernel_id} has {len(entry.replicas)} of its "
                    f"{self.replicas_per_kernel} replicas (a lost one is being replaced): moving "
                    "another now would leave its Raft group without a majority; it can move "
                    "once the replacement has joined")
        return ""

    def _remove_lost_members(self, entry: KernelEntry, members: list[ReplicaEndpoint]) -> None:
        """Take lost replicas out of the Raft group, one at a time, before adding others; asks
        each live member in turn. Raises StartError (the caller retries later) when no member
        could commit the change."""
        for rid in list(entry.raft_removals):
            content: dict = {"replica_id": rid}
            address = entry.removal_addresses.get(rid)
            if address:  # a member may not know it yet (it never finished joining)
                content["raft_address"] = address
            self._membership_change(entry, members, "remove_replica_request", content)
            with self.lock:
                if rid in entry.raft_removals:
                    entry.raft_removals.remove(rid)
                entry.removal_addresses.pop(rid, None)
                self._save_kernel(entry)

    def _change_hopeless(self, entry: KernelEntry,
                         member: ReplicaEndpoint) -> Callable[[], str | None]:
        """Why a membership change asked of ``member`` can no longer commit, or None: the
        member was lost, or so many replicas were that the group has no Raft majority (a
        second fault while a replacement joins). Waiting the full timeout then only delays
        the rebuild from the checkpoint by 30 s per member asked."""
        def hopeless() -> str | None:
            with self.lock:
                if member.replica_id not in entry.replicas:
                    return f"replica {member.replica_id} was lost"
                if len(entry.replicas) * 2 <= self.replicas_per_kernel:
                    return "the group lost its Raft majority"
            return None
        return hopeless

    def _membership_change(self, entry: KernelEntry, members: list[ReplicaEndpoint],
                           msg_type: str, content: dict) -> None:
        reasons = []
        for member in members:
            try:
                control_request(member, entry.key, entry.signature_scheme, msg_type, content,
                                timeout_s=30, give_up=self._change_hopeless(entry, member))
                return
            except ControlError as exc:
                reasons.append(str(exc))
                log.warning("kernel %s: %s %s via replica %d failed: %s", entry.kernel_id,
                            msg_type, content, member.replica_id, exc)
        raise StartError(grpc.StatusCode.UNAVAILABLE,
                         f"kernel {entry.kernel_id}: {msg_type} {content} failed: "
                         + "; ".join(reasons))



def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
