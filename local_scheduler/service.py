"""The LocalScheduler gRPC service: the replicas of one host, their GPUs, the prewarm pool."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from notebookos.local_scheduler.binding import GpuBinder
from notebookos.local_scheduler.gpus import Gpu
from notebookos.local_scheduler.launcher import (
    LaunchedReplica,
    Launcher,
    ReplicaSpec,
    replica_source,
)
from notebookos.local_scheduler.prewarm import PrewarmPool
from notebookos.local_scheduler.ready_watch import ReadyWatcher
from notebookos.local_scheduler.sharing import replica_environment
from notebookos.metrics import HostSnapshot, LocalSchedulerMetrics
from notebookos.ports import free_ports
from notebookos.proto import common_pb2, global_scheduler_pb2, local_scheduler_pb2
from notebookos.proto import local_scheduler_pb2_grpc as ls_grpc
from notebookos.proto.convert import resource_spec_from_proto, resource_spec_to_proto
from notebookos.resources import InvalidResourceSpec, ResourceSpec

log = logging.getLogger(__name__)

# WatchHost calls held at once (each holds a server thread): the Global Scheduler needs one,
# and one more while a restarted instance takes over
MAX_HELD_WATCHES = 4

RS = common_pb2.ReplicaState
SUPPORTED_SCHEMES = ("hmac-sha256", "hmac-sha512", "hmac-sha1", "hmac-md5")
# Prewarmed processes a host keeps ready: an order for more is refused, whoever sends it.
MAX_PREWARM_POOL = 64
RUNNING_STATES = (RS.REPLICA_STATE_IDLE, RS.REPLICA_STATE_EXECUTING, RS.REPLICA_STATE_STANDBY,
                  RS.REPLICA_STATE_MIGRATING)


@dataclass
class ReplicaEntry:
    launched: LaunchedReplica
    resources: ResourceSpec
    state: int = RS.REPLICA_STATE_STARTING
    stopping: bool = False
    last_cell_device_ids: list[int] = field(default_factory=list)
    launched_at: float = field(default_factory=time.monotonic)
    gone: threading.Event = field(default_factory=threading.Event)  # no longer listed

    @property
    def spec(self) -> ReplicaSpec:
        return self.launched.spec


@dataclass(frozen=True)
class HostInfo:
    host_id: str
    address: str
    millicpus: int
    memory_mb: int
    gpus: list[Gpu]
    virtual_gpus: bool
    metrics_address: str = ""  # host:port of this LS's Prometheus /metrics; empty: none

    @property
    def capacity(self) -> ResourceSpec:
        vram = max((g.vram_gb for g in self.gpus), default=0.0)
        return ResourceSpec(self.millicpus, self.memory_mb, len(self.gpus), vram)


EventSink = Callable[[global_scheduler_pb2.ReplicaEvent], None]


class LocalSchedulerService(ls_grpc.LocalSchedulerServicer):
    def __init__(
        self,
        host: HostInfo,
        launcher_factory: Callable[[Callable[[LaunchedReplica, int], None]], Launcher],
        pool: PrewarmPool,
        report_event: EventSink,
        *,
        stop_grace_period_s: float = 5.0,
        ready_timeout_s: float = 120.0,
        on_shutdown: Callable[[str], None] | None = None,
        metrics: LocalSchedulerMetrics | None = None,
        mps_percentage: int | None = None,
    ) -> None:
        """``mps_percentage``: this host runs MPS; replicas of kernels that may share a GPU
        start capped at this share of its SMs (None: no MPS, no cap)."""
        self.host = host
        self.sharing_env = replica_environment(mps_percentage)
        self.metrics = metrics or LocalSchedulerMetrics(self.metrics_snapshot,
                                                        host_id=host.host_id)
        self.launcher = launcher_factory(self._replica_exited)
        self.pool = pool
        self.binder = GpuBinder([g.device_id for g in host.gpus])
        self.report_event = report_event
        self.stop_grace_period_s = stop_grace_period_s
        self.ready_timeout_s = ready_timeout_s
        self.on_shutdown = on_shutdown
        self.draining = False
        # held WatchHost calls (the Global Scheduler's), oldest first
        self._watchers: dict[threading.Event, None] = {}
        self._watchers_released = False
        self.registered = False
        self.instance_id = ""
        self._replicas: dict[tuple[str, int], ReplicaEntry] = {}
        self._lock = threading.RLock()
        # one loop for every start in progress: the launcher's, which learns of the exits
        self._ready_watch = ReadyWatcher(loop=self.launcher.events_loop)
        self._recover()

    def _recover(self) -> None:
        """Take back the replicas a previous run of this Local Scheduler left running (replica
        containers and processes outlive a crashed Local Scheduler: launcher.recover)."""
        # Under the lock: the launcher watches each replica as it takes it back, and one that
        # dies at that moment is reported at once, on the watcher's thread; its exit must find
        # its entry (the fault campaign found a replica killed while its Local Scheduler was
        # down reported before its entry existed: dropped, and counted live for good).
        with self._lock:
            for launched, resources in self.launcher.recover():
                entry = ReplicaEntry(launched, resources, state=RS.REPLICA_STATE_IDLE)
                self._replicas[(launched.spec.kernel_id, launched.spec.replica_id)] = entry
                log.info("recovered replica %s (pid %d) from a previous run",
                         launched.spec.owner, launched.pid)

    # -- views ------------------------------------------------------------------------------

    def replica_statuses(self) -> list[common_pb2.ReplicaStatus]:
        with self._lock:
            entries = list(self._replicas.values())
        return [self._status_of(e) for e in entries]

    def _status_of(self, e: ReplicaEntry) -> common_pb2.ReplicaStatus:
        return common_pb2.ReplicaStatus(
            kernel_id=e.spec.kernel_id, replica_id=e.spec.replica_id, host_id=self.host.host_id,
            pid=e.launched.pid, state=e.state, raft_address=e.launched.raft_address,
            resources=resource_spec_to_proto(e.resources),
            last_cell_gpu_device_ids=e.last_cell_device_ids,
            committed_gpu_device_ids=self.binder.committed_to(e.spec.owner),
        )

    def subscribed(self) -> ResourceSpec:
        with self._lock:
            total = ResourceSpec()
            for e in self._replicas.values():
                total = total + e.resources
            return total

    def host_status(self) -> common_pb2.HostStatus:
        h = self.host
        target, ready, _, _ = self.pool.status()
        sub = self.subscribed()
        shared = self.binder.shared_devices()
        sr = sub.gpus / (h.capacity.gpus * 3) if h.capacity.gpus else 0.0
        return common_pb2.HostStatus(
            host_id=h.host_id, address=h.address, capacity=resource_spec_to_proto(h.capacity),
            subscribed=resource_spec_to_proto(sub),
            gpus=[common_pb2.GpuDevice(device_id=g.device_id, name=g.name, vram_gb=g.vram_gb,
                                       shared_by=shared.get(g.device_id, []))
                  for g in h.gpus],
            virtual_gpus=h.virtual_gpus, gpus_committed=h.capacity.gpus - self.binder.idle,
            subscription_ratio=sr, prewarm_pool_size=ready, draining=self.draining,
            metrics_address=h.metrics_address,
        )

    def metrics_snapshot(self) -> HostSnapshot:
        """The host gauges of ``notebookos.metrics``, read at each scrape."""
        target, ready, _, _ = self.pool.status()
        with self._lock:
            states: dict[str, int] = {}
            for e in self._replicas.values():
                name = RS.Name(e.state).removeprefix("REPLICA_STATE_").lower()
                states[name] = states.get(name, 0) + 1
        return HostSnapshot(
            gpus_total=self.binder.total, gpus_committed=self.binder.total - self.binder.idle,
            gpus_subscribed=float(self.subscribed().gpus), replicas=states,
            prewarm_pool_size=ready, prewarm_pool_target=target, draining=self.draining)

    # -- replica life cycle -----------------------------------------------------------------

    def _entry(self, kernel_id: str, replica_id: int, context: grpc.ServicerContext) -> ReplicaEntry:
        with self._lock:
            entry = self._replicas.get((kernel_id, replica_id))
        if entry is None:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"no replica {replica_id} of kernel {kernel_id!r} on host "
                          f"{self.host.host_id}")
        return entry

    def StartReplica(self, request, context):  # noqa: N802 - gRPC method name
        def bad(msg: str) -> None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"StartReplicaRequest.{msg}")

        if not request.kernel_id:
            bad("kernel_id must not be empty")
        if request.replica_id < 1:
            bad(f"replica_id={request.replica_id} must be >= 1")
        if not request.key:
            bad("key must not be empty")
        if not request.raft_address or ":" not in request.raft_address:
            bad(f"raft_address={request.raft_address!r} must be host:port")
        scheme = request.signature_scheme or "hmac-sha256"
        if scheme not in SUPPORTED_SCHEMES:
            bad(f"signature_scheme={scheme!r} is not supported; use one of {SUPPORTED_SCHEMES}")
        if any(p.replica_id == request.replica_id for p in request.raft_peers):
            bad(f"raft_peers lists the replica's own id {request.replica_id}")
        try:
            resources = resource_spec_from_proto(request.resources, "StartReplicaRequest.resources")
        except InvalidResourceSpec as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if self.draining:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"host {self.host.host_id} is draining and takes no new replicas")
        if resources.gpus > self.host.capacity.gpus:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"gpus: {resources.gpus} requested, host {self.host.host_id} has "
                          f"{self.host.capacity.gpus}")
        raft_host, _, raft_port = request.raft_address.rpartition(":")
        if raft_port == "0":
            raft_address = f"{raft_host}:{free_ports(1, raft_host or '127.0.0.1')[0]}"
        else:
            raft_address = request.raft_address
        spec = ReplicaSpec(
            kernel_id=request.kernel_id, replica_id=request.replica_id,
            raft_address=raft_address,
            peers=tuple((p.replica_id, p.address) for p in request.raft_peers),
            store_url=request.store_url, key=request.key, signature_scheme=scheme,
            join=request.join_existing_group,
            restore_from_checkpoint=request.restore_from_checkpoint,
            env={**request.env, **(self.sharing_env if request.gpu_sharing else {})},
            kernel_name=request.kernel_name,
        )
        with self._lock:
            for (kid, rid) in self._replicas:
                if kid == request.kernel_id:
                    context.abort(grpc.StatusCode.ALREADY_EXISTS,
                                  f"host {self.host.host_id} already runs replica {rid} of kernel "
                                  f"{kid!r} (one replica of a kernel per host)")
            prewarmed = self.pool.take() if request.use_prewarmed else None
            if request.use_prewarmed and request.require_prewarmed and prewarmed is None:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"host {self.host.host_id} has no prewarmed process ready")
            try:
                launched = self.launcher.launch(spec, prewarmed, resources)
            except (OSError, RuntimeError) as exc:
                self.metrics.replica_starts.labels(
                    source="prewarm_pool" if prewarmed is not None else "cold",
                    outcome="failed").inc()  # a failed fork is retried cold
                context.abort(grpc.StatusCode.INTERNAL, f"could not start the replica: {exc}")
            entry = ReplicaEntry(launched, resources)
            self._replicas[(spec.kernel_id, spec.replica_id)] = entry
        self._ready_watch.watch(launched.ip, launched.ports["shell_port"],
                                lambda: launched.process.poll() is not None,
                                self.ready_timeout_s, lambda ready: self._started(entry, ready))
        log.info("started replica %s pid %d (prewarmed=%s)", spec.owner, launched.pid,
                 launched.from_prewarm_pool)
        return local_scheduler_pb2.StartReplicaResponse(
            connection=common_pb2.ConnectionInfo(ip=launched.ip, transport="tcp",
                                                 **launched.ports),
            pid=launched.pid, from_prewarm_pool=launched.from_prewarm_pool,
            raft_address=launched.raft_address,
        )

    def _started(self, entry: ReplicaEntry, ready: bool) -> None:
        """The start's watch ended (ready_watch.py): its shell socket accepts connections, or
        the replica exited (its watcher reports that) or never bound (the GS times out)."""
        launched = entry.launched
        source = replica_source(launched)
        if not ready:
            self.metrics.replica_starts.labels(source=source, outcome="failed").inc()
            return
        self.metrics.replica_starts.labels(source=source, outcome="succeeded").inc()
        self.metrics.replica_start.labels(source=source).observe(
            time.monotonic() - entry.launched_at)
        with self._lock:
            if entry.state == RS.REPLICA_STATE_STARTING:
                entry.state = RS.REPLICA_STATE_IDLE
        self._emit(entry, global_scheduler_pb2.REPLICA_EVENT_KIND_STARTED, 0, "")

    def _replica_exited(self, launched: LaunchedReplica, code: int) -> None:
        key = (launched.spec.kernel_id, launched.spec.replica_id)
        with self._lock:
            entry = self._replicas.get(key)
            if entry is None or entry.launched is not launched:
                return
            del self._replicas[key]
            entry.gone.set()
        self.binder.release_owner(launched.spec.owner)
        self.metrics.replica_exits.labels(cause="stopped" if entry.stopping else "died").inc()
        if entry.stopping:
            kind = global_scheduler_pb2.REPLICA_EVENT_KIND_EXITED
            message = ""
        else:
            kind = global_scheduler_pb2.REPLICA_EVENT_KIND_DIED
            message = self.launcher.log_tail(launched, 1500)
            log.warning("replica %s (pid %d) died with exit code %d", launched.spec.owner,
                        launched.pid, code)
        self._emit(entry, kind, code, message)

    def _emit(self, entry: ReplicaEntry, kind: int, code: int, message: str) -> None:
        self.report_event(global_scheduler_pb2.ReplicaEvent(
            host_id=self.host.host_id, kernel_id=entry.spec.kernel_id,
            replica_id=entry.spec.replica_id, kind=kind, pid=entry.launched.pid,
            exit_code=code, message=message, time_unix=time.time(),
        ))

    def stop_replica(self, entry: ReplicaEntry, grace_period_s: float = 0.0) -> int:
        with self._lock:
            entry.stopping = True
            entry.state = RS.REPLICA_STATE_STOPPING
        return self.launcher.stop(entry.launched, grace_period_s or self.stop_grace_period_s)

    def StopReplica(self, request, context):  # noqa: N802
        entry = self._entry(request.kernel_id, request.replica_id, context)
        if request.grace_period_s < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "StopReplicaRequest.grace_period_s must be >= 0")
        code = self.stop_replica(entry, request.grace_period_s)
        # Answer once the host no longer lists it (its exit watcher forgets it right after the
        # exit): a replica of the same kernel may be started here next (per-cell containers).
        entry.gone.wait(2.0)
        return local_scheduler_pb2.StopReplicaResponse(exit_code=code)

    def InterruptReplica(self, request, context):  # noqa: N802
        entry = self._entry(request.kernel_id, request.replica_id, context)
        if entry.state not in RUNNING_STATES:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"replica {entry.spec.owner} is not running")
        self.launcher.interrupt(entry.launched)
        return local_scheduler_pb2.InterruptReplicaResponse()

    def PrepareReplicaToMigrate(self, request, context):  # noqa: N802
        """Stop giving the replica GPUs and wait for its running cell. The replica keeps its Raft
        membership; its replacement catches up from the group (join), so no flush is needed here
        and ``checkpoint_ref`` stays empty."""
        entry = self._entry(request.kernel_id, request.replica_id, context)
        if entry.state not in RUNNING_STATES:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"replica {entry.spec.owner} is not running (state "
                          f"{RS.Name(entry.state)})")
        timeout = request.timeout_s or 30.0
        previous = entry.state
        entry.state = RS.REPLICA_STATE_MIGRATING
        if not self.binder.wait_released(entry.spec.owner, timeout):
            entry.state = previous
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                          f"replica {entry.spec.owner} still runs a cell after {timeout:g}s")
        return local_scheduler_pb2.PrepareReplicaToMigrateResponse()

    # -- GPUs -------------------------------------------------------------------------------

    def CommitGpus(self, request, context):  # noqa: N802
        for release in request.release_first:
            with self._lock:
                earlier = self._replicas.get((release.kernel_id, release.replica_id))
            if earlier is not None:  # a replica stopped meanwhile released everything it held
                self._release(earlier, release)
        if not request.request_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "CommitGpusRequest.request_id must not be empty")
        if request.gpus < 0 or request.gpus > self.binder.total:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"CommitGpusRequest.gpus={request.gpus}: host {self.host.host_id} has "
                          f"{self.binder.total} GPU(s)")
        entry = self._entry(request.kernel_id, request.replica_id, context)
        if entry.state == RS.REPLICA_STATE_MIGRATING:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"replica {entry.spec.owner} is migrating")
        if entry.state not in RUNNING_STATES and entry.state != RS.REPLICA_STATE_STARTING:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"replica {entry.spec.owner} is not running")
        result = self.binder.commit(entry.spec.owner, request.request_id, request.gpus,
                                    list(request.preferred_device_ids),
                                    shareable=request.shareable, share=request.share)
        self.metrics.gpu_commits.labels(
            outcome="committed" if result.committed else "refused").inc()
        if result.committed:
            entry.state = RS.REPLICA_STATE_EXECUTING
            entry.last_cell_device_ids = list(result.device_ids)
        return local_scheduler_pb2.CommitGpusResponse(
            committed=result.committed, device_ids=result.device_ids, reason=result.reason,
            gpus_idle=result.gpus_idle, shared_device_ids=result.shared_ids)

    def ReleaseGpus(self, request, context):  # noqa: N802
        entry = self._entry(request.kernel_id, request.replica_id, context)
        return local_scheduler_pb2.ReleaseGpusResponse(
            released_device_ids=self._release(entry, request))

    def _release(self, entry: ReplicaEntry,
                 request: local_scheduler_pb2.ReleaseGpusRequest) -> list[int]:
        if request.all_requests:
            released = self.binder.release_owner(entry.spec.owner)
        else:
            released = self.binder.release(request.request_id)
        if entry.state == RS.REPLICA_STATE_EXECUTING:
            entry.state = RS.REPLICA_STATE_IDLE
        return released

    # -- pool, status, shutdown -------------------------------------------------------------

    def SetPrewarmPool(self, request, context):  # noqa: N802
        if not 0 <= request.target_size <= MAX_PREWARM_POOL:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"SetPrewarmPoolRequest.target_size={request.target_size} must be "
                          f"between 0 and {MAX_PREWARM_POOL}")
        if self.draining and request.target_size > 0:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"host {self.host.host_id} is draining")
        self.pool.set_target(request.target_size)
        return self.pool_status()

    def pool_status(self) -> local_scheduler_pb2.PrewarmPoolStatus:
        target, ready, starting, message = self.pool.status()
        return local_scheduler_pb2.PrewarmPoolStatus(target_size=target, ready=ready,
                                                     starting=starting, message=message)

    def WatchHost(self, request, context):  # noqa: N802
        """Held until this daemon stops or the caller goes (see the proto); no thread of ours
        is woken meanwhile."""
        if not request.answer_now:
            ended = threading.Event()
            with self._lock:
                if len(self._watchers) >= MAX_HELD_WATCHES:
                    # bounded server threads: the oldest held call is answered (a Global
                    # Scheduler whose watch ends so checks the daemon and holds another)
                    next(iter(self._watchers)).set()
                    del self._watchers[next(iter(self._watchers))]
                self._watchers[ended] = None
                stopping = self._watchers_released
            if not stopping and context.add_callback(ended.set):
                ended.wait()
            with self._lock:
                self._watchers.pop(ended, None)
        return local_scheduler_pb2.WatchHostResponse(instance_id=self.instance_id)

    def release_watchers(self) -> None:
        """The daemon stops: answer every held ``WatchHost``."""
        with self._lock:
            self._watchers_released = True
            watchers = list(self._watchers)
        for ended in watchers:
            ended.set()

    def GetHostStatus(self, request, context):  # noqa: N802
        return local_scheduler_pb2.LocalHostStatus(
            host=self.host_status(), replicas=self.replica_statuses(),
            prewarm_pool=self.pool_status(), instance_id=self.instance_id,
            registered=self.registered)

    def Shutdown(self, request, context):  # noqa: N802
        with self._lock:
            entries = list(self._replicas.values())
            if entries and not request.force:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"host {self.host.host_id} still runs {len(entries)} replica(s); "
                              "migrate them first or pass force")
            self.draining = True
        self.pool.set_target(0)
        for entry in entries:
            self.stop_replica(entry)
        if self.on_shutdown is not None:
            threading.Thread(target=self.on_shutdown, args=(request.reason or "shutdown",),
                             daemon=True).start()
        return local_scheduler_pb2.ShutdownResponse(replicas_stopped=len(entries))

    def close(self) -> None:
        """The daemon stops: no start is watched any more."""
        self._ready_watch.close()

    def stop_all(self) -> None:
        with self._lock:
            entries = list(self._replicas.values())
        for entry in entries:
            self.stop_replica(entry, 2.0)

    def forget_stale(self, refs: list[global_scheduler_pb2.ReplicaRef]) -> None:
        """Stop replicas the GS no longer knows (their kernel was stopped meanwhile)."""
        for ref in refs:
            with self._lock:
                entry = self._replicas.get((ref.kernel_id, ref.replica_id))
            if entry is not None:
                log.info("stopping stale replica %s", entry.spec.owner)
                self.stop_replica(entry)
