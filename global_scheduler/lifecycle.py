"""A kernel's life cycle as the gRPC API drives it: start (replicas, front, session GPUs),
stop, interrupt, restart, and moving a replica on request. Mixed into
``GlobalSchedulerService``.

Every handler here is a coroutine on the loop (issue 32): the request checked on the loop, a
decision under the lock, awaited (``_locked``: state_lock.py; nothing awaited inside), and the
blocking parts (Local Scheduler calls, replica starts waited for, front sockets bound) as
effects awaited in the ``gs-work`` pool (``_pool.run``), run to their end whoever waits
(``_run_to_end``). A start behind its front starts its replicas in a task on the loop once the
answer is sent (``_finish_start``); a start or restart waits for its replicas to answer on
the loop (``_add_replicas``: readiness.ready); a restart awaits the kernel's changes
(``_kernels_changed.signal``) to wait out a start, wake or hibernation; a wake runs in a task
on the loop (hibernation.py: ``_wake``), and so does a migration (recovery.py:
``migrate_replica_async``). A kernel's recovery and membership guards are asyncio locks on
the loop: a restart waiting for a recovery holds no thread."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from typing import Any

import grpc

from notebookos.cluster import AccountingError
from notebookos.global_scheduler import background
from notebookos.global_scheduler.errors import StartError
from notebookos.global_scheduler.front import KernelFront
from notebookos.global_scheduler.kernels import KernelEntry
from notebookos.global_scheduler.limits import (
    FDS_PER_OPEN_KERNEL,
    kernels_room,
    open_file_limit,
    out_of_files,
)
from notebookos.kernel_hints import InvalidHints, KernelHints
from notebookos.proto import global_scheduler_pb2, local_scheduler_pb2
from notebookos.proto.convert import resource_spec_from_proto
from notebookos.resources import InvalidResourceSpec, ResourceSpec

log = logging.getLogger(__name__)

SUPPORTED_SCHEMES = ("hmac-sha256", "hmac-sha512", "hmac-sha1", "hmac-md5")
# The kernel's incarnation in its replicas' environment (kernel/replica.py: ``incarnation``):
# raised by each restart; checkpoints are fenced with (incarnation, execution_count).
INCARNATION_ENV = "NOTEBOOKOS_INCARNATION"
# States a restart waits out (its replicas are changing), at most RESTART_WAIT_S
RESTART_WAITS = ("starting", "hibernating", "waking")
RESTART_WAIT_S = 60.0
# How long a start behind its front waits for its answer to be sent before its replicas start
# anyway (gRPC ends the call at once after the answer; this only bounds a call that never ends)
ANSWER_WAIT_S = 10.0


class KernelLifecycleMixin:
    async def StartKernel(self, request, context):  # noqa: N802
        """On the loop (grpc_loop.py): the request checked here, the admission (ALREADY_EXISTS,
        RESOURCE_EXHAUSTED, the kernel entered in the state) under the lock, awaited, and the
        blocking steps (the replicas' hosts chosen, replicas started, the session's GPUs
        bound, the front's sockets bound) awaited in the ``gs-work`` pool; run to its end
        whoever waits, as StopKernel. A kernel started behind its front
        (``return_when_bound``) starts its replicas in a task on the loop once this answer is
        sent (``_finish_start``)."""
        parsed = _parse_start(request)
        if isinstance(parsed, tuple):
            await context.abort(*parsed)
        scheme, spec, hints = parsed.scheme, parsed.spec, parsed.hints
        # The replicas start once this answer is sent (gRPC calls the done callback when the
        # call ends): their start would otherwise take the interpreter from this answer.
        answered = asyncio.get_running_loop().create_future()
        context.add_done_callback(lambda _: _settle(answered))
        try:
            entry = await self._run_to_end(self.start_kernel(
                request.kernel_id, spec, request.key, scheme, request.kernel_name,
                dict(request.env), return_when_bound=request.return_when_bound, hints=hints,
                answered=answered))
        except StartError as exc:
            await context.abort(exc.code, str(exc))
        except asyncio.CancelledError:
            _settle(answered)  # the client went away: no answer to wait for
            raise
        async with self._locked():
            status = self._kernel_status(entry, with_key=False)
        connection = self._connection(entry, with_key=True)
        return global_scheduler_pb2.StartKernelResponse(connection=connection, status=status)

    async def start_kernel(self, kernel_id: str, spec: ResourceSpec, key: str, scheme: str,
                           kernel_name: str = "", env: dict[str, str] | None = None, *,
                           return_when_bound: bool = False,
                           hints: KernelHints | None = None,
                           answered: Awaitable[None] | None = None,
                           ) -> KernelEntry:
        """Start a kernel (on the loop); with ``return_when_bound`` (replica-per-host
        policies), return once its replicas' hosts are chosen and its front is bound: the
        replicas start behind it (``_finish_start``, a task on the loop) while it holds the
        client's requests, once ``answered`` is done (the caller has its answer), or at once.
        Raises StartError."""
        async with self._locked():
            if kernel_id in self.kernels:
                raise StartError(grpc.StatusCode.ALREADY_EXISTS,
                                 f"kernel {kernel_id!r} is already running; stop it first")
            if 0 < self.max_kernels <= len(self.kernels):
                raise StartError(grpc.StatusCode.RESOURCE_EXHAUSTED, self._full_message())
            self.cluster.add_kernel(kernel_id, spec)
            entry = KernelEntry(kernel_id, key, scheme, kernel_name, env or {},
                                hints=hints or KernelHints())
            self.kernels[kernel_id] = entry
        started = time.monotonic()
        behind = return_when_bound and self.mode.starts_behind_front
        plan = None
        pool = self._pool
        try:
            if behind:
                # admitted: its replicas' hosts chosen (a refusal is answered now)
                plan = await pool.run(self._plan_replicas, kernel_id, self.replicas_per_kernel,
                                      join=False)
            else:
                await self._start_retrying_async(
                    kernel_id, "start", lambda: self.mode.start_containers(kernel_id))
                if self.binding.binds_at_placement:
                    await pool.run(self._bind_for_session, entry, spec)
            # bound out of the lock (its sockets, when no spare is ready: ms); it touches no
            # state the lock guards until it is the entry's and started, under the lock
            front = await pool.run(self._new_front, entry, None, behind)
        except Exception as exc:
            failure = await pool.run(self._start_failed, kernel_id, exc)
            if failure is exc:
                raise
            raise failure from exc
        async with self._locked():
            entry.front = front
            if not behind:
                entry.front.set_replicas(entry.endpoints())
            entry.front.start()
            if not behind:
                entry.state = "idle"
            self._save_kernel(entry)
        if behind:
            background.spawn(self._finish_start(entry, spec, plan, started, answered),
                             self._effects)
            return entry
        self.metrics.placement.labels(operation="kernel_start").observe(
            time.monotonic() - started)
        await pool.run(self.mode.after_start, kernel_id)
        return entry

    def _start_failed(self, kernel_id: str, exc: Exception) -> StartError:
        """A start that failed before its answer: the kernel is discarded, and the error to
        raise says why (a StartError as it was; out of open files as RESOURCE_EXHAUSTED, with
        what the operator does; anything else as INTERNAL, logged with its traceback)."""
        self._discard_kernel(kernel_id)
        if isinstance(exc, StartError):
            return exc
        if out_of_files(exc):
            log.error("kernel %s not started: %s", kernel_id, exc)
            return StartError(grpc.StatusCode.RESOURCE_EXHAUSTED, self._full_message(str(exc)))
        log.error("kernel %s failed to start", kernel_id, exc_info=exc)
        return StartError(grpc.StatusCode.INTERNAL, f"kernel {kernel_id} failed to start: {exc}")

    def _full_message(self, error: str = "") -> str:
        """Why a start was refused for the scheduler's own room, and what the operator does."""
        held = len(self.kernels)
        limit = open_file_limit()
        if error:
            why = f"it ran out of open files ({error})"
        elif limit and self.max_kernels == kernels_room(limit):
            why = (f"it holds {held} open kernels, what its open-file limit of {limit} leaves "
                   f"room for")
        else:
            why = f"it holds {held} open kernels (global_scheduler.max_kernels {self.max_kernels})"
        return (f"the Global Scheduler cannot hold another kernel: {why}. Shut down notebooks "
                f"no longer used; the operator can raise the scheduler's open-file limit "
                f"(about {FDS_PER_OPEN_KERNEL} a kernel) or global_scheduler.max_kernels")

    async def _finish_start(self, entry: KernelEntry, spec: ResourceSpec, plan: object,
                            started: float, answered: Awaitable[None] | None) -> None:
        """The replicas of a kernel whose front is bound, a task on the loop: once the start
        is answered, start them (the planned ones first; a retry places anew: in the pool)
        once a client attaches to the front or ``replicas_wait_for_client_s`` has passed,
        then let the front send what it held, or fail it with why."""
        kernel_id = entry.kernel_id
        if answered is not None:  # done when the call ended (bounded: a call that never ends)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(answered), ANSWER_WAIT_S)
        if self.replicas_wait_for_client_s > 0:
            # Jupyter Server subscribes to the kernel's IOPub ~15 ms after its StartKernel is
            # answered, as the last step of the REST create; replicas starting meanwhile on
            # the same machine take its CPU (docs/performance.md, issue 18).
            await entry.front.client_attached.wait_async(self.replicas_wait_for_client_s)
            async with self._locked():
                if self.kernels.get(kernel_id) is not entry:
                    return  # stopped meanwhile
        plans = [plan]
        try:
            await self._start_retrying_async(kernel_id, "start", lambda: self._add_replicas(
                kernel_id, self.replicas_per_kernel, join=False,
                planned=plans.pop() if plans else None))
            if self.binding.binds_at_placement:
                await self._pool.run(self._bind_for_session, entry, spec)
            async with self._locked():
                if self.kernels.get(kernel_id) is not entry:
                    return  # stopped meanwhile (StopKernel stopped the replicas)
                entry.state = "idle"
                self._save_kernel(entry)
                self._active(entry)  # the idle clock of hibernation starts
            entry.front.replicas_ready()
            self.metrics.placement.labels(operation="kernel_start").observe(
                time.monotonic() - started)
        except Exception as exc:  # noqa: BLE001 - the front must hear of any failure
            reason = str(exc) if isinstance(exc, StartError) else f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, StartError):
                log.error("kernel %s failed to start", kernel_id, exc_info=exc)
            else:
                log.warning("kernel %s: its replicas did not start: %s", kernel_id, reason)
            async with self._locked():
                current = self.kernels.get(kernel_id) is entry
                if current:
                    entry.state, entry.message = "failed", f"start failed: {reason}"
                    self._save_kernel(entry)
                replicas = list(entry.replicas.values())
            if current:  # e.g. the session GPUs could not be bound
                await asyncio.gather(*(self._pool.run(
                    self._stop_replica_quietly, r.host_id, kernel_id, r.replica_id)
                    for r in replicas))
            if entry.front is not None:
                entry.front.start_failed(reason)

    def _new_front(self, entry: KernelEntry, ports: dict[str, int] | None = None,
                   starting: bool = False) -> KernelFront:
        return self.mode.new_front(entry, ports, starting)

    def _bind_for_session(self, entry: KernelEntry, spec: ResourceSpec,
                          replica_id: int | None = None) -> None:
        """Reservation-style policies: commit the kernel's GPUs once, for its whole life, to
        ``replica_id`` (default: the lowest id; a replacement: recovery.py)."""
        rid = min(entry.replicas) if replica_id is None else replica_id
        rl = entry.replicas[rid]
        link = self.hosts[rl.host_id]
        try:
            resp = link.stub.CommitGpus(local_scheduler_pb2.CommitGpusRequest(
                kernel_id=entry.kernel_id, replica_id=rid, request_id=f"session:{entry.kernel_id}",
                gpus=spec.gpus), timeout=10)
        except grpc.RpcError as exc:
            raise StartError(grpc.StatusCode.UNAVAILABLE,
                             f"host {rl.host_id} could not bind the GPUs: {exc.details()}") from exc
        if not resp.committed:
            raise StartError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"host {rl.host_id} cannot bind {spec.gpus} GPU(s) for the "
                             f"session: {resp.reason}")
        with self.lock:
            kernel = self.cluster.kernels[entry.kernel_id]
            host = self.cluster.hosts[rl.host_id]
            try:
                host.commit(kernel.replicas[rid].owner, spec, list(resp.device_ids))
            except AccountingError as exc:
                log.warning("accounting differs from host %s: %s", rl.host_id, exc)
            kernel.executor = rid
            entry.session_gpus = (rid, rl.host_id, list(resp.device_ids))

    def _discard_kernel(self, kernel_id: str) -> None:
        with self.lock:
            entry = self._forget_kernel(kernel_id)
        if entry is not None and entry.front is not None:
            entry.front.close()

    def _forget_kernel(self, kernel_id: str) -> KernelEntry | None:
        """The kernel leaves the state and the registry (its front is the caller's to close,
        out of the lock); its entry, if it was known. Lock held."""
        entry = self.kernels.pop(kernel_id, None)
        self._recovery_guards.pop(kernel_id, None)
        self._membership_guards.pop(kernel_id, None)
        with self._placement_cv:
            self.cell_queue.kernel_gone(kernel_id)
        if kernel_id in self.cluster.kernels:
            self.cluster.remove_kernel(kernel_id)
        self.store.delete_kernel(kernel_id)
        self._kernel_changed()
        return entry

    def shutdown_requested(self, kernel_id: str) -> None:
        """A client sent the kernel a shutdown_request (Jupyter's shutdown or restart): its
        replicas exit next, on purpose. The kernel is stopping, so those exits start no
        replacement and no rebuild from the checkpoint; Jupyter's StopKernel follows (or, for a
        client that shut the kernel down alone, the provisioner reports it gone)."""
        with self.lock:
            entry = self.kernels.get(kernel_id)
            if entry is None or entry.state in ("stopping", "failed"):
                return
            log.info("kernel %s: shutdown requested by its client", kernel_id)
            entry.state = "stopping"
            entry.client_shutdown = True
            entry.message = "shutting down at its client's request"
            self._save_kernel(entry)

    async def StopKernel(self, request, context):  # noqa: N802
        """On the loop (grpc_loop.py): the decision (the kernel is stopping; which replicas
        to stop) under the lock, awaited (state_lock.py); the Local Schedulers' StopReplica
        calls in the ``gs-work`` pool, awaited; then the kernel forgotten under the lock (its
        registry record deleted by the writer, which the answer waits for) and its front
        closed. A client that leaves (or whose deadline passes) does not cut it short: it runs
        to its end, as the handler's pool thread did."""
        if not await self._run_to_end(self._stop_kernel(request.kernel_id)):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no kernel {request.kernel_id!r}")
        return global_scheduler_pb2.StopKernelResponse()

    async def _stop_kernel(self, kernel_id: str) -> bool:
        """StopKernel's decision and effects; False for a kernel not known."""
        async with self._locked():
            entry = self.kernels.get(kernel_id)
            if entry is None:
                return False
            entry.state = "stopping"
            entry.client_shutdown = False  # a stop now, whatever the client asked before
            replicas = list(entry.replicas.values())
            self._cell_cv.notify_all()  # its cells waiting for a host stop waiting
            self._kernel_changed()  # and those waiting for its replicas
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(
            self._pool, self._stop_replica_quietly, r.host_id, kernel_id, r.replica_id)
            for r in replicas))
        async with self._locked():
            entry = self._forget_kernel(kernel_id)
        if entry is not None and entry.front is not None:
            entry.front.close()  # on the loop: at once
        return True

    async def InterruptKernel(self, request, context):  # noqa: N802
        """On the loop: the decision under the lock (awaited), the cells not started yet
        withdrawn there, and the running cells' replicas interrupted by their Local Schedulers
        in the ``gs-work`` pool, awaited (one after the other, 5 s each at most, as before);
        run to its end whoever waits, as StopKernel."""
        refused, was_running = await self._run_to_end(self._interrupt_kernel(request.kernel_id))
        if refused is not None:
            await context.abort(*refused)
        return global_scheduler_pb2.InterruptKernelResponse(cell_was_running=was_running)

    async def _interrupt_kernel(self, kernel_id: str,
                                ) -> tuple[tuple[grpc.StatusCode, str] | None, bool]:
        """InterruptKernel's decision and effects: why it was refused (or None), and whether
        a cell was running or waiting."""
        async with self._locked():
            entry = self.kernels.get(kernel_id)
            if entry is None:
                return (grpc.StatusCode.NOT_FOUND, f"no kernel {kernel_id!r}"), False
            if entry.state in ("starting", "stopping"):
                return (grpc.StatusCode.FAILED_PRECONDITION,
                        f"kernel {kernel_id} is {entry.state}"), False
            running = dict(entry.executions)
            queued = self.mode.withdraw_waiting(kernel_id, entry.front)
            links = {host_id: self.hosts.get(host_id) for _, host_id in running.values()}
        if running:
            await asyncio.get_running_loop().run_in_executor(
                self._pool, self._interrupt_replicas, kernel_id, running, links)
        return None, bool(running or queued)

    def _interrupt_replicas(self, kernel_id: str, running: dict, links: dict) -> None:
        for rid, host_id in running.values():
            link = links.get(host_id)
            if link is not None:
                try:
                    link.stub.InterruptReplica(local_scheduler_pb2.InterruptReplicaRequest(
                        kernel_id=kernel_id, replica_id=rid), timeout=5)
                except grpc.RpcError as exc:
                    log.info("interrupt of %s/%d failed: %s", kernel_id, rid, exc.details())

    def _locked(self) -> contextlib.AbstractAsyncContextManager[None]:
        """``service.lock`` for a decision on the loop: awaited, never blocking the loop
        (state_lock.py); nothing may be awaited inside."""
        return self.lock.held()

    async def _run_to_end(self, effects: Awaitable[Any]) -> Any:
        """Await ``effects``; a caller that goes away (the call cancelled) does not stop them:
        they run to the end as a task of their own (its exception is the caller's, or taken
        when it went away: a refused start whose client had gone)."""
        return await asyncio.shield(background.spawn(effects, self._effects, logged=False))

    async def WakeKernel(self, request, context):  # noqa: N802
        """On the loop: the decision under the lock, awaited; the wake itself (the replicas
        started from the checkpoint) a task on the loop (``_start_wake``), not awaited."""
        async with self._locked():
            known = request.kernel_id in self.kernels
            waking = known and self._begin_wake(request.kernel_id)
        if not known:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no kernel {request.kernel_id!r}")
        if waking:
            self._start_wake(request.kernel_id)
        return global_scheduler_pb2.WakeKernelResponse(waking=waking)

    async def RestartKernel(self, request, context):  # noqa: N802
        """Fresh replicas (empty namespace) behind the same front ports: the clients' sockets
        stay connected. Also for a kernel its client has just asked to shut down for a restart
        (Jupyter sends ``shutdown_request`` with ``restart`` first), and for a hibernated one
        (it wakes empty).

        On the loop: a start, a wake or a hibernation under way is waited out by awaiting the
        kernel's changes (``_kernels_changed.signal``, fired by ``_save_kernel``); the
        decisions under the lock, awaited; the old replicas' stops, the new replicas' start
        and the session GPUs' binding awaited in the ``gs-work`` pool; run to its end whoever
        waits, as StopKernel."""
        refused, entry = await self._run_to_end(self._restart_kernel(request.kernel_id))
        if refused is not None:
            await context.abort(*refused)
        async with self._locked():
            status = self._kernel_status(entry)
        return global_scheduler_pb2.RestartKernelResponse(
            connection=self._connection(entry, with_key=True), status=status)

    async def _restart_kernel(self, kernel_id: str,
                              ) -> tuple[tuple[grpc.StatusCode, str] | None, KernelEntry | None]:
        """RestartKernel's waits, decisions and effects: why it was refused (or None), and the
        restarted kernel's entry."""
        deadline = time.monotonic() + RESTART_WAIT_S
        changed = self._kernels_changed.signal
        while True:  # a start, a wake or a hibernation under way ends first (seconds)
            woken = changed.future()  # before the look: a change after it wakes us
            async with self._locked():
                entry = self.kernels.get(kernel_id)
                if entry is None:
                    return (grpc.StatusCode.NOT_FOUND, f"no kernel {kernel_id!r}"), None
                state = entry.state
                if state not in RESTART_WAITS:
                    if state == "stopping" and not entry.client_shutdown:
                        return (grpc.StatusCode.FAILED_PRECONDITION,
                                f"kernel {kernel_id} is stopping"), None
                    guard = self._recovery_guards.setdefault(kernel_id, asyncio.Lock())
                    break
            left = deadline - time.monotonic()
            if left <= 0:
                return (grpc.StatusCode.FAILED_PRECONDITION,
                        f"kernel {kernel_id} is still {state} after {RESTART_WAIT_S:g} s"), None
            await changed.wait(woken, left)  # every change of state fires it (_save_kernel)
        async with guard:  # one recovery (or restart) of a kernel at once
            return await self._restart_guarded(entry), entry

    async def _restart_guarded(self, entry: KernelEntry) -> tuple[grpc.StatusCode, str] | None:
        """The restart itself, the kernel's recovery guard held: why it failed, or None."""
        kernel_id = entry.kernel_id
        async with self._locked():
            if entry.state in RESTART_WAITS or (entry.state == "stopping"
                                                and not entry.client_shutdown):
                # a wake or a stop began since (rare): the client may ask again
                return grpc.StatusCode.FAILED_PRECONDITION, f"kernel {kernel_id} is {entry.state}"
            old = list(entry.replicas.values())
            entry.state = "starting"
            entry.client_shutdown = False
            entry.hibernated_unix = 0.0
            entry.wake_error = ""
            kernel = self.cluster.kernels[kernel_id]
            for r in old:
                entry.replicas.pop(r.replica_id, None)
                if r.replica_id in kernel.replicas:
                    self.cluster.remove_replica(kernel_id, r.replica_id)
            entry.raft_removals.clear()
            entry.removal_addresses.clear()
            entry.executions.clear()
            with self._placement_cv:
                self.cell_queue.kernel_gone(kernel_id)
            entry.session_gpus = None
            entry.checkpoint_count = 0  # per-cell containers: the next cell starts empty
            entry.lost_cells.clear()
            # a new incarnation: its checkpoints, counting from cell 1 again, are fenced
            # above the old one's, and the old replicas' late writes are refused (issue 34)
            entry.env = {**entry.env, INCARNATION_ENV: str(_incarnation(entry.env) + 1)}
            kernel.executor = None
            if entry.front is not None:
                entry.front.set_replicas([])
        pool = self._pool
        await asyncio.gather(*(pool.run(self._stop_replica_quietly, r.host_id, kernel_id,
                                        r.replica_id) for r in old))
        await pool.run(self._finish_pending_stops, entry)  # a hibernated kernel's, first
        try:
            await self.mode.start_containers(kernel_id)
            if self.binding.binds_at_placement:
                await pool.run(self._bind_for_session, entry, kernel.request)
        except StartError as exc:
            async with self._locked():
                entry.state, entry.message = "failed", f"restart failed: {exc}"
                self._save_kernel(entry)
            return exc.code, str(exc)
        async with self._locked():
            entry.state, entry.message = "idle", ""
            self._save_kernel(entry)
            self._active(entry)
        await pool.run(self.mode.after_start, kernel_id)
        return None

    async def MigrateReplica(self, request, context):  # noqa: N802
        """On the loop: the request checked here; the migration (recovery.migrate_replica_async:
        its kernel's membership guard, which another change of its replicas may hold for
        seconds, awaited; the decision under the awaited lock; the
        Local Schedulers' calls in ``gs-work``; the new replica's wait on the loop) run to
        its end whoever waits; the answer's status under the lock, awaited."""
        if not request.kernel_id or request.replica_id < 1:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "MigrateReplicaRequest needs kernel_id and replica_id >= 1")
        try:
            rid, host_id = await self._run_to_end(self.migrate_replica_async(
                request.kernel_id, request.replica_id, request.target_host_id or None))
        except StartError as exc:
            await context.abort(exc.code, str(exc))
        async with self._locked():
            entry = self.kernels.get(request.kernel_id)
            status = self._kernel_status(entry) if entry is not None else None
        if status is None:  # stopped since (the synchronous handler raised: UNKNOWN)
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"kernel {request.kernel_id} was stopped after its migration")
        replica = next((r for r in status.replicas if r.replica_id == rid), None)
        return global_scheduler_pb2.MigrateReplicaResponse(target_host_id=host_id,
                                                           replica=replica)

def _incarnation(env: dict[str, str]) -> int:
    """The kernel's incarnation, as its replicas' environment says (0 before any restart)."""
    try:
        return max(0, int(env.get(INCARNATION_ENV) or 0))
    except ValueError:
        return 0


class _StartRequest:
    """A StartKernelRequest's checked parts."""

    def __init__(self, scheme: str, spec: ResourceSpec, hints: KernelHints) -> None:
        self.scheme, self.spec, self.hints = scheme, spec, hints


def _parse_start(request: Any) -> _StartRequest | tuple[grpc.StatusCode, str]:
    """The request's checked parts, or why it is refused (INVALID_ARGUMENT, and what)."""
    def bad(msg: str) -> tuple[grpc.StatusCode, str]:
        return grpc.StatusCode.INVALID_ARGUMENT, f"StartKernelRequest.{msg}"

    if not request.kernel_id:
        return bad("kernel_id must not be empty")
    if not request.key:
        return bad("key must not be empty (the kernel's HMAC key)")
    scheme = request.signature_scheme or "hmac-sha256"
    if scheme not in SUPPORTED_SCHEMES:
        return bad(f"signature_scheme={scheme!r} is not supported; use one of "
                   f"{SUPPORTED_SCHEMES}")
    if request.hints.replicas < 0:
        return bad(f"hints.replicas={request.hints.replicas} must be >= 0")
    try:
        spec = resource_spec_from_proto(request.resources, "StartKernelRequest.resources")
    except InvalidResourceSpec as exc:
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    try:
        hints = KernelHints.from_map(request.hints.extra)
    except InvalidHints as exc:
        return bad(str(exc))
    return _StartRequest(scheme, spec, hints)


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
