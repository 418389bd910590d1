"""What the Local Schedulers tell the Global Scheduler: registration, heartbeats, leaving, and
the replica events they report; a host silent for too long is dropped. Mixed into
``GlobalSchedulerService`` (its lock, cluster model, host links and kernel entries).

The handlers are coroutines on the loop (issue 32): the decision under the lock, awaited
(``_locked``: state_lock.py), the blocking effects (a probe of another instance, the host
links' channel work deferred under the lock) awaited in the ``gs-work`` pool."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import grpc

from notebookos.cluster import AccountingError, Host, ReplicaState
from notebookos.global_scheduler import node_probe
from notebookos.global_scheduler.hosts import HostLink, _release_timer
from notebookos.proto import global_scheduler_pb2, local_scheduler_pb2
from notebookos.proto import local_scheduler_pb2_grpc as ls_grpc
from notebookos.proto.convert import resource_spec_from_proto
from notebookos.resources import InvalidResourceSpec, ResourceSpec

log = logging.getLogger(__name__)

# How long a registration waits for the instance already registered under its host id to answer
# (a live one answers within milliseconds; a dead one refuses at once; a hung one does not).
REGISTRATION_PROBE_S = 1.0
# While a host's daemon is unreachable after a reset, its replicas are probed again this often
# (a node's processes may die a moment apart; the first probe may find one still accepting).
NODE_REPROBE_S = 1.0
# ... and every NODE_FAST_REPROBE_S for the first NODE_FAST_REPROBE_FOR_S of the outage.
NODE_FAST_REPROBE_S = 0.2
NODE_FAST_REPROBE_FOR_S = 3.0


class _Refused(Exception):
    """A registration the cluster model refused: ``args[0]`` is (code, details)."""


def _parse_registration(request: Any) -> tuple[tuple[grpc.StatusCode, str] | None,
                                                ResourceSpec | None, list[dict]]:
    """A RegisterHostRequest checked: (why it is refused (INVALID_ARGUMENT) or None, its
    capacity, its GPUs)."""
    def bad(msg: str) -> tuple[tuple[grpc.StatusCode, str], None, list]:
        return (grpc.StatusCode.INVALID_ARGUMENT, f"RegisterHostRequest.{msg}"), None, []

    if not request.host_id:
        return bad("host_id must not be empty")
    if not request.address or ":" not in request.address:
        return bad(f"address={request.address!r} must be host:port")
    try:
        capacity = resource_spec_from_proto(request.capacity, "RegisterHostRequest.capacity")
    except InvalidResourceSpec as exc:
        return (grpc.StatusCode.INVALID_ARGUMENT, str(exc)), None, []
    ids = [g.device_id for g in request.gpus]
    if capacity.gpus == 0:
        return bad("capacity offers zero GPUs: a NotebookOS host needs at least one GPU (real, "
                   "or virtual with local_scheduler.virtual_gpus >= 1)")
    if capacity.gpus != len(ids):
        return bad(f"capacity.gpus={capacity.gpus} differs from the {len(ids)} GPU(s) listed")
    if len(set(ids)) != len(ids) or any(i < 0 for i in ids):
        return bad(f"gpus has duplicate or negative device ids {ids}")
    gpus = [{"device_id": g.device_id, "name": g.name, "vram_gb": g.vram_gb}
            for g in request.gpus]
    return None, capacity, gpus


class HostRegistryMixin:
    # -- effects decided under the lock, done once it is released ----------------------------

    def _defer(self, effect: Callable[[], None]) -> None:
        """Lock held: run ``effect`` (a host link's channel closed, its watch call started)
        once the caller released the lock (``_run_deferred``). Such an effect waits for gRPC's
        threads: under the lock it held up every thread that takes it, the fronts' loop too
        (issue 32). Each effect tolerates what happened meanwhile (a watch started on a link
        closed since starts nothing; a close of a closed link does nothing)."""
        self._deferred.append(effect)

    def _run_deferred(self) -> None:
        """Lock not held: run the effects deferred so far (by any thread), in order."""
        with self.lock:
            effects, self._deferred = self._deferred, []
        for effect in effects:
            try:
                effect()
            except Exception:  # noqa: BLE001 - one link's failure must not skip the others
                log.exception("a host link's deferred effect failed")

    def _save_host(self, host_id: str) -> None:
        link, host = self.hosts[host_id], self.cluster.hosts[host_id]
        self.store.put_host(host_id, link.to_doc(host.capacity.to_dict()))

    def _add_host(self, host_id: str, address: str, instance_id: str, capacity: ResourceSpec,
                  gpus: list[dict], virtual: bool, prewarm: int) -> None:
        host = Host(host_id, capacity, address=address,
                    gpu_device_ids=[g["device_id"] for g in gpus],
                    oversubscription=self.oversubscription, virtual_gpus=virtual)
        self.cluster.add_host(host)
        self.hosts[host_id] = HostLink(host_id, address, instance_id, gpus, virtual,
                                       prewarm_pool_target=self._pool_target(prewarm),
                                       connect=self.connect, on_reset=self._host_link_reset,
                                       on_liveness=self._host_deadlines_changed)
        # its daemon's death shows at once (unreachable_since); the call starts once the lock
        # is released: starting it starts a channel's thread and waits for it (up to 44 ms)
        self._defer(self.hosts[host_id].watch)
        self._capacity_added()  # cells waiting for GPUs or a host try it now
        self._host_deadlines_changed()  # the monitor learns of its heartbeat deadline

    def _host_deadlines_changed(self) -> None:
        """A host may be due for a check sooner than the monitor's timer says (a host added,
        gone silent or unreachable, a probe ended): the daemon's ``HostMonitor.poke``, which
        returns at once (any thread, lock held or not)."""
        if self.on_host_deadlines is not None:
            self.on_host_deadlines()

    def _pool_target(self, offered: int) -> int:
        """A host's prewarm pool target: the pool it offers, or for lcp the policy's warm pool."""
        if self.uses_warm_pool:
            return self.lifetime.warm_per_host
        return offered

    async def RegisterHost(self, request, context):  # noqa: N802 - gRPC method name
        """On the loop (grpc_loop.py): the request checked here; the decision (the host added,
        readdressed or replaced, and the replicas it lost) under the lock, awaited
        (state_lock.py); the probe of another instance registered under the same id and the
        host links' channel work (``_run_deferred``) awaited in the ``gs-work`` pool; run to
        its end whoever waits, as StopKernel."""
        bad, capacity, gpus = _parse_registration(request)
        if bad is not None:
            await context.abort(*bad)
        refused, link, stale = await self._run_to_end(self._register(request, capacity, gpus))
        if refused is not None:
            await context.abort(*refused)
        return global_scheduler_pb2.RegisterHostResponse(
            scheduler_instance_id=self.instance_id,
            heartbeat_interval_s=self.heartbeat_interval_s,
            prewarm_pool_target=link.prewarm_pool_target, stale_replicas=stale)

    async def _register(self, request, capacity: ResourceSpec, gpus: list[dict],  # noqa: ANN001
                        ) -> tuple[tuple[grpc.StatusCode, str] | None, HostLink | None, list]:
        """RegisterHost's decisions and effects: why it was refused (or None), the host's
        link, and the replicas it runs that this scheduler did not place there."""
        stale: list[global_scheduler_pb2.ReplicaRef] = []
        async with self._locked():
            link = self.hosts.get(request.host_id)
            contested = link is not None and link.instance_id != request.instance_id \
                and time.time() - link.last_heartbeat < self.heartbeat_timeout_s
            old = (link.address, link.instance_id) if link is not None else None
        if contested and old is not None \
                and await self._pool.run(self._instance_answers, request.host_id, *old):
            return (grpc.StatusCode.ALREADY_EXISTS,
                    f"host {request.host_id} is registered from {old[0]} (instance "
                    f"{old[1][:8]}), which still answers; two Local Schedulers claim one "
                    "host id"), None, stale
        try:
            async with self._locked():
                link = self._register_host(request, capacity, gpus, stale)
        except _Refused as exc:
            return exc.args[0], None, stale
        finally:
            # the links' channels closed and watches started, if any
            await self._pool.run(self._run_deferred)
        await self._hosts_changed()
        return None, link, stale

    async def _hosts_changed(self) -> None:
        """Hosts came or went: ``on_hosts_changed`` (when set) told, in the ``gs-work`` pool."""
        if self.on_hosts_changed is not None:
            await self._pool.run(self.on_hosts_changed)

    def _register_host(self, request, capacity: ResourceSpec,  # noqa: ANN001
                       gpus: list[dict], stale: list) -> HostLink:
        """RegisterHost's change of the registry, lock held: returns the host's link; raises
        _Refused (a host the cluster model refuses); the caller runs what it deferred
        (``_run_deferred``)."""
        link = self.hosts.get(request.host_id)
        if link is not None:
            host = self.cluster.hosts[request.host_id]
            if host.capacity != capacity:
                # a different machine under the same id: the replicas of the old one are lost
                self._drop_host(request.host_id, "re-registered with a new capacity")
                link = None
            elif link.instance_id != request.instance_id:
                # a restarted daemon (on a new port, maybe): the replicas it took back are
                # kept (a Local Scheduler's restart loses no replica), the others are lost
                if link.address != request.address:
                    log.info("host %s re-registered from %s (was %s)", request.host_id,
                             request.address, link.address)
                    self.cluster.hosts[request.host_id].address = request.address
                # a fresh channel and watch: the old one may be backing off its reconnects
                self._defer(link.readdress(request.address))
                self._lose_unreported(request.host_id, request.replicas)
        if link is None:
            try:
                self._add_host(request.host_id, request.address, request.instance_id,
                               capacity, gpus, request.virtual_gpus, request.prewarm_pool_size)
            except (ValueError, AccountingError) as exc:
                raise _Refused((grpc.StatusCode.INVALID_ARGUMENT, str(exc))) from exc
            link = self.hosts[request.host_id]
            log.info("host %s registered at %s with %d GPU(s)", request.host_id,
                     request.address, capacity.gpus)
        link.instance_id = request.instance_id
        link.metrics_address = request.metrics_address
        link.last_heartbeat = time.time()
        link.prewarm_pool_target = self._pool_target(request.prewarm_pool_size)
        for r in request.replicas:
            # Placed replicas count as known, including those still starting.
            if not self._placed_on(request.host_id, r.kernel_id, r.replica_id):
                stale.append(global_scheduler_pb2.ReplicaRef(kernel_id=r.kernel_id,
                                                            replica_id=r.replica_id))
        self._save_host(request.host_id)
        return link

    def _instance_answers(self, host_id: str, address: str, instance_id: str) -> bool:
        """Whether the Local Scheduler instance registered for ``host_id`` still answers at its
        address (a second live daemon claiming the id), as opposed to a daemon restarted in its
        place, whose old instance no longer answers (or answers as the new instance)."""
        channel = self.connect(address)
        try:
            status = ls_grpc.LocalSchedulerStub(channel).GetHostStatus(
                local_scheduler_pb2.GetHostStatusRequest(), timeout=REGISTRATION_PROBE_S)
        except grpc.RpcError:
            return False
        finally:
            channel.close()
        return status.host.host_id == host_id and status.instance_id == instance_id

    def _lose_unreported(self, host_id: str, reported: list) -> None:  # noqa: ANN001
        """A new instance of a host's Local Scheduler registered: the replicas the old instance
        ran and the new one does not report (it took back the others) are lost. Lock held."""
        have = {(r.kernel_id, r.replica_id) for r in reported}
        for entry in list(self.kernels.values()):
            for rid, rl in list(entry.replicas.items()):
                if rl.host_id == host_id and (entry.kernel_id, rid) not in have:
                    self._lose_replica(entry, rid, f"host {host_id}'s Local Scheduler restarted "
                                       "without it")

    async def Heartbeat(self, request, context):  # noqa: N802
        """On the loop (grpc_loop.py): every host, every 2 s. A short decision under the
        lock (awaited, state_lock.py); the effects (an orphaned commitment released, a
        stranger replica stopped: calls to the host) go to the pool."""
        if not request.host_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "HeartbeatRequest.host_id must not be empty")
        await self.lock.acquire_async()  # a thread holding it delays this call, not the loop
        try:
            return self._heartbeat(request)
        finally:
            self.lock.release()

    def _heartbeat(self, request) -> global_scheduler_pb2.HeartbeatResponse:  # noqa: ANN001
        with self.lock:
            link = self.hosts.get(request.host_id)
            if link is None or link.instance_id != request.instance_id:
                return global_scheduler_pb2.HeartbeatResponse(reregister=True)
            link.last_heartbeat = time.time()
            link.prewarm_pool_size = request.prewarm_pool_size
            reported = {(r.kernel_id, r.replica_id): r for r in request.replicas}
            orphaned = []
            # what the host reports, not every kernel: a heartbeat costs the host's replicas
            for (kernel_id, rid), r in reported.items():
                entry = self.kernels.get(kernel_id)
                rl = entry.replicas.get(rid) if entry is not None else None
                if rl is not None and rl.host_id == request.host_id:
                    rl.pid = r.pid
                    if (r.committed_gpu_device_ids and not self._holds_gpus(entry, rid)
                            and not link.releasing(kernel_id, rid)):
                        orphaned.append((kernel_id, rid))
            # GPUs committed on the host for a request the GS does not know (it restarted
            # mid-cell): released when seen in two heartbeats in a row.
            suspects = self._orphan_suspects.setdefault(request.host_id, set())
            confirmed = [o for o in orphaned if o in suspects]
            suspects.clear()
            suspects.update(o for o in orphaned if o not in confirmed)
            # Replicas of a known kernel that the host runs but this instance never placed there
            # (a replacement the previous instance started just before it died): stopped when
            # seen in two heartbeats in a row, so they neither hold the host nor linger.
            unknown = {key for key in reported if key[0] in self.cluster.kernels
                       and not self._placed_on(request.host_id, *key)}
            strangers = self._stranger_suspects.setdefault(request.host_id, set())
            stale = unknown & strangers
            strangers.clear()
            strangers.update(unknown - stale)
        for kernel_id, rid in confirmed:
            self._pool.submit(self._release_orphaned, link, kernel_id, rid)
        for kernel_id, rid in stale:
            log.warning("kernel %s: host %s runs replica %d, which this scheduler did not place "
                        "there; stopping it", kernel_id, request.host_id, rid)
            self._pool.submit(self._stop_replica_quietly, request.host_id, kernel_id, rid)
        return global_scheduler_pb2.HeartbeatResponse(
            prewarm_pool_target=link.prewarm_pool_target,
            heartbeat_interval_s=self.heartbeat_interval_s)

    def _placed_on(self, host_id: str, kernel_id: str, replica_id: int) -> bool:
        """Whether the cluster model has this replica placed on this host (running or starting).
        Lock held."""
        kernel = self.cluster.kernels.get(kernel_id)
        placed = kernel.replicas.get(replica_id) if kernel is not None else None
        return placed is not None and placed.host_id == host_id

    async def DeregisterHost(self, request, context):  # noqa: N802
        """On the loop: the host dropped (its replicas lost, their replacements handed to the
        pool) under the lock, awaited; its link's channel closed in the ``gs-work`` pool,
        awaited; run to its end whoever waits."""
        lost = await self._run_to_end(self._deregister(
            request.host_id, request.reason or "deregistered"))
        if lost is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"host {request.host_id!r} is not registered")
        return global_scheduler_pb2.DeregisterHostResponse(replicas_lost=lost)

    async def _deregister(self, host_id: str, reason: str) -> int | None:
        """DeregisterHost's decision and effects: the replicas lost, None for a host not
        registered."""
        async with self._locked():
            if host_id not in self.hosts:
                return None
            lost = self._drop_host(host_id, reason)
        await self._pool.run(self._run_deferred)
        await self._hosts_changed()
        return lost

    def _drop_host(self, host_id: str, reason: str) -> int:
        """Forget a host; its replicas are lost and replaced elsewhere. Caller holds the lock,
        and runs ``_run_deferred`` once it released it (the link's close)."""
        lost = 0
        for entry in list(self.kernels.values()):
            for rid, rl in list(entry.replicas.items()):
                if rl.host_id == host_id:
                    self._lose_replica(entry, rid, f"host {host_id} {reason}")
                    self.metrics.replica_failures.labels(cause="host_lost").inc()
                    lost += 1
        host = self.cluster.hosts.get(host_id)
        if host is not None:
            for owner in list(host.owners):
                host.release_owner(owner)
            self.cluster.remove_host(host_id)
        link = self.hosts.pop(host_id, None)
        if link is not None:
            # closed once the lock is released: closing a channel waits for gRPC's thread
            self._defer(link.close)
        self.store.delete_host(host_id)
        log.warning("host %s removed (%s); %d replica(s) lost", host_id, reason, lost)
        return lost

    def check_hosts(self) -> None:
        """Declare dead the hosts silent for longer than the heartbeat timeout, and those
        that answered no keepalive ping for ``silent_host_timeout_s`` (hosts.py)."""
        now = time.time()
        timeout = self.silent_host_timeout_s
        with self.lock:
            silent = {}
            for h, link in self.hosts.items():
                if now - link.last_heartbeat > self.heartbeat_timeout_s:
                    silent[h] = f"missed heartbeats for {self.heartbeat_timeout_s:g}s"
                elif timeout > 0 and link.silent_since and now - link.silent_since >= timeout:
                    silent[h] = (f"answered no keepalive ping for {now - link.silent_since:.1f}s "
                                 "after the first went unanswered: its machine or network is "
                                 "gone")
            for host_id, why in silent.items():
                self._drop_host(host_id, why)
            reprobe = [h for h, link in self.hosts.items()
                       if link.unreachable_since and not link.silent_since
                       and now - self._node_probes.get(h, 0.0) >= NODE_REPROBE_S]
            if self.node_probe_timeout_s > 0:
                for h in reprobe:  # its probe sets it again when it starts and ends
                    self._node_probes[h] = now
        self._run_deferred()
        if silent and self.on_hosts_changed is not None:
            self.on_hosts_changed()
        for host_id in reprobe:
            self._host_link_reset(host_id)

    def listening(self) -> None:
        """The gRPC server listens from now on: the hosts restored from the registry get a
        whole heartbeat timeout from now (none could heartbeat while it restored)."""
        now = time.time()
        with self.lock:
            for link in self.hosts.values():
                link.last_heartbeat = max(link.last_heartbeat, now)

    def next_host_deadline(self) -> float | None:
        """The earliest moment (``time.time()``) at which ``check_hosts`` could find something
        to do: a host's heartbeat timeout, a silent host's timeout, the reprobe of an
        unreachable one (not while its probe runs: its end pokes the monitor). None without
        hosts (a registration pokes the monitor)."""
        timeout = self.silent_host_timeout_s
        with self.lock:
            due = []
            for h, link in self.hosts.items():
                due.append(link.last_heartbeat + self.heartbeat_timeout_s)
                if timeout > 0 and link.silent_since:
                    due.append(link.silent_since + timeout)
                if (link.unreachable_since and not link.silent_since
                        and self.node_probe_timeout_s > 0 and h not in self._node_probing):
                    due.append(self._node_probes.get(h, 0.0) + NODE_REPROBE_S)
            return min(due, default=None)

    # -- a node lost, or only its daemon (node_probe.py) --------------------------------------

    def _host_link_reset(self, host_id: str) -> None:
        """A host's daemon closed or reset its connection: find out, on a worker, whether its
        node is gone with it. Called on gRPC's thread, so it takes no lock: ``_drop_host``
        closes a channel under the lock, which waits for gRPC's thread."""
        if self.node_probe_timeout_s <= 0:
            return
        try:
            self._pool.submit(self._probe_node, host_id)
        except RuntimeError:  # the pool is shut down: the daemon is stopping
            pass

    def _probe_node(self, host_id: str) -> None:
        with self.lock:
            if host_id in self._node_probing:
                return
            self._node_probing.add(host_id)
            self._node_probes[host_id] = time.time()
        try:
            self._probe_node_once(host_id)
        except Exception:  # noqa: BLE001 - the heartbeat timeout still decides
            log.exception("probing host %s's replicas failed", host_id)
        finally:
            with self.lock:
                self._node_probing.discard(host_id)
                self._node_probes[host_id] = time.time()
            self._host_deadlines_changed()  # its reprobe is due from now on

    def _node_replicas(self, host_id: str) -> dict[tuple[str, int], tuple[str, int]]:
        """(kernel, replica) -> (ip, shell port) of every replica placed on the host, the
        port 0 while unknown. Lock held."""
        return {(entry.kernel_id, rid): (rl.endpoint.ip, rl.endpoint.shell_port)
                for entry in self.kernels.values() for rid, rl in entry.replicas.items()
                if rl.host_id == host_id}

    def _probe_node_once(self, host_id: str) -> None:
        """Declare the host lost now if its daemon does not answer and none of its replicas
        accepts a connection (its node is gone: a restarted daemon's replicas run on). A host
        with no replica, or one whose port is not known yet, is left to the heartbeat
        timeout: its daemon's reset alone does not tell a lost node from a restart."""
        with self.lock:
            link = self.hosts.get(host_id)
            if link is None or not link.unreachable_since or link.silent_since:
                return
            instance, since = link.instance_id, link.unreachable_since
            replicas = self._node_replicas(host_id)
        if not replicas or any(not port for _, port in replicas.values()):
            return
        results = node_probe.probe_ports(list(replicas.values()), self.node_probe_timeout_s)
        gone = (node_probe.REFUSED, node_probe.UNREACHABLE, node_probe.NO_ANSWER)
        if not all(results.get(a) in gone for a in replicas.values()):
            if time.time() - since < NODE_FAST_REPROBE_FOR_S:
                # a node's processes die a moment apart: look again soon, not at the next check
                _release_timer().after(NODE_FAST_REPROBE_S,
                                      lambda: self._host_link_reset(host_id))
            if self._node_probe_said.get(host_id) != since:
                self._node_probe_said[host_id] = since
                log.info("host %s: its Local Scheduler does not answer, but its replicas accept "
                         "connections: taken for a daemon restart (its node is up)", host_id)
            return
        counts: dict[str, int] = {}
        for a in replicas.values():
            counts[results[a]] = counts.get(results[a], 0) + 1
        how = ", ".join(f"{why}: {n}" for why, n in sorted(counts.items()))
        with self.lock:
            link = self.hosts.get(host_id)
            # back meanwhile (re-registered, or answers again), or a replica placed since
            if link is None or link.instance_id != instance or not link.unreachable_since \
                    or self._node_replicas(host_id) != replicas:
                return
            self._drop_host(host_id, f"its Local Scheduler's connection was reset and none of "
                            f"its {len(replicas)} replica(s) accepts a connection ({how}): the "
                            "node is gone")
        self._run_deferred()
        if self.on_hosts_changed is not None:
            self.on_hosts_changed()

    # -- replica events (reported by the hosts) -----------------------------------------------

    async def ReportReplicaEvent(self, request, context):  # noqa: N802
        """On the loop (grpc_loop.py): a decision under the lock; what it sets off (a
        replacement, the front's new replicas, the registry write) is handed to the pool, the
        front's loop command queue and the registry writer, none waited for here. The lock
        is awaited: a thread holding it delays this call, not the loop."""
        await self.lock.acquire_async()
        try:
            ack = self._replica_event(request)
        finally:
            self.lock.release()
        if ack is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"host {request.host_id!r} is not registered")
        return ack

    def _replica_event(self, request) -> global_scheduler_pb2.ReplicaEventAck | None:  # noqa: ANN001
        """ReportReplicaEvent's change; None when the host is not registered."""
        with self.lock:
            link = self.hosts.get(request.host_id)
            if link is None:
                return None
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
                    self._replica_exits.fire()
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
                if entry.state == "stopping":  # shut down on purpose: it is simply gone
                    kernel = self.cluster.kernels.get(entry.kernel_id)
                    replica = kernel.replicas.get(request.replica_id) if kernel else None
                    if replica is not None:
                        replica.state = ReplicaState.STOPPED
                else:
                    # a replica still starting: its start stops waiting for its reply at once
                    self._died_starting.add((request.kernel_id, request.replica_id))
                    self._replica_exits.fire()
                    why = "died" if kind == global_scheduler_pb2.REPLICA_EVENT_KIND_DIED \
                        else "exited"
                    self.metrics.replica_failures.labels(cause=why).inc()
                    self._lose_replica(entry, request.replica_id,
                                       f"replica {request.replica_id} {why} (exit code "
                                       f"{request.exit_code})")
        return global_scheduler_pb2.ReplicaEventAck(known=True)
