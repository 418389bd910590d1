"""The GlobalScheduler gRPC service: its state, persistence and shutdown; the work is done by
the mixins it is made of, one job each:

- ``host_registry``: registration, heartbeats, host loss, replica events the hosts report;
- ``lifecycle``: kernel start, stop, interrupt, restart, ``MigrateReplica``;
- ``replicas``: starting and stopping replica processes on hosts;
- ``execution``: which replica runs a cell, GPU commit and release, migration on contention;
- ``recovery``: replacing lost replicas, rebuilding from a checkpoint, ``migrate_replica``;
- ``cell_containers``: per-cell containers for the batch and lcp policies;
- ``hibernation``: an idle kernel's replicas stopped, its checkpoint kept, woken by a cell;
- ``status``: the status answers.

One lock (``self.lock``) guards the cluster model, the host links and the kernel entries; slow
calls to Local Schedulers (starting replicas) happen outside it.

Who runs what (issue 32; the daemon's docstring and docs/architecture.md): the gRPC server runs
on the fronts' loop (``FrontLoop.shared()``, grpc.aio). ``Heartbeat`` and ``ReportReplicaEvent``
are coroutines on that loop: a short decision under the lock (awaited, ``acquire_async``:
state_lock.py), never an ``await`` while holding it, their effects handed to ``_pool``. The
status queries are coroutines too, answered from the lock-versioned status board while a
thread holds the lock (status.py), and so is the kernel life cycle (``StartKernel``,
``RestartKernel``, ``WakeKernel``, ``MigrateReplica``, ``StopKernel``, ``InterruptKernel``:
their Local Scheduler calls awaited in ``_pool``, lifecycle.py), and the host calls
(``RegisterHost``, ``DeregisterHost``, ``DrainHost``: host_registry.py, host_drain.py). The host
monitor is a timer on the loop (host_monitor.py) armed for ``next_host_deadline``; its
``check_hosts`` runs in ``_pool``. The front hooks run on the loop too. What remains shared
between threads is this lock's state; moving the remaining handlers onto the loop is next.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from concurrent import futures

import zmq

from notebookos import __version__
from notebookos.cluster import AccountingError, Cluster, ReplicaState
from notebookos.global_scheduler import background
from notebookos.global_scheduler.cell_containers import CellContainerMixin
from notebookos.global_scheduler.cell_queue import CellQueue
from notebookos.global_scheduler.execution import ExecutionMixin
from notebookos.global_scheduler.front import KernelFront
from notebookos.global_scheduler.front_loop import FrontLoop
from notebookos.global_scheduler.front_replicas import LAZY_LINK_IDLE_S
from notebookos.global_scheduler.front_sockets import SpareFrontSockets
from notebookos.global_scheduler.hibernation import HibernationMixin
from notebookos.global_scheduler.host_drain import HostDrainMixin
from notebookos.global_scheduler.host_registry import HostRegistryMixin
from notebookos.global_scheduler.hosts import HostLink
from notebookos.global_scheduler.kernel_modes import kernel_mode_for
from notebookos.global_scheduler.kernels import KernelEntry, ReplicaLink
from notebookos.global_scheduler.lifecycle import KernelLifecycleMixin
from notebookos.global_scheduler.lock_holds import service_lock
from notebookos.global_scheduler.loop_waits import LoopSignal, SignallingCondition
from notebookos.global_scheduler.recovery import RecoveryMixin
from notebookos.global_scheduler.registry_store import RegistryStore
from notebookos.global_scheduler.registry_writer import RegistryWriter
from notebookos.global_scheduler.replicas import ReplicaStarterMixin
from notebookos.global_scheduler.state_lock import LoopChanges
from notebookos.global_scheduler.status import StatusMixin
from notebookos.kernel_hints import KernelHints
from notebookos.metrics import GlobalSchedulerMetrics
from notebookos.policies import Policy
from notebookos.policies.cell_order import ArrivalOrder, CellOrder
from notebookos.proto import global_scheduler_pb2_grpc as gs_grpc
from notebookos.resources import ResourceSpec
from notebookos.security import Connect

log = logging.getLogger(__name__)
# How long a restarted Global Scheduler waits for a kernel front's old ports to be free again
# before it gives the kernel new ones (its clients then have to reconnect).
FRONT_REBIND_WAIT_S = 10.0


class GlobalSchedulerService(HostRegistryMixin, HostDrainMixin, KernelLifecycleMixin,
                             ReplicaStarterMixin, ExecutionMixin, RecoveryMixin, CellContainerMixin, HibernationMixin,
                             StatusMixin, gs_grpc.GlobalSchedulerServicer):
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
        cell_order: CellOrder | None = None,
        replicas_wait_for_client_s: float = 0.0,
        idle_links_close_s: float = LAZY_LINK_IDLE_S,
        hibernate_after_s: float = 0.0,
        connect: Connect,
    ) -> None:
        self.policy = policy
        self.connect = connect  # a channel to a Local Scheduler, with this daemon's credentials
        # writes leave the lock: one writer applies them (registry_writer.py)
        self.store = RegistryWriter(store)
        self.ip = ip
        self.store_url = store_url
        self.replicas_per_kernel = replicas_per_kernel or policy.replicas_per_kernel
        self.oversubscription = oversubscription
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.silent_host_timeout_s = 0.0  # the daemon sets its config's (host_registry.check_hosts)
        # How long a reset host's replicas get to accept a connection before its node is declared
        # lost (host_registry._probe_node; 0: only the heartbeat timeout). The daemon sets its
        # config's.
        self.node_probe_timeout_s = 1.0
        self._node_probing: set[str] = set()  # hosts whose replicas are being probed
        self._node_probes: dict[str, float] = {}  # host -> when its last probe started or ended
        self._node_probe_said: dict[str, float] = {}  # host -> the outage its "node up" was for
        self.start_timeout_s = start_timeout_s
        # Most kernels held open at once (0: no limit); the daemon sets its config's, or what
        # its open-file limit leaves room for (limits.kernels_room).
        self.max_kernels = 0
        # A kernel started behind its front (Jupyter's provisioner) starts its replicas once a
        # client attaches, or after this long (0: at once). See lifecycle._finish_start.
        self.replicas_wait_for_client_s = replicas_wait_for_client_s
        self.idle_links_close_s = idle_links_close_s  # a front's unused links (front_replicas)
        # A kernel with no cell for this long hibernates (hibernation.py; 0: never). It needs
        # checkpoints: without a store nothing hibernates.
        self.hibernate_after_s = hibernate_after_s if store_url else 0.0
        self.instance_id = uuid.uuid4().hex
        self.cluster = Cluster(self.replicas_per_kernel)
        self.hosts: dict[str, HostLink] = {}
        self.kernels: dict[str, KernelEntry] = {}
        self.lock = service_lock()  # an RLock (timed per site under lock_holds.ENV)
        # effects decided under the lock, run once it is released (host_registry._defer)
        self._deferred: list[Callable[[], None]] = []
        self._seen_events: dict[str, int] = {}  # host instance -> highest event sequence
        self._died_starting: set[tuple[str, int]] = set()  # replicas that died while starting
        self._replica_exits = LoopSignal()  # fired with each: the starts' waits look again
        # A replica's kernel_info reply content: what a front answers while its replicas start.
        self.kernel_info_seen: dict | None = None
        self._recovery_guards: dict[str, asyncio.Lock] = {}  # one recovery per kernel at once
        # One membership change (a migration, a replacement joining) per kernel at once
        self._membership_guards: dict[str, asyncio.Lock] = {}
        self._orphan_suspects: dict[str, set[tuple[str, int]]] = {}  # host -> (kernel, replica)
        self._stranger_suspects: dict[str, set[tuple[str, int]]] = {}  # host -> (kernel, replica)
        self._pool = WorkPool(max_workers=16, thread_name_prefix="gs-work")
        # The next kernel's front sockets, bound ahead (front_sockets.py); first bound once
        # restore() has re-bound the known kernels' ports, so that no spare takes one of them.
        self.spare_fronts = SpareFrontSockets(ip, self._pool.submit)
        self._stop = threading.Event()
        self.on_hosts_changed: Callable[[], None] | None = None
        # The daemon's host monitor (host_monitor.py): called when a host may be due for a
        # check sooner than its timer says (host_registry._host_deadlines_changed)
        self.on_host_deadlines: Callable[[], None] | None = None
        # The policy's strategies (notebookos/policies/framework.py) choose the mechanisms:
        # the kernel mode (long-running replicas, or per-cell containers for batch and lcp:
        # kernel_modes.py), GPUs bound per cell or for the session, a warm pool (lcp).
        self.lifetime = policy.lifetime
        self.binding = policy.binding
        self.mode = kernel_mode_for(self.lifetime, self)
        self.uses_warm_pool = self.lifetime.warm_pool
        self.cell_queue_timeout_s = cell_queue_timeout_s
        self.cell_checkpoint_timeout_s = cell_checkpoint_timeout_s
        self._cell_waiters: list = []  # CellWaiter; served in the cell order (cell_queue)
        # per-cell containers' cells waiting for a host (cell_containers.py): coroutines too
        self._cell_cv = SignallingCondition(self.lock)
        self.mode.check_configuration(policy.name, store_url)
        self.on_capacity_wanted: Callable[[int], None] | None = None  # autoscaler hook
        self.migration_retries = 3
        # Cells waiting for GPUs (execution.py) wake on a release or when withdrawn.
        # Both conditions also wake the coroutines that wait on them (loop_waits.py).
        placement_lock = threading.Lock()
        self._placement_cv = SignallingCondition(placement_lock)
        self._gpu_releases = 0
        # Cells waiting for a kernel's replicas (a rebuild, replacements, a wake) wake when a
        # kernel's record changes (``_save_kernel``), or on a withdrawal or stop, as above: the
        # same lock, a condition of its own, so that the changes wake no GPU waiter.
        self._kernels_changed = SignallingCondition(placement_lock)
        self._kernel_changes = 0
        self._withdrawn_cells: set[tuple[str, str]] = set()
        # Whose turn it is among them (cell_queue.py), under _placement_cv's lock.
        self.cell_queue = CellQueue(cell_order or ArrivalOrder())
        # Prometheus: the counters and histograms are updated where each event happens; the
        # daemon serves the registry and sets metrics_address (GetClusterStatus, /sd).
        self.metrics = GlobalSchedulerMetrics(self.metrics_snapshot, policy=policy.name,
                                              version=__version__)
        self.metrics_address = ""
        # how long the loop stands still on the lock a pool thread holds (state_lock.py)
        self.lock.watch_loop(FrontLoop.shared().thread, self.metrics.loop_lock_wait.observe)
        self._loop_changes = LoopChanges(self.lock)  # the fronts' hooks' changes
        # effects of the coroutine handlers that run to their end whoever waits (lifecycle.py)
        self._effects: set = set()
        # the status queries' board, made on the loop after changes (status.py)
        self._init_status()

    # -- persistence ------------------------------------------------------------------------

    def _save_kernel(self, entry: KernelEntry) -> None:
        """Write the kernel's record; every change of a kernel's replicas or state comes
        through here, so cells waiting for its replicas look again (``_wait_for_replicas``)."""
        kernel = self.cluster.kernels.get(entry.kernel_id)
        if kernel is not None:
            self.store.put_kernel(entry.kernel_id, entry.to_doc(kernel.request.to_dict()))
        self._kernel_changed()

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
                    self.hosts[host_id].metrics_address = doc.get("metrics_address", "")
                except (KeyError, ValueError, AccountingError) as exc:
                    log.error("registry: skipping host %s: %s", host_id, exc)
            for kernel_id, doc in kernels.items():
                try:
                    self._restore_kernel(kernel_id, doc)
                except Exception as exc:  # noqa: BLE001 - one bad record must not stop the rest
                    log.exception("registry: could not restore kernel %s: %s", kernel_id, exc)
        self._run_deferred()  # the hosts' watches
        log.info("registry restored: %d host(s), %d kernel(s)", len(self.hosts),
                 len(self.kernels))
        self.spare_fronts.prepare()

    def _restore_kernel(self, kernel_id: str, doc: dict) -> None:
        request = ResourceSpec.from_dict(doc["request"])
        entry = KernelEntry(kernel_id, doc["key"], doc["signature_scheme"], doc["kernel_name"],
                            dict(doc.get("env", {})), next_replica_id=doc["next_replica_id"],
                            hints=KernelHints.from_map(doc.get("hints", {})),
                            created_unix=doc.get("created_unix", time.time()),
                            raft_removals=list(doc.get("raft_removals", [])),
                            removal_addresses={int(k): str(v) for k, v in
                                               doc.get("removal_addresses", {}).items()},
                            checkpoint_count=int(doc.get("checkpoint_count", 0)),
                            gpu_seconds=float(doc.get("gpu_seconds", 0.0)),
                            kernel_info=doc.get("kernel_info"),
                            hibernated_unix=float(doc.get("hibernated_unix", 0.0)),
                            pending_stops=[(str(h), int(r))
                                           for h, r in doc.get("pending_stops", [])])
        if doc.get("hibernated") and not doc.get("replicas"):
            entry.state = "hibernated"
            entry.message = ("hibernated (kept across a Global Scheduler restart); the next cell "
                             "wakes it")
        # The front first: if it cannot be bound, nothing of the kernel is half-restored.
        ports = doc.get("front_ports") or None
        entry.front = self._rebind_front(entry, ports)
        try:
            self.cluster.add_kernel(kernel_id, request)
            self._restore_replicas(kernel_id, doc, entry, request)
        except Exception:
            entry.front.close()
            if kernel_id in self.cluster.kernels:  # its replicas' placements go with it
                self.cluster.remove_kernel(kernel_id)
            raise
        if entry.front.ports != ports:
            self._save_kernel(entry)  # clients must learn the new ports: keep them
        entry.front.set_replicas(entry.endpoints())
        entry.front.start()
        self.kernels[kernel_id] = entry
        self.mode.restored(entry)
        if entry.state != "hibernated":
            # the idle clock starts over: armed only by a cell, it never was in this process,
            # and a notebook left alone after the restart would never hibernate (chaos.py)
            self._active(entry)

    def _rebind_front(self, entry: KernelEntry, ports: dict[str, int] | None) -> KernelFront:
        """The kernel's front on the ports its clients know. A port still held (ZMQ closes a
        listener asynchronously, a process may hold it for a moment) is waited for up to
        FRONT_REBIND_WAIT_S; one that stays taken gets the kernel new ports, said loudly: its
        replicas and state are kept, but its clients must reconnect."""
        deadline = time.monotonic() + FRONT_REBIND_WAIT_S
        while True:
            try:
                return self._new_front(entry, ports=ports)
            except zmq.ZMQError as exc:
                if not ports or exc.errno != zmq.EADDRINUSE:
                    raise
                if time.monotonic() >= deadline:
                    front = self._new_front(entry, ports=None)
                    log.error("kernel %s: its front's ports %s stay taken by another process "
                              "(%s); the kernel keeps its replicas and state on new ports %s, "
                              "and its clients must reconnect", entry.kernel_id,
                              sorted(ports.values()), exc, sorted(front.ports.values()))
                    return front
                time.sleep(0.2)

    def _restore_replicas(self, kernel_id: str, doc: dict, entry: KernelEntry,
                          request: ResourceSpec) -> None:
        for rdoc in doc["replicas"]:
            link = ReplicaLink.from_doc(rdoc)
            if link.host_id not in self.hosts:
                entry.raft_removals.append(link.replica_id)
                entry.removal_addresses[link.replica_id] = link.raft_address
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

    # -- shutdown -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the fronts (the replicas keep running: a restarted GS takes them back)."""
        self._stop.set()
        self._wake_waiting_placements()  # they see the stop now, not at their deadline
        with self.lock:
            entries = list(self.kernels.values())
            links = list(self.hosts.values())
        for entry in entries:
            if entry.front is not None:
                entry.front.close()
        for link in links:
            link.close()
        self.spare_fronts.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.store.close()  # what is pending is written first


class WorkPool(futures.ThreadPoolExecutor):
    """The service's background work (recoveries, hibernation, wakes, probes). A task that
    raises says so in the log: a bare ``submit`` drops the exception with its future (the fault
    campaign, seed 14, had a notebook stay awake for 2 minutes with nothing in the log; a
    hibernation check failing that way would look so)."""

    def submit(self, fn, /, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201
        future = super().submit(fn, *args, **kwargs)
        future.add_done_callback(background.log_failure)
        return future


    async def run(self, fn, /, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201
        """For a coroutine on a loop: ``fn`` run in the pool, awaited. Its exception is the
        awaiting coroutine's (a refused start's StartError, say), not logged here."""
        return await asyncio.wrap_future(super().submit(fn, *args, **kwargs))


def new_key() -> str:
    return secrets.token_hex(16)
