"""Running cells: which replica executes, GPU commit and release, migration when every replica's
host is busy. Mixed into ``GlobalSchedulerService`` (it uses the service's lock, cluster model,
host links and kernel entries); the kernel fronts call these hooks on their own threads."""

from __future__ import annotations

import logging
import time

import grpc

from notebookos.cluster import AccountingError
from notebookos.global_scheduler.errors import StartError
from notebookos.global_scheduler.front import PlacementFailed
from notebookos.global_scheduler.hosts import HostLink
from notebookos.global_scheduler.kernels import KernelEntry
from notebookos.proto import local_scheduler_pb2
from notebookos.resources import ResourceSpec

log = logging.getLogger(__name__)


class ExecutionMixin:
    def _wait_for_replicas(self, kernel_id: str) -> None:
        """A cell that arrives while the kernel has no replica because it is being rebuilt or
        its replacements are starting waits for them (up to the replica start timeout) instead
        of failing at once."""
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline and not self._stop.is_set():
            with self.lock:
                entry = self.kernels.get(kernel_id)
                if entry is None or entry.replicas or entry.state in ("stopping", "failed"):
                    return
            self._stop.wait(0.1)

    def place_execute(self, kernel_id: str, msg_id: str, metadata: dict) -> tuple[int, list[int]]:
        started = time.monotonic()
        try:
            placed = self._place_execute(kernel_id, msg_id, metadata)
        except PlacementFailed:
            self.metrics.cell_failures.inc()
            raise
        self.metrics.cell_queue.observe(time.monotonic() - started)
        return placed

    def _place_execute(self, kernel_id: str, msg_id: str, metadata: dict) -> tuple[int, list[int]]:
        if self.per_cell:
            with self.lock:
                entry = self.kernels.get(kernel_id)
                kernel = self.cluster.kernels.get(kernel_id)
                if entry is None or kernel is None:
                    raise PlacementFailed(f"kernel {kernel_id} is not known to the scheduler")
                entry.cell_arrived[msg_id] = time.monotonic()
                request = kernel.request
            return self.place_cell(kernel_id, msg_id, request)
        self._wait_for_replicas(kernel_id)
        with self.lock:
            entry = self.kernels.get(kernel_id)
            kernel = self.cluster.kernels.get(kernel_id)
            if entry is None or kernel is None:
                raise PlacementFailed(f"kernel {kernel_id} is not known to the scheduler")
            request = kernel.request
            entry.cell_arrived[msg_id] = time.monotonic()
            if len(entry.cell_arrived) > 1024:  # cells that never started (failed placement)
                entry.cell_arrived.pop(next(iter(entry.cell_arrived)))
            if entry.session_gpus is not None and entry.session_gpus[0] in entry.replicas:
                rid, host_id, ids = entry.session_gpus
                entry.executions[msg_id] = (rid, host_id)
                entry.last_cell_gpus[rid] = list(ids)
                return rid, list(ids)
            order = self._executor_order(kernel, request)
            links = {rid: (entry.replicas[rid].host_id, self.hosts.get(entry.replicas[rid].host_id))
                     for rid in order if rid in entry.replicas}
        reasons = []
        for rid in order:
            host_id, link = links.get(rid, ("?", None))
            if link is None:
                continue
            device_ids, reason = link.commit_gpus(kernel_id, rid, msg_id, request.gpus)
            if device_ids is None:
                reasons.append(reason)
                continue
            with self.lock:
                self._record_commit(entry, kernel, msg_id, rid, host_id, request, device_ids)
            return rid, device_ids
        why = ("; ".join(reasons) if reasons else "the kernel has no replica to run the cell")
        if not self.policy.supports_migration or not reasons:
            raise PlacementFailed(f"no replica's host can bind {request.gpus} GPU(s) now: {why}")
        return self._migrate_and_commit(kernel_id, msg_id, request, why)

    def _migrate_and_commit(self, kernel_id: str, msg_id: str, request: ResourceSpec,
                            why: str) -> tuple[int, list[int]]:
        """Every replica's host is busy: move one replica to a host that can bind the GPUs now
        (a prewarmed process there if it has one), then commit there. Retries with backoff."""
        attempts = max(1, self.migration_retries)
        last = why
        for attempt in range(attempts):
            try:
                rid, host_id = self.migrate_replica(kernel_id, None, None, request,
                                                     reason="contention")
            except StartError as exc:
                last = str(exc)
                if self.on_capacity_wanted is not None:
                    self.on_capacity_wanted(request.gpus)
                self._stop.wait(min(4.0, 0.5 * 2 ** attempt))
                continue
            link = self.hosts.get(host_id)
            if link is None:
                continue
            device_ids, reason = link.commit_gpus(kernel_id, rid, msg_id, request.gpus)
            if device_ids is None:
                last = reason
                continue
            with self.lock:
                entry = self.kernels.get(kernel_id)
                kernel = self.cluster.kernels.get(kernel_id)
                if entry is None or kernel is None:
                    raise PlacementFailed(f"kernel {kernel_id} was stopped during migration")
                self._record_commit(entry, kernel, msg_id, rid, host_id, request, device_ids)
            return rid, device_ids
        raise PlacementFailed(
            f"every replica's host is busy ({why}) and migrating a replica failed after "
            f"{attempts} attempt(s): {last}")

    def _record_commit(self, entry: KernelEntry, kernel, msg_id: str, rid: int,  # noqa: ANN001
                       host_id: str, request: ResourceSpec, device_ids: list[int]) -> None:
        """A Local Scheduler committed GPUs for ``rid``: mirror it in the cluster model and
        remember the executor and the cell's GPUs. Called with the lock held."""
        host = self.cluster.hosts.get(host_id)
        replica = kernel.replicas.get(rid)
        if host is not None and replica is not None:
            try:
                host.commit(replica.owner, request, device_ids)
            except AccountingError as exc:
                log.warning("accounting differs from host %s: %s", host_id, exc)
        kernel.executor = rid
        entry.executions[msg_id] = (rid, host_id)
        entry.last_cell_gpus[rid] = device_ids

    def _executor_order(self, kernel, request: ResourceSpec) -> list[int]:  # noqa: ANN001
        decision = self.policy.choose_executor(self.cluster, kernel, request)
        live = [r.replica_id for r in kernel.live_replicas()]

        def idle(rid: int) -> int:
            host = self.cluster.hosts.get(kernel.replicas[rid].host_id)
            return host.idle_gpus if host is not None else -1

        rest = sorted((r for r in live if r != decision.replica_id), key=idle, reverse=True)
        return ([decision.replica_id] if decision.replica_id is not None else []) + rest

    def release_execute(self, kernel_id: str, msg_id: str) -> None:
        with self.lock:
            entry = self.kernels.get(kernel_id)
            held = entry.executions.pop(msg_id, None) if entry is not None else None
            if held is None:
                return
            rid, host_id = held
            if entry.session_gpus is not None:
                return  # bound for the kernel's life, released when it stops
            host = self.cluster.hosts.get(host_id)
            kernel = self.cluster.kernels.get(kernel_id)
            replica = kernel.replicas.get(rid) if kernel is not None else None
            if host is not None and replica is not None \
                    and host.commitment_of(replica.owner) is not None:
                host.release(replica.owner)
            link = self.hosts.get(host_id)
        if link is not None:  # not waited for: the front forwards the idle meanwhile
            link.release_gpus_async(local_scheduler_pb2.ReleaseGpusRequest(
                kernel_id=kernel_id, replica_id=rid, request_id=msg_id))
        if self.per_cell:
            self._cell_released(kernel_id)

    def execute_started(self, kernel_id: str, replica_id: int, msg_id: str) -> None:
        with self.lock:
            entry = self.kernels.get(kernel_id)
            arrived = entry.cell_arrived.pop(msg_id, None) if entry is not None else None
            if arrived is not None:
                now = time.monotonic()
                entry.last_interactivity_ms[replica_id] = (now - arrived) * 1000
                entry.kernel_interactivity_ms = entry.last_interactivity_ms[replica_id]
                self.metrics.cell_interactivity_delay.observe(now - arrived)

    def execute_finished(self, kernel_id: str, replica_id: int, msg_id: str) -> None:
        with self.lock:
            kernel = self.cluster.kernels.get(kernel_id)
            if kernel is not None and replica_id in kernel.replicas:
                kernel.executor = replica_id

    def _holds_gpus(self, entry: KernelEntry, replica_id: int) -> bool:
        if entry.session_gpus is not None and entry.session_gpus[0] == replica_id:
            return True
        return any(rid == replica_id for rid, _ in entry.executions.values())

    def _release_orphaned(self, link: HostLink, kernel_id: str, replica_id: int) -> None:
        with self.lock:
            entry = self.kernels.get(kernel_id)
            if entry is None or self._holds_gpus(entry, replica_id):
                return
        log.warning("kernel %s: releasing GPUs replica %d holds on %s for a request this "
                    "scheduler does not know", kernel_id, replica_id, link.host_id)
        try:
            link.stub.ReleaseGpus(local_scheduler_pb2.ReleaseGpusRequest(
                kernel_id=kernel_id, replica_id=replica_id, all_requests=True), timeout=5)
        except grpc.RpcError as exc:
            log.info("releasing orphaned GPUs on %s: %s", link.host_id, exc.details())

