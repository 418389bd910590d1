"""What ``GetKernelStatus``, ``ListKernels`` and ``GetClusterStatus`` answer, built from the
Global Scheduler's registry under its lock. Mixed into ``GlobalSchedulerService``.

The three are coroutines on the loop (issue 32) that never block it on ``service.lock``
(``_read_state``): with the lock free they read under it at once; while another thread holds
it they answer from the status board, an immutable ``StatusBoard`` made on the loop at a
version of the lock, if no change was let go since (a linearizable answer: the holder's
changes are not done), or else await the lock's release without holding a thread. The board
is made by each cluster-wide query and, while such queries come, again after changes
(coalesced, at most ``BOARD_DUTY`` of the loop): a dashboard polling during a long hold is
answered at once. Only the loop writes the board.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from notebookos.cluster import ReplicaState
from notebookos.global_scheduler.kernels import KernelEntry
from notebookos.metrics import ClusterSnapshot
from notebookos.proto import common_pb2, global_scheduler_pb2
from notebookos.proto.convert import resource_spec_to_proto

KERNEL_STATES = {
    "starting": common_pb2.KERNEL_STATE_STARTING, "idle": common_pb2.KERNEL_STATE_IDLE,
    "busy": common_pb2.KERNEL_STATE_BUSY, "degraded": common_pb2.KERNEL_STATE_DEGRADED,
    "stopping": common_pb2.KERNEL_STATE_STOPPING, "failed": common_pb2.KERNEL_STATE_FAILED,
    "recovering": common_pb2.KERNEL_STATE_RECOVERING, "parked": common_pb2.KERNEL_STATE_PARKED,
    "hibernating": common_pb2.KERNEL_STATE_HIBERNATING,
    "hibernated": common_pb2.KERNEL_STATE_HIBERNATED, "waking": common_pb2.KERNEL_STATE_WAKING,
}
T = TypeVar("T")
# A cluster-wide query (GetClusterStatus, ListKernels: a dashboard, ``notebookos status``)
# keeps the status board fresh for this long after it ...
BOARD_WATCH_S = 10.0
# ... spending at most this share of the loop's time making it again
BOARD_DUTY = 0.05
REPLICA_STATES = {
    ReplicaState.STARTING: common_pb2.REPLICA_STATE_STARTING,
    ReplicaState.RUNNING: common_pb2.REPLICA_STATE_IDLE,
    ReplicaState.MIGRATING: common_pb2.REPLICA_STATE_MIGRATING,
    ReplicaState.STOPPED: common_pb2.REPLICA_STATE_STOPPED,
    ReplicaState.DEAD: common_pb2.REPLICA_STATE_DEAD,
}


@dataclass(frozen=True)
class StatusBoard:
    """The cluster's status as of one version of the lock (``state_lock.StateLock.version``):
    made on the loop under the lock, read on the loop without it. Never changed once made."""

    version: int
    hosts: list[common_pb2.HostStatus]
    kernels: dict[str, common_pb2.KernelStatus]
    fields: dict[str, Any]  # the rest of a ClusterStatus


class StatusMixin:
    # set by the service's __init__ (_init_status)
    _board: StatusBoard | None
    _status_loop: asyncio.AbstractEventLoop | None

    def _init_status(self) -> None:
        self._board = None  # the last status board (written on the loop only)
        self._status_loop = None  # the loop the queries run on (set by the first)
        self._board_watched_until = 0.0  # monotonic; kept fresh until then
        self._board_refresh_pending = False
        self._board_not_before = 0.0  # monotonic; the next refresh's earliest start
        self.board_refreshes = 0  # boards made after a release (tests, benchmarks)
        self.lock.on_release = self._board_released

    def _connection(self, entry: KernelEntry, with_key: bool) -> common_pb2.ConnectionInfo:
        ports = entry.front.ports if entry.front else {}
        return common_pb2.ConnectionInfo(
            ip=self.ip, transport="tcp", key=entry.key if with_key else "",
            signature_scheme=entry.signature_scheme, **ports)

    def _kernel_status(self, entry: KernelEntry, with_key: bool = False) -> common_pb2.KernelStatus:
        kernel = self.cluster.kernels.get(entry.kernel_id)
        replicas = []
        executing = {rid for rid, _ in entry.executions.values()}
        if kernel is not None:
            for rid, replica in sorted(kernel.replicas.items()):
                rl = entry.replicas.get(rid)
                state = REPLICA_STATES.get(replica.state, common_pb2.REPLICA_STATE_UNSPECIFIED)
                if rid in executing:
                    state = common_pb2.REPLICA_STATE_EXECUTING
                replicas.append(common_pb2.ReplicaStatus(
                    kernel_id=entry.kernel_id, replica_id=rid, host_id=replica.host_id,
                    pid=rl.pid if rl else 0, state=state, executor=kernel.executor == rid,
                    raft_address=rl.raft_address if rl else "",
                    resources=resource_spec_to_proto(kernel.request),
                    last_cell_gpu_device_ids=entry.last_cell_gpus.get(rid, []),
                    last_interactivity_delay_ms=entry.last_interactivity_ms.get(rid, 0.0)))
        queued = self.mode.queued_cells(entry.kernel_id)
        state = entry.state
        if state in ("idle", "parked") and (entry.executions or queued):
            state = "busy"
        return common_pb2.KernelStatus(
            kernel_id=entry.kernel_id, state=KERNEL_STATES.get(state, 0),
            resources=resource_spec_to_proto(kernel.request) if kernel else None,
            replicas=replicas, executor_replica_id=(kernel.executor or 0) if kernel else 0,
            connection=self._connection(entry, with_key),
            message=self._message_with_hosts(entry),
            created_unix=entry.created_unix,
            dropped_messages=(entry.front.bad_signatures + entry.front.malformed)
            if entry.front else 0,
            last_interactivity_delay_ms=entry.kernel_interactivity_ms,
            last_container_start_ms=entry.last_container_start_ms,
            last_cell_pid=entry.last_cell_pid,
            last_cell_from_prewarm_pool=entry.last_cell_from_prewarm_pool,
            queued_cells=queued, **self._gpu_time(entry, kernel))

    def _message_with_hosts(self, entry: KernelEntry) -> str:
        """The kernel's message, and a word on each of its replicas' hosts whose Local
        Scheduler does not answer (its replica runs on; the daemon takes it back on restart)."""
        notes = []
        now = time.time()
        for rid, rl in sorted(entry.replicas.items()):
            link = self.hosts.get(rl.host_id)
            if link is not None and link.unreachable_since:
                notes.append(f"the Local Scheduler of host {rl.host_id} does not answer (for "
                             f"{now - link.unreachable_since:.1f} s); replica {rid} runs on "
                             "there and is taken back when it restarts")
        return "; ".join(([entry.message] if entry.message else []) + notes)

    @staticmethod
    def _gpu_time(entry: KernelEntry, kernel) -> dict[str, float]:  # noqa: ANN001
        """GPU-seconds the kernel's cells held (running ones so far) and what a reservation of
        its GPUs since it started would have held."""
        gpus = kernel.request.gpus if kernel is not None else 0
        reserved = gpus * max(0.0, time.time() - entry.created_unix)
        if entry.session_gpus is not None:  # bound for the kernel's life: used = reserved
            return {"gpu_seconds_used": reserved, "gpu_seconds_reserved": reserved}
        now = time.monotonic()
        running = sum(n * (now - t) for t, n in entry.gpu_commits.values())
        return {"gpu_seconds_used": entry.gpu_seconds + running,
                "gpu_seconds_reserved": reserved}

    # -- the queries, on the loop ----------------------------------------------------------

    async def GetKernelStatus(self, request, context):  # noqa: N802
        """On the loop (grpc_loop.py), answered without blocking it (``_read_state``)."""
        kernel_id = request.kernel_id

        def build() -> common_pb2.KernelStatus | None:
            entry = self.kernels.get(kernel_id)
            return self._kernel_status(entry) if entry is not None else None

        status = await self._read_state(build, lambda board: board.kernels.get(kernel_id))
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no kernel {kernel_id!r}")
        return status

    async def ListKernels(self, request, context):  # noqa: N802
        board = await self._read_state(self._publish_board, lambda board: board, watch=True)
        return global_scheduler_pb2.ListKernelsResponse(kernels=board.kernels.values())

    async def GetClusterStatus(self, request, context):  # noqa: N802
        if request.kernel_id:  # one kernel's view: O(hosts), on the loop
            kernel_id = request.kernel_id

            def build() -> global_scheduler_pb2.ClusterStatus:
                entry = self.kernels.get(kernel_id)
                return global_scheduler_pb2.ClusterStatus(
                    hosts=self._host_statuses(),
                    kernels=[self._kernel_status(entry)] if entry is not None else [],
                    **self._cluster_fields())

            def from_board(board: StatusBoard) -> global_scheduler_pb2.ClusterStatus:
                status = board.kernels.get(kernel_id)
                return global_scheduler_pb2.ClusterStatus(
                    hosts=board.hosts, kernels=[status] if status is not None else [],
                    **board.fields)

            return await self._read_state(build, from_board)
        board = await self._read_state(self._publish_board, lambda board: board, watch=True)
        return global_scheduler_pb2.ClusterStatus(
            hosts=board.hosts, kernels=board.kernels.values(), **board.fields)

    async def _read_state(self, build: Callable[[], T], from_board: Callable[[StatusBoard], T],
                          watch: bool = False) -> T:
        """What ``build`` reads under the lock, on the loop and never blocking it: the lock free,
        ``build`` runs at once (a short read, as a heartbeat's); held by another thread, the
        answer comes from the status board if nothing was let go since it was made (its state
        is then the latest completed one: the holder's changes are still in progress), else
        the coroutine awaits the lock's release (no thread waits) and builds. ``watch``: a
        cluster-wide query, which keeps the board fresh for a while (``_board_released``)."""
        lock = self.lock
        if watch:
            self._status_loop = asyncio.get_running_loop()
            self._board_watched_until = time.monotonic() + BOARD_WATCH_S
            board = self._board
            if board is not None and board.version == lock.version:
                return from_board(board)  # nothing let go since it was made
            # a whole board costs 30-40 us a kernel (42 ms at 1,000): made in the gs-work
            # pool, under the lock there, so the loop and every front go on meanwhile
            return from_board(await self._status_loop.run_in_executor(
                self._pool, self._locked_board))
        if lock.acquire(blocking=False):
            try:
                return build()
            finally:
                lock.release_read()
        board = self._board
        if board is not None and board.version == lock.version:
            return from_board(board)
        await lock.acquire_async()
        try:
            return build()
        finally:
            lock.release_read()

    def _locked_board(self) -> StatusBoard:
        """In a pool thread: the board, made under the lock."""
        self.lock.acquire()
        try:
            return self._publish_board()
        finally:
            self.lock.release_read()

    def _publish_board(self) -> StatusBoard:
        """The cluster's status as of the lock's current version, kept as the board. Lock held."""
        board = StatusBoard(self.lock.version, self._host_statuses(),
                            {k: self._kernel_status(e) for k, e in self.kernels.items()},
                            self._cluster_fields())
        self._board = board
        return board

    def _host_statuses(self) -> list[common_pb2.HostStatus]:
        """Every host's status. Lock held."""
        hosts = []
        for host_id, host in self.cluster.hosts.items():
            link = self.hosts[host_id]
            shared = self.shared_devices(host_id)
            hosts.append(common_pb2.HostStatus(
                host_id=host_id, address=link.address,
                capacity=resource_spec_to_proto(host.capacity),
                subscribed=resource_spec_to_proto(host.subscribed),
                gpus=[common_pb2.GpuDevice(**g, shared_by=shared.get(g["device_id"], []))
                      for g in link.gpus],
                virtual_gpus=link.virtual_gpus, gpus_committed=host.committed.gpus,
                gpus_pending=host.pending.gpus,
                subscription_ratio=host.subscription_ratio(self.replicas_per_kernel),
                prewarm_pool_size=link.prewarm_pool_size,
                last_heartbeat_unix=link.last_heartbeat, draining=link.draining,
                metrics_address=link.metrics_address,
                unreachable_since_unix=link.unreachable_since))
        return hosts

    def _cluster_fields(self) -> dict[str, Any]:
        """A ClusterStatus's fields other than its hosts and kernels. Lock held."""
        limit = getattr(self.policy, "subscription_ratio_limit", 0.0)
        return dict(
            policy=self.policy.name, replicas_per_kernel=self.replicas_per_kernel,
            subscription_ratio_limit=float(limit or 0.0),
            gpus_total=self.cluster.total_gpus, gpus_committed=self.cluster.committed_gpus,
            gpus_pending=sum(h.pending.gpus for h in self.cluster.hosts.values()),
            scheduler_instance_id=self.instance_id, metrics_address=self.metrics_address)

    def _board_released(self) -> None:
        """The lock was let go after a change (any thread): while a cluster-wide query was
        made in the last BOARD_WATCH_S, the loop makes the board again (once for any number
        of releases meanwhile), so that a query during a long hold finds it current."""
        if self._board_refresh_pending or time.monotonic() > self._board_watched_until:
            return
        loop = self._status_loop
        if loop is None or loop.is_closed():
            return
        self._board_refresh_pending = True
        try:
            if asyncio._get_running_loop() is loop:  # noqa: SLF001 - on the loop: no self-pipe
                loop.call_soon(self._refresh_board)
            else:
                loop.call_soon_threadsafe(self._refresh_board)
        except RuntimeError:  # the loop closed meanwhile
            self._board_refresh_pending = False

    def _refresh_board(self) -> None:
        """On the loop: have the board made again in the gs-work pool (not on the loop: 42 ms
        at 1,000 kernels), at most BOARD_DUTY of the time."""
        now = time.monotonic()
        if now < self._board_not_before:
            self._status_loop.call_later(self._board_not_before - now, self._refresh_board)
            return
        self._board_refresh_pending = False
        board = self._board
        if board is not None and board.version == self.lock.version:
            return
        self._pool.submit(self._refresh_board_now)

    def _refresh_board_now(self) -> None:
        """In a pool thread: the board made again if the lock is free (else the next release
        asks again)."""
        if not self.lock.acquire(blocking=False):
            return
        started = time.monotonic()
        try:
            self._publish_board()
        finally:
            self.lock.release_read()
        took = time.monotonic() - started
        self._board_not_before = started + took / BOARD_DUTY
        self.board_refreshes += 1

    # -- Prometheus ---------------------------------------------------------------------------

    def metrics_snapshot(self) -> ClusterSnapshot:
        """The cluster gauges of ``notebookos.metrics``, read at each scrape."""
        with self.lock:
            hosts = {"active": 0, "draining": 0}
            for link in self.hosts.values():
                hosts["draining" if link.draining else "active"] += 1
            kernels: dict[str, int] = {}
            queued = 0
            for entry in self.kernels.values():
                waiting = self.mode.queued_cells(entry.kernel_id)
                queued += waiting
                state = entry.state
                if state in ("idle", "parked") and (entry.executions or waiting):
                    state = "busy"
                kernels[state] = kernels.get(state, 0) + 1
            cluster = self.cluster
            limit = getattr(self.policy, "subscription_ratio_limit", 0.0)
            return ClusterSnapshot(
                hosts=hosts, kernels=kernels, gpus_total=cluster.total_gpus,
                gpus_committed=cluster.committed_gpus,
                gpus_pending=sum(h.pending.gpus for h in cluster.hosts.values()),
                gpus_subscribed=float(cluster.subscribed_gpus),
                replicas_per_kernel=self.replicas_per_kernel,
                subscription_ratio_limit=float(limit or 0.0),
                prewarm_pool_size=sum(link.prewarm_pool_size for link in self.hosts.values()),
                prewarm_pool_target=sum(link.prewarm_pool_target
                                        for link in self.hosts.values()),
                queued_cells=queued,
                replicas=sum(len(k.replicas) for k in cluster.kernels.values()))

    def service_discovery(self) -> list[dict]:
        """Prometheus HTTP service discovery (``http_sd_configs``): one target group per
        daemon serving ``/metrics``, so one scrape configuration follows hosts that come and go.
        """
        groups = []
        if self.metrics_address:
            groups.append({"targets": [self.metrics_address],
                           "labels": {"notebookos_role": "global_scheduler"}})
        with self.lock:
            for host_id, link in sorted(self.hosts.items()):
                if link.metrics_address:
                    groups.append({"targets": [link.metrics_address],
                                   "labels": {"notebookos_role": "local_scheduler",
                                              "host_id": host_id}})
        return groups
