"""The Local Scheduler's link to the Global Scheduler: registration, heartbeats, replica events.

Registration is retried until the GS answers; a heartbeat answered with ``reregister`` (the GS
restarted or dropped this host) registers again with the replicas still running. Replica events
are queued and re-sent until acknowledged (the GS de-duplicates them by sequence number).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import uuid
from collections.abc import Callable

import grpc

from notebookos.local_scheduler.service import LocalSchedulerService
from notebookos.proto import common_pb2, global_scheduler_pb2
from notebookos.proto import global_scheduler_pb2_grpc as gs_grpc
from notebookos.proto.convert import resource_spec_to_proto
from notebookos.security import JoinTokens, SecurityError

log = logging.getLogger(__name__)


class GlobalSchedulerLink:
    def __init__(self, service: LocalSchedulerService, gs_address: str,
                 heartbeat_interval_s: float, prewarm_pool_size: int, *,
                 channel: grpc.Channel, tokens: JoinTokens) -> None:
        """``channel``: a mutual TLS channel to ``gs_address``; ``tokens``: the cluster join
        token every call of this link presents (re-read when its file changes)."""
        self.service = service
        self.gs_address = gs_address
        self.heartbeat_interval_s = heartbeat_interval_s
        self.prewarm_pool_size = prewarm_pool_size
        self.instance_id = uuid.uuid4().hex
        service.instance_id = self.instance_id
        self.channel = channel
        self.stub = gs_grpc.GlobalSchedulerStub(self.channel)
        self.tokens = tokens
        self._refused: str | None = None  # the last refusal logged (logged once, not per retry)
        # replica events for the Global Scheduler, in order; None wakes the sender to stop
        self._events: queue.Queue[global_scheduler_pb2.ReplicaEvent | None] = queue.Queue()
        self._event_seq = itertools.count(1)
        self._hb_seq = itertools.count(1)
        self._stop = threading.Event()
        self._registered = threading.Event()
        # called after each heartbeat: the host's own periodic duties, on no timer of their own
        self.on_heartbeat: list[Callable[[], None]] = []
        self._threads = [
            threading.Thread(target=self._heartbeat_loop, daemon=True, name="gs-heartbeat"),
            threading.Thread(target=self._event_loop, daemon=True, name="gs-events"),
        ]

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        """The join token as call metadata (never logged); raises SecurityError when the
        token file became unusable."""
        return self.tokens.metadata()

    def _log_refusal(self, what: str, exc: grpc.RpcError | SecurityError) -> None:
        """A refusal that retrying will not cure (wrong token or credentials): logged at ERROR
        once, then at DEBUG while it lasts."""
        details = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)
        message = f"{what}: {details}"
        if message != self._refused:
            self._refused = message
            log.error("%s", message)
        else:
            log.debug("%s", message)

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def report(self, event: global_scheduler_pb2.ReplicaEvent) -> None:
        event.sequence = next(self._event_seq)
        self._events.put(event)

    def drain(self, timeout_s: float) -> None:
        """Ask the Global Scheduler to move this host's replicas elsewhere before it stops
        (``DrainHost``), waiting up to ``timeout_s``. Best effort: a scheduler that cannot be
        reached or refuses leaves the replicas to stop with the host, as without a drain."""
        if timeout_s <= 0 or not self._registered.is_set():
            return
        try:
            response = self.stub.DrainHost(global_scheduler_pb2.DrainHostRequest(
                host_id=self.service.host.host_id, instance_id=self.instance_id,
                deadline_s=timeout_s), timeout=timeout_s + 5, metadata=self._metadata())
        except grpc.RpcError as exc:
            log.warning("drain: the Global Scheduler did not move the replicas (%s); they stop "
                        "with this host", exc.details())
            return
        except SecurityError as exc:
            log.warning("drain: %s", exc)
            return
        log.info("drain: %d replica(s) moved to other hosts, %d stayed%s", response.moved,
                 response.stayed, f" ({response.detail})" if response.detail else "")

    def close(self, deregister: bool, reason: str = "shutdown") -> None:
        self._stop.set()
        self._events.put(None)
        if deregister and self._registered.is_set():
            try:
                self.stub.DeregisterHost(global_scheduler_pb2.DeregisterHostRequest(
                    host_id=self.service.host.host_id, instance_id=self.instance_id,
                    reason=reason), timeout=3, metadata=self._metadata())
            except grpc.RpcError as exc:
                log.warning("deregistration failed: %s", exc.details())
            except SecurityError as exc:
                log.warning("deregistration failed: %s", exc)
        self.channel.close()

    def _set_registered(self, value: bool) -> None:
        self.service.registered = value
        if value:
            self._registered.set()
        else:
            self._registered.clear()

    def register(self) -> bool:
        host = self.service.host
        request = global_scheduler_pb2.RegisterHostRequest(
            host_id=host.host_id, address=host.address, instance_id=self.instance_id,
            capacity=resource_spec_to_proto(host.capacity),
            gpus=[common_pb2.GpuDevice(device_id=g.device_id, name=g.name, vram_gb=g.vram_gb)
                  for g in host.gpus],
            # the pool size this host keeps (its target), not how many happen to be ready now
            virtual_gpus=host.virtual_gpus, prewarm_pool_size=self.service.pool.target,
            replicas=self.service.replica_statuses(),
            metrics_address=host.metrics_address,
        )
        try:
            response = self.stub.RegisterHost(request, timeout=5, metadata=self._metadata())
        except SecurityError as exc:
            self._log_refusal(f"cannot register host {host.host_id}", exc)
            self._set_registered(False)
            return False
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                self._log_refusal(f"the Global Scheduler at {self.gs_address} refused host "
                                  f"{host.host_id}", exc)
            elif exc.code() in (grpc.StatusCode.INVALID_ARGUMENT,
                                grpc.StatusCode.ALREADY_EXISTS):
                log.error("the Global Scheduler refused host %s: %s", host.host_id, exc.details())
            elif "handshake" in (exc.details() or "").lower():  # a certificate it does not trust
                self._log_refusal(f"no TLS connection to the Global Scheduler at "
                                  f"{self.gs_address} (check security.ca_file, cert_file and "
                                  "key_file on both)", exc)
            else:
                log.debug("registration failed: %s", exc.details())
            self._set_registered(False)
            return False
        if response.heartbeat_interval_s > 0:
            self.heartbeat_interval_s = response.heartbeat_interval_s
        if response.prewarm_pool_target != self.service.pool.target:
            self.service.pool.set_target(response.prewarm_pool_target)
        self.service.forget_stale(list(response.stale_replicas))
        self._refused = None
        self._set_registered(True)
        log.info("registered host %s with the Global Scheduler at %s", host.host_id,
                 self.gs_address)
        return True

    def _heartbeat_loop(self) -> None:
        while not self._stop.is_set():
            if not self._registered.is_set():
                if not self.register():
                    self._stop.wait(min(1.0, self.heartbeat_interval_s))
                    continue
            self._heartbeat()
            for duty in self.on_heartbeat:
                try:
                    duty()
                except Exception:  # noqa: BLE001 - a duty must not stop the heartbeats
                    log.exception("after a heartbeat")
            self._stop.wait(self.heartbeat_interval_s)

    def _heartbeat(self) -> None:
        svc = self.service
        committed = svc.binder.committed_ids()
        request = global_scheduler_pb2.HeartbeatRequest(
            host_id=svc.host.host_id, instance_id=self.instance_id, sequence=next(self._hb_seq),
            subscribed=resource_spec_to_proto(svc.subscribed()),
            in_use=common_pb2.ResourceSpec(gpus=len(committed)),
            committed_gpu_device_ids=committed, replicas=svc.replica_statuses(),
            prewarm_pool_size=svc.pool.status()[1],
        )
        try:
            response = self.stub.Heartbeat(request, timeout=5, metadata=self._metadata())
        except SecurityError as exc:
            self._log_refusal("cannot send a heartbeat", exc)
            return
        except grpc.RpcError as exc:
            log.debug("heartbeat failed: %s", exc.details())
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:  # the token was rotated away
                self._log_refusal(f"the Global Scheduler at {self.gs_address} refused a "
                                  "heartbeat", exc)
                self._set_registered(False)
            elif exc.code() == grpc.StatusCode.UNAVAILABLE:
                self._set_registered(False)
            return
        if response.reregister:
            log.info("the Global Scheduler does not know this host: registering again")
            self._set_registered(False)
            self.register()

    def _event_loop(self) -> None:
        pending: global_scheduler_pb2.ReplicaEvent | None = None
        while not self._stop.is_set():
            if pending is None:
                pending = self._events.get()  # blocks until an event (or close's None)
                if pending is None:
                    return
            if not self._registered.wait(timeout=0.5):
                continue
            try:
                self.stub.ReportReplicaEvent(pending, timeout=5, metadata=self._metadata())
                pending = None
            except SecurityError as exc:
                self._log_refusal("cannot report a replica event", exc)
                self._stop.wait(0.5)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    self._set_registered(False)
                    self.register()
                elif exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    log.error("the Global Scheduler refused event %s: %s", pending,
                              exc.details())
                    pending = None
                else:
                    self._stop.wait(0.5)
