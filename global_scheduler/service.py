"""The GlobalScheduler gRPC service: host registry, kernel placement and life cycle, recovery.

One lock (``self.lock``) guards the cluster model, the host links and the kernel entries; slow
calls to Local Schedulers (starting replicas) happen outside it.
"""

from __future__ import annotations

import logging
import random
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from concurrent import futures

import grpc

from notebookos.cluster import AccountingError, Cluster, Host, ReplicaState
from notebookos.global_scheduler.cell_containers import CellContainerMixin
from notebookos.global_scheduler.cell_front import CellFront
from notebookos.global_scheduler.errors import StartError
from notebookos.global_scheduler.execution import ExecutionMixin
from notebookos.global_scheduler.front import (
    KernelFront,
    ReplicaEndpoint,
)
from notebookos.global_scheduler.hosts import HostLink
from notebookos.global_scheduler.kernels import KernelEntry, ReplicaLink
from notebookos.global_scheduler.readiness import wait_until_ready
from notebookos.global_scheduler.recovery import RecoveryMixin
from notebookos.global_scheduler.registry_store import RegistryStore
from notebookos.policies import ContainerLifetime, GpuBinding, Policy
from notebookos.proto import common_pb2, global_scheduler_pb2, local_scheduler_pb2
from notebookos.proto import global_scheduler_pb2_grpc as gs_grpc
from notebookos.proto.convert import resource_spec_from_proto, resource_spec_to_proto
from notebookos.resources import InvalidResourceSpec, ResourceSpec

log = logging.getLogger(__name__)

SUPPORTED_SCHEMES = ("hmac-sha256", "hmac-sha512", "hmac-sha1", "hmac-md5")
KERNEL_STATES = {
    "starting": common_pb2.KERNEL_STATE_STARTING, "idle": common_pb2.KERNEL_STATE_IDLE,
    "busy": common_pb2.KERNEL_STATE_BUSY, "degraded": common_pb2.KERNEL_STATE_DEGRADED,
    "stopping": common_pb2.KERNEL_STATE_STOPPING, "failed": common_pb2.KERNEL_STATE_FAILED,
    "recovering": common_pb2.KERNEL_STATE_RECOVERING, "parked": common_pb2.KERNEL_STATE_PARKED,
}
REPLICA_STATES = {
    ReplicaState.STARTING: common_pb2.REPLICA_STATE_STARTING,
    ReplicaState.RUNNING: common_pb2.REPLICA_STATE_IDLE,
    ReplicaState.MIGRATING: common_pb2.REPLICA_STATE_MIGRATING,
    ReplicaState.STOPPED: common_pb2.REPLICA_STATE_STOPPED,
    ReplicaState.DEAD: common_pb2.REPLICA_STATE_DEAD,
}


class GlobalSchedulerService(ExecutionMixin, RecoveryMixin, CellContainerMixin,
                             gs_grpc.GlobalSchedulerServicer):
    def __init__(
        self,
        policy: Policy,
        store: RegistryStore,
        *,
        ip: str = "127.0.0.1",
        store_url: str = "",
        replicas_per_kernel: int | None = None,
        oversubscription: float = 3.0,
        heartbeat_interval_s: float = 2.0,
        heartbeat_timeout_s: float = 10.0,
        start_timeout_s: float = 120.0,
        cell_queue_timeout_s: float = 300.0,
        cell_checkpoint_timeout_s: float = 60.0,
    ) -> None:
        self.policy = policy
        self.store = store
        self.ip = ip
        self.store_url = store_url
        self.replicas_per_kernel = replicas_per_kernel or policy.replicas_per_kernel
        self.oversubscription = oversubscription
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.start_timeout_s = start_timeout_s
        self.instance_id = uuid.uuid4().hex
        self.cluster = Cluster(self.replicas_per_kernel)
        self.hosts: dict[str, HostLink] = {}
        self.kernels: dict[str, KernelEntry] = {}
        self.lock = threading.RLock()
        self._seen_events: dict[str, int] = {}  # host instance -> highest event sequence
        self._died_starting: set[tuple[str, int]] = set()  # replicas that died while starting
        self._recovery_guards: dict[str, threading.Lock] = {}  # one recovery per kernel at once
        self._orphan_suspects: dict[str, set[tuple[str, int]]] = {}  # host -> (kernel, replica)
        self._pool = futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="gs-work")
        self._stop = threading.Event()
        self.on_hosts_changed: Callable[[], None] | None = None
        # Per-cell containers (batch, lcp): see cell_containers.py.
        self.per_cell = policy.container_lifetime is ContainerLifetime.CELL
        self.uses_warm_pool = self.per_cell and hasattr(policy, "warm_containers_per_host")
        self.cell_queue_timeout_s = cell_queue_timeout_s
        self.cell_checkpoint_timeout_s = cell_checkpoint_timeout_s
        self._cell_waiters: list = []  # CellWaiter, in arrival order
        self._cell_cv = threading.Condition(self.lock)
        if self.per_cell and not store_url:
            log.warning("policy %s keeps a kernel's state in the store between cells, but no "
                        "store is configured: every cell starts with an empty namespace",
                        policy.name)
        self.on_capacity_wanted: Callable[[int], None] | None = None  # autoscaler hook
        self.migration_retries = 3

    # -- persistence ------------------------------------------------------------------------

    def _save_host(self, host_id: str) -> None:
        link, host = self.hosts[host_id], self.cluster.hosts[host_id]
        self.store.put_host(host_id, link.to_doc(host.capacity.to_dict()))

    def _save_kernel(self, entry: KernelEntry) -> None:
        kernel = self.cluster.kernels.get(entry.kernel_id)
        if kernel is not None:
            self.store.put_kernel(entry.kernel_id, entry.to_doc(kernel.request.to_dict()))

    def restore(self) -> None:
        """Reload the registry after a restart and re-bind every kernel's front on its ports."""
        hosts, kernels = self.store.load()
        with self.lock:
            for host_id, doc in hosts.items():
                try:
                    capacity = ResourceSpec.from_dict(doc["capacity"])
                    self._add_host(host_id, doc["address"], doc["instance_id"], capacity,
                                   doc["gpus"], doc["virtual_gpus"],
                                   doc.get("prewarm_pool_target", doc.get("prewarm_pool_size", 0)))
                except (KeyError, ValueError, AccountingError) as exc:
                    log.error("registry: skipping host %s: %s", host_id, exc)
            for kernel_id, doc in kernels.items():
                try:
                    self._restore_kernel(kernel_id, doc)
                except Exception as exc:  # noqa: BLE001 - one bad record must not stop the rest
                    log.exception("registry: could not restore kernel %s: %s", kernel_id, exc)
        log.info("registry restored: %d host(s), %d kernel(s)", len(self.hosts),
                 len(self.kernels))

    def _restore_kernel(self, kernel_id: str, doc: dict) -> None:
        request = ResourceSpec.from_dict(doc["request"])
        self.cluster.add_kernel(kernel_id, request)
        entry = KernelEntry(kernel_id, doc["key"], doc["signature_scheme"], doc["kernel_name"],
                            dict(doc.get("env", {})), next_replica_id=doc["next_replica_id"],
                            created_unix=doc.get("created_unix", time.time()),
                            raft_removals=list(doc.get("raft_removals", [])),
                            checkpoint_count=int(doc.get("checkpoint_count", 0)),
                            kernel_info=doc.get("kernel_info"))
        for rdoc in doc["replicas"]:
            link = ReplicaLink.from_doc(rdoc)
            if link.host_id not in self.hosts:
                entry.raft_removals.append(link.replica_id)
                continue  # its host is gone: the replacement logic below restores the count
            replica = self.cluster.place_replica(kernel_id, link.replica_id, link.host_id)
            replica.state = ReplicaState.RUNNING
            replica.pid = link.pid
            entry.replicas[link.replica_id] = link
        session = doc.get("session_gpus")
        if session and session[0] in entry.replicas:
            rid, host_id, ids = int(session[0]), str(session[1]), [int(i) for i in session[2]]
            entry.session_gpus = (rid, host_id, ids)
            host = self.cluster.hosts[host_id]
            try:
                host.commit(self.cluster.kernels[kernel_id].replicas[rid].owner, request, ids)
            except AccountingError as exc:
                log.warning("registry: kernel %s session GPUs: %s", kernel_id, exc)
        entry.front = self._new_front(entry, ports=doc.get("front_ports") or None)
        entry.front.set_replicas(entry.endpoints())
        entry.front.start()
        entry.state = "idle" if len(entry.replicas) >= self.replicas_per_kernel else "degraded"
        self.kernels[kernel_id] = entry
        if self.per_cell:
            entry.state = "idle" if entry.replicas else "parked"
            if entry.replicas:  # a cell's container from before the restart: park it
                self._pool.submit(self._park, kernel_id)
        elif entry.state == "degraded":
            self._pool.submit(self._restore_replica_count, kernel_id)

    # -- hosts ------------------------------------------------------------------------------

    def _add_host(self, host_id: str, address: str, instance_id: str, capacity: ResourceSpec,
                  gpus: list[dict], virtual: bool, prewarm: int) -> None:
        host = Host(host_id, capacity, address=address,
                    gpu_device_ids=[g["device_id"] for g in gpus],
                    oversubscription=self.oversubscription, virtual_gpus=virtual)
        self.cluster.add_host(host)
        self.hosts[host_id] = HostLink(host_id, address, instance_id, gpus, virtual,
                                       prewarm_pool_target=self._pool_target(prewarm))

    def _pool_target(self, offered: int) -> int:
        """A host's prewarm pool target: the pool it offers, or for lcp the policy's warm pool."""
        if self.uses_warm_pool:
            return int(self.policy.warm_containers_per_host)
        return offered

    def RegisterHost(self, request, context):  # noqa: N802 - gRPC method name
        def bad(msg: str) -> None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"RegisterHostRequest.{msg}")

        if not request.host_id:
            bad("host_id must not be empty")
        if not request.address or ":" not in request.address:
            bad(f"address={request.address!r} must be host:port")
        try:
            capacity = resource_spec_from_proto(request.capacity, "RegisterHostRequest.capacity")
        except InvalidResourceSpec as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        ids = [g.device_id for g in request.gpus]
        if capacity.gpus == 0:
            bad("capacity offers zero GPUs: a NotebookOS host needs at least one GPU (real, or "
                "virtual with local_scheduler.virtual_gpus >= 1)")
        if capacity.gpus != len(ids):
            bad(f"capacity.gpus={capacity.gpus} differs from the {len(ids)} GPU(s) listed")
        if len(set(ids)) != len(ids) or any(i < 0 for i in ids):
            bad(f"gpus has duplicate or negative device ids {ids}")
        gpus = [{"device_id": g.device_id, "name": g.name, "vram_gb": g.vram_gb}
                for g in request.gpus]
        stale: list[global_scheduler_pb2.ReplicaRef] = []
        with self.lock:
            link = self.hosts.get(request.host_id)
            if link is not None and link.address != request.address \
                    and link.instance_id != request.instance_id \
                    and time.time() - link.last_heartbeat < self.heartbeat_timeout_s:
                context.abort(grpc.StatusCode.ALREADY_EXISTS,
                              f"host {request.host_id} is registered from {link.address} and "
                              "still heartbeating; two Local Schedulers claim one host id")
            if link is not None:
                host = self.cluster.hosts[request.host_id]
                if host.capacity != capacity or link.address != request.address:
                    # a different machine under the same id: its old replicas are lost
                    self._drop_host(request.host_id, "re-registered with a new capacity")
                    link = None
            if link is None:
                try:
                    self._add_host(request.host_id, request.address, request.instance_id,
                                   capacity, gpus, request.virtual_gpus, request.prewarm_pool_size)
                except (ValueError, AccountingError) as exc:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                link = self.hosts[request.host_id]
                log.info("host %s registered at %s with %d GPU(s)", request.host_id,
                         request.address, capacity.gpus)
            link.instance_id = request.instance_id
            link.last_heartbeat = time.time()
            link.prewarm_pool_target = self._pool_target(request.prewarm_pool_size)
            for r in request.replicas:
                # Placed replicas count as known, including those still starting.
                kernel = self.cluster.kernels.get(r.kernel_id)
                placed = kernel.replicas.get(r.replica_id) if kernel is not None else None
                known = placed is not None and placed.host_id == request.host_id
                if not known:
                    stale.append(global_scheduler_pb2.ReplicaRef(kernel_id=r.kernel_id,
                                                                replica_id=r.replica_id))
            self._save_host(request.host_id)
        if self.on_hosts_changed is not None:
            self.on_hosts_changed()
        return global_scheduler_pb2.RegisterHostResponse(
            scheduler_instance_id=self.instance_id,
            heartbeat_interval_s=self.heartbeat_interval_s,
            prewarm_pool_target=link.prewarm_pool_target, stale_replicas=stale)

    def Heartbeat(self, request, context):  # noqa: N802
        if not request.host_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "HeartbeatRequest.host_id must not be empty")
        with self.lock:
            link = self.hosts.get(request.host_id)
            if link is None or link.instance_id != request.instance_id:
                return global_scheduler_pb2.HeartbeatResponse(reregister=True)
            link.last_heartbeat = time.time()
            link.prewarm_pool_size = request.prewarm_pool_size
            reported = {(r.kernel_id, r.replica_id): r for r in request.replicas}
            orphaned = []
            for entry in self.kernels.values():
                for rid, rl in entry.replicas.items():
                    r = reported.get((entry.kernel_id, rid))
                    if rl.host_id == request.host_id and r is not None:
                        rl.pid = r.pid
                        if r.committed_gpu_device_ids and not self._holds_gpus(entry, rid):
                            orphaned.append((entry.kernel_id, rid))
            # GPUs committed on the host for a request the GS does not know (it restarted
            # mid-cell): released when seen in two heartbeats in a row.
            suspects = self._orphan_suspects.setdefault(request.host_id, set())
            confirmed = [o for o in orphaned if o in suspects]
            suspects.clear()
            suspects.update(o for o in orphaned if o not in confirmed)
        for kernel_id, rid in confirmed:
            self._pool.submit(self._release_orphaned, link, kernel_id, rid)
        return global_scheduler_pb2.HeartbeatResponse(
            prewarm_pool_target=link.prewarm_pool_target,
            heartbeat_interval_s=self.heartbeat_interval_s)

    def DeregisterHost(self, request, context):  # noqa: N802
        with self.lock:
            if request.host_id not in self.hosts:
                context.abort(grpc.StatusCode.NOT_FOUND, f"host {request.host_id!r} is not "
                              "registered")
            lost = self._drop_host(request.host_id, request.reason or "deregistered")
        if self.on_hosts_changed is not None:
            self.on_hosts_changed()
        return global_scheduler_pb2.DeregisterHostResponse(replicas_lost=lost)

    def _drop_host(self, host_id: str, reason: str) -> int:
        """Forget a host; its replicas are lost and replaced elsewhere. Caller holds the lock."""
        lost = 0
        for entry in list(self.kernels.values()):
            for rid, rl in list(entry.replicas.items()):
                if rl.host_id == host_id:
                    self._lose_replica(entry, rid, f"host {host_id} {reason}")
                    lost += 1
        host = self.cluster.hosts.get(host_id)
        if host is not None:
            for owner in list(host.owners):
                host.release_owner(owner)
            self.cluster.remove_host(host_id)
        link = self.hosts.pop(host_id, None)
        if link is not None:
            link.close()
        self.store.delete_host(host_id)
        log.warning("host %s removed (%s); %d replica(s) lost", host_id, reason, lost)
        return lost

    def check_hosts(self) -> None:
        """Declare hosts silent for longer than the heartbeat timeout dead."""
        now = time.time()
        with self.lock:
            silent = [h for h, link in self.hosts.items()
                      if now - link.last_heartbeat > self.heartbeat_timeout_s]
            for host_id in silent:
                self._drop_host(host_id, f"missed heartbeats for {self.heartbeat_timeout_s:g}s")
        if silent and self.on_hosts_changed is not None:
            self.on_hosts_changed()

    # -- replica events and recovery ----------------------------------------------------------

    def ReportReplicaEvent(self, request, context):  # noqa: N802
        with self.lock:
            link = self.hosts.get(request.host_id)
            if link is None:
                context.abort(grpc.StatusCode.NOT_FOUND,
                              f"host {request.host_id!r} is not registered")
            seen_key = f"{request.host_id}/{link.instance_id}"
            if request.sequence and request.sequence <= self._seen_events.get(seen_key, 0):
                return global_scheduler_pb2.ReplicaEventAck(known=True)
            self._seen_events[seen_key] = max(request.sequence, self._seen_events.get(seen_key, 0))
            entry = self.kernels.get(request.kernel_id)
            rl = entry.replicas.get(request.replica_id) if entry else None
            if entry is None or rl is None or rl.host_id != request.host_id:
                kernel = self.cluster.kernels.get(request.kernel_id)
                if kernel is not None and request.replica_id in kernel.replicas and \
                        request.kind == global_scheduler_pb2.REPLICA_EVENT_KIND_DIED:
                    self._died_starting.add((request.kernel_id, request.replica_id))
                    log.warning("kernel %s: replica %d died while starting: %s",
                                request.kernel_id, request.replica_id,
                                request.message.strip().splitlines()[-1:] or "")
                    return global_scheduler_pb2.ReplicaEventAck(known=True)
                return global_scheduler_pb2.ReplicaEventAck(known=False)
            kind = request.kind
            if kind == global_scheduler_pb2.REPLICA_EVENT_KIND_STARTED:
                rl.ready = True
                replica = self.cluster.kernels[entry.kernel_id].replicas.get(request.replica_id)
                if replica is not None:
                    replica.state = ReplicaState.RUNNING
            elif kind in (global_scheduler_pb2.REPLICA_EVENT_KIND_DIED,
                          global_scheduler_pb2.REPLICA_EVENT_KIND_EXITED):
                if entry.state != "stopping":
                    why = "died" if kind == global_scheduler_pb2.REPLICA_EVENT_KIND_DIED \
                        else "exited"
                    self._lose_replica(entry, request.replica_id,
                                       f"replica {request.replica_id} {why} (exit code "
                                       f"{request.exit_code})")
        return global_scheduler_pb2.ReplicaEventAck(known=True)

    # -- kernels ------------------------------------------------------------------------------

    def StartKernel(self, request, context):  # noqa: N802
        def bad(msg: str) -> None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"StartKernelRequest.{msg}")

        if not request.kernel_id:
            bad("kernel_id must not be empty")
        if not request.key:
            bad("key must not be empty (the kernel's HMAC key)")
        scheme = request.signature_scheme or "hmac-sha256"
        if scheme not in SUPPORTED_SCHEMES:
            bad(f"signature_scheme={scheme!r} is not supported; use one of {SUPPORTED_SCHEMES}")
        if request.hints.replicas < 0:
            bad(f"hints.replicas={request.hints.replicas} must be >= 0")
        try:
            spec = resource_spec_from_proto(request.resources, "StartKernelRequest.resources")
        except InvalidResourceSpec as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            entry = self.start_kernel(request.kernel_id, spec, request.key, scheme,
                                      request.kernel_name, dict(request.env))
        except StartError as exc:
            context.abort(exc.code, str(exc))
        with self.lock:
            status = self._kernel_status(entry, with_key=False)
        connection = self._connection(entry, with_key=True)
        return global_scheduler_pb2.StartKernelResponse(connection=connection, status=status)

    def start_kernel(self, kernel_id: str, spec: ResourceSpec, key: str, scheme: str,
                     kernel_name: str = "", env: dict[str, str] | None = None) -> KernelEntry:
        with self.lock:
            if kernel_id in self.kernels:
                raise StartError(grpc.StatusCode.ALREADY_EXISTS,
                                 f"kernel {kernel_id!r} is already running; stop it first")
            self.cluster.add_kernel(kernel_id, spec)
            entry = KernelEntry(kernel_id, key, scheme, kernel_name, env or {})
            self.kernels[kernel_id] = entry
        try:
            for attempt in range(3):  # a replica can lose a port race at start: try again
                try:
                    if self.per_cell:
                        self._start_first_container(kernel_id)
                    else:
                        self._add_replicas(kernel_id, self.replicas_per_kernel, join=False)
                    break
                except StartError as exc:
                    if exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED or attempt == 2:
                        raise
                    log.warning("kernel %s: start attempt %d failed: %s", kernel_id,
                                attempt + 1, exc)
            if self.policy.gpu_binding is GpuBinding.SESSION:
                self._bind_for_session(entry, spec)
            with self.lock:
                entry.front = self._new_front(entry)
                entry.front.set_replicas(entry.endpoints())
                entry.front.start()
                entry.state = "idle"
                self._save_kernel(entry)
            if self.per_cell:
                self._park(kernel_id)
            return entry
        except StartError:
            self._discard_kernel(kernel_id)
            raise
        except Exception as exc:
            self._discard_kernel(kernel_id)
            log.exception("kernel %s failed to start", kernel_id)
            raise StartError(grpc.StatusCode.INTERNAL, f"kernel {kernel_id} failed to start: "
                             f"{exc}") from exc

    def _new_front(self, entry: KernelEntry, ports: dict[str, int] | None = None) -> KernelFront:
        if not self.per_cell:
            return KernelFront(entry.kernel_id, entry.key, entry.signature_scheme, self,
                               ip=self.ip, ports=ports)
        kernel_id = entry.kernel_id
        return CellFront(kernel_id, entry.key, entry.signature_scheme, self, ip=self.ip,
                         ports=ports, kernel_info=entry.kernel_info,
                         on_interrupt_parked=lambda: self.cancel_waiting_cells(kernel_id))

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

    def _add_replicas(self, kernel_id: str, count: int, *, join: bool,
                      on_host: str | None = None, restore: bool = False,
                      prewarmed: bool = True,
                      extra_env: dict[str, str] | None = None) -> list[int]:
        """Place ``count`` new replicas (on ``on_host`` when given, else where the policy says),
        start them (from the host's prewarm pool when ``prewarmed`` and it has one), wait until
        they answer; returns their ids. Raises StartError."""
        with self.lock:
            entry = self.kernels[kernel_id]
            members = [r.endpoint for r in entry.replicas.values() if r.ready]
        if join:
            if not members:
                raise StartError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"kernel {kernel_id} has no live member to join")
            self._remove_lost_members(entry, members)
        with self.lock:
            entry = self.kernels[kernel_id]
            kernel = self.cluster.kernels[kernel_id]
            occupied = [r.host_id for r in entry.replicas.values()]
            occupied += [h for h, link in self.hosts.items() if link.draining]
            if on_host is not None:
                hosts = [self.cluster.hosts[on_host]] if on_host in self.cluster.hosts else None
            else:
                hosts = self.policy.choose_hosts(self.cluster, kernel.request, count,
                                                 exclude=occupied)
            if hosts is None:
                raise StartError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                 self._why_no_hosts(kernel.request, count, len(occupied)))
            plan = []
            # A group of one needs no address known in advance: its host picks a free port.
            alone = len(hosts) == 1 and not entry.replicas
            for host in hosts:
                rid = entry.next_replica_id
                entry.next_replica_id += 1
                self.cluster.place_replica(kernel_id, rid, host.host_id)
                port = 0 if alone else random.randint(20000, 59999)
                raft = f"{self.hosts[host.host_id].ip}:{port}"
                plan.append((rid, self.hosts[host.host_id], raft))
            peers = [local_scheduler_pb2.RaftPeer(replica_id=r.replica_id,
                                                  address=r.raft_address)
                     for r in entry.replicas.values()]
            peers += [local_scheduler_pb2.RaftPeer(replica_id=rid, address=raft)
                      for rid, _, raft in plan]
            request_spec = resource_spec_to_proto(kernel.request)
        calls = {}
        for rid, link, raft in plan:
            req = local_scheduler_pb2.StartReplicaRequest(
                kernel_id=kernel_id, replica_id=rid, raft_address=raft,
                raft_peers=[p for p in peers if p.replica_id != rid], store_url=self.store_url,
                key=entry.key, signature_scheme=entry.signature_scheme, resources=request_spec,
                use_prewarmed=prewarmed, join_existing_group=join,
                restore_from_checkpoint=restore, env={**entry.env, **(extra_env or {})},
                kernel_name=entry.kernel_name)
            calls[rid] = (link, raft, link.stub.StartReplica.future(req, timeout=60))
        started: dict[int, ReplicaLink] = {}
        errors = []
        for rid, (link, raft, fut) in calls.items():
            try:
                resp = fut.result()
            except grpc.RpcError as exc:
                errors.append(f"host {link.host_id}: {exc.details()}")
                continue
            c = resp.connection
            started[rid] = ReplicaLink(
                rid, link.host_id,
                ReplicaEndpoint(rid, c.ip, c.shell_port, c.iopub_port, c.stdin_port,
                                c.control_port),
                resp.raft_address or raft, resp.pid, from_prewarm_pool=resp.from_prewarm_pool)
        t_started = time.monotonic()
        if not errors and join:
            for rid, r in started.items():
                try:
                    self._membership_change(entry, members, "add_replica_request",
                                            {"replica_id": rid, "raft_address": r.raft_address})
                except StartError as exc:
                    errors.append(str(exc))
        t_added = time.monotonic()
        infos: dict[int, dict] = {}
        if not errors:
            ready = wait_until_ready(
                [r.endpoint for r in started.values()], entry.key, entry.signature_scheme,
                self.start_timeout_s,
                alive=lambda rid: (kernel_id, rid) not in self._died_starting, replies=infos)
            errors = [f"replica {rid} on host {r.host_id} "
                      + ("died while starting" if (kernel_id, rid) in self._died_starting
                         else f"did not answer within {self.start_timeout_s:g}s")
                      for rid, r in started.items() if rid not in ready]
            log.info("kernel %s: replicas %s membership %.2fs, ready %.2fs", kernel_id,
                     sorted(started), t_added - t_started, time.monotonic() - t_added)
        if errors:
            for rid, r in started.items():
                self._stop_replica_quietly(r.host_id, kernel_id, rid)
            with self.lock:
                for rid, _, _ in plan:
                    if rid in self.cluster.kernels[kernel_id].replicas:
                        self.cluster.remove_replica(kernel_id, rid)
            code = grpc.StatusCode.DEADLINE_EXCEEDED if any("did not answer" in e
                                                            for e in errors) \
                else grpc.StatusCode.UNAVAILABLE
            raise StartError(code, f"kernel {kernel_id}: could not start replicas: "
                             + "; ".join(errors))
        with self.lock:
            if infos and entry.kernel_info is None:
                entry.kernel_info = next(iter(infos.values()))
                if isinstance(entry.front, CellFront) and entry.front.kernel_info is None:
                    entry.front.kernel_info = entry.kernel_info
            for rid, r in started.items():
                r.ready = True
                entry.replicas[rid] = r
                replica = self.cluster.kernels[kernel_id].replicas[rid]
                replica.state = ReplicaState.RUNNING
                replica.pid = r.pid
            if entry.front is not None:
                entry.front.set_replicas(entry.endpoints())
            self._save_kernel(entry)
        return sorted(started)

    def _why_no_hosts(self, request: ResourceSpec, count: int, occupied: int) -> str:
        total = len(self.cluster.hosts)
        fit = sum(1 for h in self.cluster.hosts.values() if request.fits_within(h.capacity))
        if fit == 0:
            return (f"no host can hold the request ({request}) at all: "
                    f"{total} host(s) registered")
        return (f"need {count} more distinct host(s) for the request ({request}); "
                f"{fit} of {total} host(s) could hold it but not within the subscription "
                f"limits ({occupied} already hold a replica)")

    def _stop_replica_quietly(self, host_id: str, kernel_id: str, replica_id: int) -> None:
        link = self.hosts.get(host_id)
        if link is None:
            return
        try:
            link.stub.StopReplica(local_scheduler_pb2.StopReplicaRequest(
                kernel_id=kernel_id, replica_id=replica_id, grace_period_s=2.0), timeout=15)
        except grpc.RpcError as exc:
            log.info("stopping replica %s/%d on %s: %s", kernel_id, replica_id, host_id,
                     exc.details())

    def _discard_kernel(self, kernel_id: str) -> None:
        with self.lock:
            entry = self.kernels.pop(kernel_id, None)
            if kernel_id in self.cluster.kernels:
                self.cluster.remove_kernel(kernel_id)
            self.store.delete_kernel(kernel_id)
        if entry is not None and entry.front is not None:
            entry.front.close()

    def StopKernel(self, request, context):  # noqa: N802
        with self.lock:
            entry = self.kernels.get(request.kernel_id)
            if entry is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"no kernel {request.kernel_id!r}")
            entry.state = "stopping"
            replicas = list(entry.replicas.values())
            self._cell_cv.notify_all()  # its cells waiting for a host stop waiting
        list(self._pool.map(lambda r: self._stop_replica_quietly(
            r.host_id, request.kernel_id, r.replica_id), replicas))
        self._discard_kernel(request.kernel_id)
        return global_scheduler_pb2.StopKernelResponse()

    def InterruptKernel(self, request, context):  # noqa: N802
        with self.lock:
            entry = self.kernels.get(request.kernel_id)
            if entry is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"no kernel {request.kernel_id!r}")
            if entry.state in ("starting", "stopping"):
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"kernel {request.kernel_id} is {entry.state}")
            running = dict(entry.executions)
        queued = self.cancel_waiting_cells(request.kernel_id) if self.per_cell else 0
        for rid, host_id in running.values():
            link = self.hosts.get(host_id)
            if link is not None:
                try:
                    link.stub.InterruptReplica(local_scheduler_pb2.InterruptReplicaRequest(
                        kernel_id=request.kernel_id, replica_id=rid), timeout=5)
                except grpc.RpcError as exc:
                    log.info("interrupt of %s/%d failed: %s", request.kernel_id, rid,
                             exc.details())
        return global_scheduler_pb2.InterruptKernelResponse(
            cell_was_running=bool(running or queued))

    def RestartKernel(self, request, context):  # noqa: N802
        """Fresh replicas (empty namespace) behind the same front ports."""
        with self.lock:
            entry = self.kernels.get(request.kernel_id)
            if entry is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"no kernel {request.kernel_id!r}")
            if entry.state in ("stopping", "starting"):
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"kernel {request.kernel_id} is {entry.state}")
            guard = self._recovery_guards.setdefault(request.kernel_id, threading.Lock())
        with guard:
            with self.lock:
                old = list(entry.replicas.values())
                entry.state = "starting"
                kernel = self.cluster.kernels[request.kernel_id]
                for r in old:
                    entry.replicas.pop(r.replica_id, None)
                    if r.replica_id in kernel.replicas:
                        self.cluster.remove_replica(request.kernel_id, r.replica_id)
                entry.raft_removals.clear()
                entry.executions.clear()
                entry.session_gpus = None
                entry.checkpoint_count = 0  # per-cell containers: the next cell starts empty
                entry.lost_cells.clear()
                kernel.executor = None
                if entry.front is not None:
                    entry.front.set_replicas([])
            list(self._pool.map(lambda r: self._stop_replica_quietly(
                r.host_id, request.kernel_id, r.replica_id), old))
            try:
                if self.per_cell:
                    self._start_first_container(request.kernel_id)
                else:
                    self._add_replicas(request.kernel_id, self.replicas_per_kernel, join=False)
                if self.policy.gpu_binding is GpuBinding.SESSION:
                    self._bind_for_session(entry, kernel.request)
            except StartError as exc:
                with self.lock:
                    entry.state, entry.message = "failed", f"restart failed: {exc}"
                    self._save_kernel(entry)
                context.abort(exc.code, str(exc))
            with self.lock:
                entry.state, entry.message = "idle", ""
                self._save_kernel(entry)
            if self.per_cell:
                self._park(request.kernel_id)
            with self.lock:
                status = self._kernel_status(entry)
        return global_scheduler_pb2.RestartKernelResponse(
            connection=self._connection(entry, with_key=True), status=status)

    def MigrateReplica(self, request, context):  # noqa: N802
        if not request.kernel_id or request.replica_id < 1:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "MigrateReplicaRequest needs kernel_id and replica_id >= 1")
        try:
            rid, host_id = self.migrate_replica(request.kernel_id, request.replica_id,
                                                request.target_host_id or None)
        except StartError as exc:
            context.abort(exc.code, str(exc))
        with self.lock:
            status = self._kernel_status(self.kernels[request.kernel_id])
        replica = next((r for r in status.replicas if r.replica_id == rid), None)
        return global_scheduler_pb2.MigrateReplicaResponse(target_host_id=host_id,
                                                           replica=replica)

    # -- routing hooks (called on a front's thread) -----------------------------------------

    # -- status -------------------------------------------------------------------------------

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
        queued = self.queued_cells(entry.kernel_id) if self.per_cell else 0
        state = entry.state
        if state in ("idle", "parked") and (entry.executions or queued):
            state = "busy"
        return common_pb2.KernelStatus(
            kernel_id=entry.kernel_id, state=KERNEL_STATES.get(state, 0),
            resources=resource_spec_to_proto(kernel.request) if kernel else None,
            replicas=replicas, executor_replica_id=(kernel.executor or 0) if kernel else 0,
            connection=self._connection(entry, with_key), message=entry.message,
            created_unix=entry.created_unix,
            dropped_messages=(entry.front.bad_signatures + entry.front.malformed)
            if entry.front else 0,
            last_interactivity_delay_ms=entry.kernel_interactivity_ms,
            last_container_start_ms=entry.last_container_start_ms,
            last_cell_pid=entry.last_cell_pid,
            last_cell_from_prewarm_pool=entry.last_cell_from_prewarm_pool,
            queued_cells=queued)

    def GetKernelStatus(self, request, context):  # noqa: N802
        with self.lock:
            entry = self.kernels.get(request.kernel_id)
            if entry is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"no kernel {request.kernel_id!r}")
            return self._kernel_status(entry)

    def ListKernels(self, request, context):  # noqa: N802
        with self.lock:
            return global_scheduler_pb2.ListKernelsResponse(
                kernels=[self._kernel_status(e) for e in self.kernels.values()])

    def GetClusterStatus(self, request, context):  # noqa: N802
        with self.lock:
            hosts = []
            for host_id, host in self.cluster.hosts.items():
                link = self.hosts[host_id]
                hosts.append(common_pb2.HostStatus(
                    host_id=host_id, address=link.address,
                    capacity=resource_spec_to_proto(host.capacity),
                    subscribed=resource_spec_to_proto(host.subscribed),
                    gpus=[common_pb2.GpuDevice(**g) for g in link.gpus],
                    virtual_gpus=link.virtual_gpus, gpus_committed=host.committed.gpus,
                    gpus_pending=host.pending.gpus,
                    subscription_ratio=host.subscription_ratio(self.replicas_per_kernel),
                    prewarm_pool_size=link.prewarm_pool_size,
                    last_heartbeat_unix=link.last_heartbeat, draining=link.draining))
            limit = getattr(self.policy, "subscription_ratio_limit", 0.0)
            return global_scheduler_pb2.ClusterStatus(
                hosts=hosts, kernels=[self._kernel_status(e) for e in self.kernels.values()],
                policy=self.policy.name, replicas_per_kernel=self.replicas_per_kernel,
                subscription_ratio_limit=float(limit or 0.0),
                gpus_total=self.cluster.total_gpus, gpus_committed=self.cluster.committed_gpus,
                gpus_pending=sum(h.pending.gpus for h in self.cluster.hosts.values()),
                scheduler_instance_id=self.instance_id)

    # -- shutdown -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the fronts (the replicas keep running: a restarted GS takes them back)."""
        self._stop.set()
        with self.lock:
            entries = list(self.kernels.values())
            links = list(self.hosts.values())
        for entry in entries:
            if entry.front is not None:
                entry.front.close()
        for link in links:
            link.close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def new_key() -> str:
    return secrets.token_hex(16)
