"""Starting and stopping replica processes through the Local Schedulers: placing new replicas
(where the policy says, or on a given host), starting them in parallel, joining them to a running
Raft group, waiting until they answer. Mixed into ``GlobalSchedulerService``.

A coroutine on the loop awaits ``_add_replicas``: its Local Scheduler calls run in the
``gs-work`` pool, its wait until they answer on the loop (readiness.py), holding no thread."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from notebookos.cluster import AccountingError, Host, Kernel, ReplicaState
from notebookos.global_scheduler.cell_front import CellFront
from notebookos.global_scheduler.cycle_runner import REPLICAS, CycleRunnerMixin
from notebookos.global_scheduler.errors import StartError
from notebookos.global_scheduler.front import ReplicaEndpoint
from notebookos.global_scheduler.kernels import KernelEntry, ReplicaLink
from notebookos.global_scheduler.readiness import ready
from notebookos.policies.cycle import Action, Status
from notebookos.ports import raft_port
from notebookos.proto import local_scheduler_pb2
from notebookos.proto.convert import resource_spec_to_proto
from notebookos.resources import ResourceSpec

log = logging.getLogger(__name__)
T = TypeVar("T")
# (the group's ready members, [(replica id, host link, Raft address)], the Raft peers, the
# request as protobuf): what ``_plan_replicas`` chose, for ``_add_replicas`` to start.
ReplicaPlan = tuple[list, list, list, Any]


@dataclass
class _Launch:
    """Replicas started by their Local Schedulers (``_launch_replicas``), for the wait until
    they answer and what follows (``_settle_replicas``)."""

    kernel_id: str
    entry: KernelEntry
    plan: list
    started: dict[int, ReplicaLink]
    errors: list[str]
    t_started: float
    t_added: float
    ready: set[int] = field(default_factory=set)  # the replicas that answered
    infos: dict[int, dict] = field(default_factory=dict)  # their kernel_info replies


class ReplicaStarterMixin(CycleRunnerMixin):
    def _start_retrying(self, kernel_id: str, what: str, start: Callable[[], T]) -> T:
        """``start()``, tried up to three times: a process can lose a port race at start. A
        host without the resources (RESOURCE_EXHAUSTED) is not retried."""
        for attempt in range(3):
            try:
                return start()
            except StartError as exc:
                _retry_or_raise(kernel_id, what, attempt, exc)
        raise AssertionError("unreachable")

    async def _start_retrying_async(self, kernel_id: str, what: str,
                                    start: Callable[[], Awaitable[T]]) -> T:
        """``_start_retrying`` on the loop: ``await start()``, tried up to three times."""
        for attempt in range(3):
            try:
                return await start()
            except StartError as exc:
                _retry_or_raise(kernel_id, what, attempt, exc)
        raise AssertionError("unreachable")

    def _plan_replicas(self, kernel_id: str, count: int, *, join: bool,
                       on_host: str | None = None) -> ReplicaPlan:
        """Choose the hosts of ``count`` new replicas and take their ids (in the cluster model
        and the stored registry); raises StartError (RESOURCE_EXHAUSTED: no hosts)."""
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
            if on_host is not None:  # decided already (a cell's container, a replacement)
                hosts = [self.cluster.hosts[on_host]] if on_host in self.cluster.hosts else None
                reserve = self.binding.binds_at_placement
            else:
                hosts, reserve = self._decide_replica_hosts(kernel_id, kernel.request, count,
                                                            occupied)
            if hosts is None:
                unavailable = len(set(occupied) | self._unavailable_hosts())
                raise StartError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                 self._why_no_hosts(kernel.request, count, unavailable))
            plan = []
            # One new replica needs no address known in advance (a group of one; a replacement
            # announces the address its host answers with in add_replica_request): its host
            # picks a port it can bind (port 0). Several founders must know each other's
            # addresses first: drawn from the range kept for Raft, never a port this scheduler
            # gave another replica on that host (a taken port kills the replica at start).
            taken = self._raft_ports_in_use()
            for host in hosts:
                rid = entry.next_replica_id
                entry.next_replica_id += 1
                self.cluster.place_replica(kernel_id, rid, host.host_id)
                ip = self.hosts[host.host_id].ip
                port = 0 if len(hosts) == 1 else raft_port(taken.setdefault(ip, set()))
                if port:
                    taken[ip].add(port)
                plan.append((rid, self.hosts[host.host_id], f"{ip}:{port}"))
            if reserve:
                self._reserve_session_gpus(entry, kernel, plan)
            peers = [local_scheduler_pb2.RaftPeer(replica_id=r.replica_id,
                                                  address=r.raft_address)
                     for r in entry.replicas.values()]
            peers += [local_scheduler_pb2.RaftPeer(replica_id=rid, address=raft)
                      for rid, _, raft in plan]
            request_spec = resource_spec_to_proto(kernel.request)
            self._save_kernel(entry)  # the ids are taken, even if this instance dies now
        return members, plan, peers, request_spec

    def _decide_replica_hosts(self, kernel_id: str, request: ResourceSpec, count: int,
                              occupied: list[str]) -> tuple[list[Host] | None, bool]:
        """The container cycle (``notebookos.policies.container_cycle``): the hosts of
        ``count`` new replicas (None: not now), and whether the session's GPUs are set aside
        on the first (the decision's ``RESERVE``). Lock held."""
        snapshot, result = self._decide_containers(request, count, exclude=occupied)
        self._record_cycle(snapshot, kernel_id, request, result, REPLICAS, count)
        if result.status is Status.ERROR:
            raise StartError(grpc.StatusCode.INTERNAL, f"kernel {kernel_id}: {result.reason}")
        if not result.placed:
            return None, False
        return [self.cluster.hosts[h] for h in result.hosts], result.action is Action.RESERVE

    def _reserve_session_gpus(self, entry: KernelEntry, kernel: Kernel, plan: list) -> None:
        """The effect of a ``RESERVE`` decision (reservation binds GPUs for the kernel's
        life): set them aside in the model on the first planned replica's host as soon as
        the host is chosen, under the lock. They are committed once the replica runs
        (_bind_for_session converts the reservation); until then kernels started at the
        same moment saw the same idle GPUs, chose the same host, and all but one failed to
        bind (found by the replay: 9 of 10 on a Sensei slice)."""
        if (not self.mode.reserves_session_gpus or entry.session_gpus
                or entry.replicas or not plan or kernel.request.gpus <= 0):
            return
        rid, link, _ = min(plan, key=lambda p: p[0])  # the replica _bind_for_session binds
        try:
            self.cluster.hosts[link.host_id].reserve(kernel.replicas[rid].owner, kernel.request)
        except (AccountingError, KeyError) as exc:
            log.info("kernel %s: GPUs not set aside on %s: %s", kernel.kernel_id,
                     link.host_id, exc)

    async def _add_replicas(self, kernel_id: str, count: int, *, join: bool,
                                  on_host: str | None = None, restore: bool = False,
                                  prewarmed: bool = True,
                                  extra_env: dict[str, str] | None = None,
                                  planned: ReplicaPlan | None = None) -> list[int]:
        """Place ``count`` new replicas (on ``on_host`` when given, else where the policy says;
        or as ``planned`` by ``_plan_replicas``), start them (from the host's prewarm pool when
        ``prewarmed`` and it has one), wait until they answer; returns their ids. Raises
        StartError. On the loop: the placement, the Local Schedulers' calls and what follows
        awaited in the ``gs-work`` pool; the wait for the replicas to answer on the loop
        itself (readiness.ready), holding no thread."""
        pool = self._pool
        if planned is None:
            planned = await pool.run(self._plan_replicas, kernel_id, count, join=join,
                                     on_host=on_host)
        launch = await pool.run(self._launch_replicas, kernel_id, planned, join=join,
                                restore=restore, prewarmed=prewarmed, extra_env=extra_env)
        if not launch.errors:
            launch.ready = await ready(*self._readiness_args(launch))
        return await pool.run(self._settle_replicas, launch)

    def _launch_replicas(self, kernel_id: str, planned: ReplicaPlan, *, join: bool,
                         restore: bool = False, prewarmed: bool = True,
                         extra_env: dict[str, str] | None = None) -> _Launch:
        """The planned replicas started by their Local Schedulers (in parallel) and, when
        ``join``, added to the kernel's Raft group; blocks. What failed is in the result's
        ``errors``. Raises StartError (ABORTED) for a kernel stopped before."""
        members, plan, peers, request_spec = planned
        with self.lock:
            entry = self.kernels.get(kernel_id)
        if entry is None:
            raise StartError(grpc.StatusCode.ABORTED,
                             f"kernel {kernel_id} was stopped before its replicas started")
        calls = {}
        requests = {}
        for rid, link, raft in plan:
            req = requests[rid] = local_scheduler_pb2.StartReplicaRequest(
                kernel_id=kernel_id, replica_id=rid, raft_address=raft,
                raft_peers=[p for p in peers if p.replica_id != rid], store_url=self.store_url,
                key=entry.key, signature_scheme=entry.signature_scheme, resources=request_spec,
                use_prewarmed=prewarmed, join_existing_group=join,
                restore_from_checkpoint=restore, env={**entry.env, **(extra_env or {})},
                kernel_name=entry.kernel_name, gpu_sharing=self._may_share(entry))
            calls[rid] = (link, raft, link.stub.StartReplica.future(req, timeout=60))
        started: dict[int, ReplicaLink] = {}
        errors = []
        for rid, (link, raft, fut) in calls.items():
            try:
                try:
                    resp = fut.result()
                except grpc.RpcError as exc:
                    # the host runs a replica of this kernel that this scheduler does not know
                    # (one a wake or a replacement started just before the scheduler died):
                    # it goes, and the start is tried again there
                    if exc.code() != grpc.StatusCode.ALREADY_EXISTS \
                            or not self._stop_strangers(link, kernel_id):
                        raise
                    resp = link.stub.StartReplica(requests[rid], timeout=60)
            except grpc.RpcError as exc:
                errors.append(f"host {link.host_id}: {exc.details()}")
                continue
            c = resp.connection
            started[rid] = ReplicaLink(
                rid, link.host_id,
                ReplicaEndpoint(rid, c.ip, c.shell_port, c.iopub_port, c.stdin_port,
                                c.control_port, link.host_id),
                resp.raft_address or raft, resp.pid, from_prewarm_pool=resp.from_prewarm_pool)
        t_started = time.monotonic()
        if not errors and join:
            with self.lock:  # a member until proven ready: taken out again unless it gets there
                for rid, r in started.items():
                    entry.raft_removals.append(rid)
                    entry.removal_addresses[rid] = r.raft_address
                self._save_kernel(entry)
            for rid, r in started.items():
                try:
                    self._membership_change(entry, members, "add_replica_request",
                                            {"replica_id": rid, "raft_address": r.raft_address})
                except StartError as exc:
                    errors.append(str(exc))
        t_added = time.monotonic()
        return _Launch(kernel_id, entry, plan, started, errors, t_started, t_added)

    def _readiness_args(self, launch: _Launch) -> tuple:
        """What the wait for ``launch``'s replicas to answer is given (readiness.ready): it
        stops early for a replica that died starting, and keeps their kernel_info replies."""
        kernel_id = launch.kernel_id
        return ([r.endpoint for r in launch.started.values()], launch.entry.key,
                launch.entry.signature_scheme, self.start_timeout_s,
                lambda rid: (kernel_id, rid) not in self._died_starting, launch.infos,
                self._replica_exits)

    def _settle_replicas(self, launch: _Launch) -> list[int]:
        """After the wait: the started replicas become the kernel's (their ids returned), or,
        for one that failed or a kernel stopped meanwhile, they are all stopped again and
        StartError raised; blocks (Local Scheduler calls)."""
        kernel_id, entry, plan = launch.kernel_id, launch.entry, launch.plan
        started, errors, infos = launch.started, launch.errors, launch.infos
        if not errors:
            errors = [f"replica {rid} on host {r.host_id} "
                      + ("died while starting" if (kernel_id, rid) in self._died_starting
                         else f"did not answer within {self.start_timeout_s:g}s")
                      for rid, r in started.items() if rid not in launch.ready]
            log.info("kernel %s: replicas %s membership %.2fs, ready %.2fs", kernel_id,
                     sorted(started), launch.t_added - launch.t_started,
                     time.monotonic() - launch.t_added)
        with self.lock:
            stopped = self.kernels.get(kernel_id) is not entry  # StopKernel while they started
        if stopped:
            for rid, r in started.items():
                self._stop_replica_quietly(r.host_id, kernel_id, rid)
            raise StartError(grpc.StatusCode.ABORTED,
                             f"kernel {kernel_id} was stopped while its replicas started")
        if errors:
            for rid, r in started.items():
                self._stop_replica_quietly(r.host_id, kernel_id, rid)
            with self.lock:
                kernel = self.cluster.kernels.get(kernel_id)
                for rid, _, _ in plan:
                    if kernel is not None and rid in kernel.replicas:
                        self.cluster.remove_replica(kernel_id, rid)
            code = grpc.StatusCode.DEADLINE_EXCEEDED if any("did not answer" in e
                                                            for e in errors) \
                else grpc.StatusCode.UNAVAILABLE
            raise StartError(code, f"kernel {kernel_id}: could not start replicas: "
                             + "; ".join(errors))
        with self.lock:
            if infos:
                self.kernel_info_seen = next(iter(infos.values()))
            if infos and entry.kernel_info is None:
                entry.kernel_info = next(iter(infos.values()))
                if isinstance(entry.front, CellFront) and entry.front.kernel_info is None:
                    entry.front.kernel_info = entry.kernel_info
            for rid, r in started.items():
                r.ready = True
                entry.replicas[rid] = r
                if rid in entry.raft_removals:
                    entry.raft_removals.remove(rid)
                entry.removal_addresses.pop(rid, None)
                replica = self.cluster.kernels[kernel_id].replicas[rid]
                replica.state = ReplicaState.RUNNING
                replica.pid = r.pid
            if entry.front is not None:
                entry.front.set_replicas(entry.endpoints())
            self._save_kernel(entry)
        return sorted(started)

    def _raft_ports_in_use(self) -> dict[str, set[int]]:
        """The Raft ports of every replica this scheduler knows, by IP. Lock held."""
        taken: dict[str, set[int]] = {}
        for entry in self.kernels.values():
            for r in entry.replicas.values():
                ip, _, port = r.raft_address.rpartition(":")
                if port.isdigit():
                    taken.setdefault(ip, set()).add(int(port))
        return taken

    def _why_no_hosts(self, request: ResourceSpec, count: int, occupied: int) -> str:
        total = len(self.cluster.hosts)
        fit = sum(1 for h in self.cluster.hosts.values() if request.fits_within(h.capacity))
        if fit == 0:
            return (f"no host can hold the request ({request}) at all: "
                    f"{total} host(s) registered")
        return (f"need {count} more distinct host(s) for the request ({request}); "
                f"{fit} of {total} host(s) could hold it but not within the subscription "
                f"limits ({occupied} already hold a replica)")

    def _stop_strangers(self, link, kernel_id: str) -> bool:  # noqa: ANN001 - a HostLink
        """Stop the replicas of ``kernel_id`` that the host runs and this scheduler neither
        knows nor has placed there; whether there were any."""
        try:
            status = link.stub.GetHostStatus(local_scheduler_pb2.GetHostStatusRequest(),
                                             timeout=10)
        except grpc.RpcError:
            return False
        with self.lock:
            strangers = [r.replica_id for r in status.replicas if r.kernel_id == kernel_id
                         and not self._placed_on(link.host_id, kernel_id, r.replica_id)]
        for replica_id in strangers:
            log.warning("kernel %s: host %s runs replica %d, which this scheduler did not "
                        "place there (started before it restarted); stopping it to start "
                        "another", kernel_id, link.host_id, replica_id)
            self._stop_replica_quietly(link.host_id, kernel_id, replica_id)
        return bool(strangers)

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


def _retry_or_raise(kernel_id: str, what: str, attempt: int, exc: StartError) -> None:
    """A start that failed: raises ``exc`` when it is not tried again (no resources, the
    kernel stopped, the third attempt), else logs it."""
    if exc.code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED) or attempt == 2:
        raise exc
    log.warning("kernel %s: %s attempt %d failed: %s", kernel_id, what, attempt + 1, exc)
