"""A distributed kernel as the Global Scheduler runs it: its key, front, replicas' endpoints."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from notebookos.global_scheduler.front import KernelFront, ReplicaEndpoint
from notebookos.kernel_hints import KernelHints

RELEASED_ARRIVALS_KEPT = 64


@dataclass
class ReplicaLink:
    replica_id: int
    host_id: str
    endpoint: ReplicaEndpoint
    raft_address: str
    pid: int
    ready: bool = False
    from_prewarm_pool: bool = False

    def to_doc(self) -> dict[str, Any]:
        e = self.endpoint
        return {"replica_id": self.replica_id, "host_id": self.host_id, "pid": self.pid,
                "raft_address": self.raft_address, "ip": e.ip, "shell_port": e.shell_port,
                "iopub_port": e.iopub_port, "stdin_port": e.stdin_port,
                "control_port": e.control_port}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> ReplicaLink:
        endpoint = ReplicaEndpoint(doc["replica_id"], doc["ip"], doc["shell_port"],
                                   doc["iopub_port"], doc["stdin_port"], doc["control_port"],
                                   doc["host_id"])
        return cls(doc["replica_id"], doc["host_id"], endpoint, doc["raft_address"], doc["pid"],
                   ready=True)


@dataclass
class KernelEntry:
    kernel_id: str
    key: str
    signature_scheme: str
    kernel_name: str
    env: dict[str, str]
    hints: KernelHints = field(default_factory=KernelHints)  # who, which notebook, GPU sharing
    front: KernelFront | None = None
    replicas: dict[int, ReplicaLink] = field(default_factory=dict)
    next_replica_id: int = 1
    state: str = "starting"  # starting, idle, busy, degraded, stopping, failed
    message: str = ""
    created_unix: float = field(default_factory=time.time)
    executions: dict[str, tuple[int, str]] = field(default_factory=dict)  # msg -> (replica, host)
    # GPU time: GPU-seconds bound to the kernel's cells so far (each cell: its GPUs x commit ->
    # release), and each running cell's (monotonic commit time, GPU count)
    gpu_seconds: float = 0.0
    gpu_commits: dict[str, tuple[float, int]] = field(default_factory=dict)
    raft_removals: list[int] = field(default_factory=list)  # lost members still in the group
    # Raft addresses of the replicas in ``raft_removals`` where known: a replica asked to join
    # is listed there (with its address) until it is ready, so one that never gets there (its
    # start failed, or the Global Scheduler died meanwhile) is taken out of the group again.
    removal_addresses: dict[int, str] = field(default_factory=dict)
    session_gpus: tuple[int, str, list[int]] | None = None  # reservation: (replica, host, ids)
    # What the status shows of the last cell: the GPUs each replica had bound for the last cell
    # it executed, and the interactivity delay (request at the front -> execute_input).
    cell_arrived: dict[str, float] = field(default_factory=dict)  # msg -> monotonic arrival
    # arrivals of cells released before their execute_input was seen (a short cell's reply can
    # overtake it; a resent cell answered from the replicas' record has none): kept for the
    # interactivity delay, but no longer a cell waiting to start (hibernation looks at the
    # one above). At most RELEASED_ARRIVALS_KEPT, oldest dropped first.
    released_arrivals: dict[str, float] = field(default_factory=dict)
    awake_because: str = ""  # why an idle kernel was last found busy (hibernation._say_why_awake)
    last_cell_gpus: dict[int, list[int]] = field(default_factory=dict)
    last_interactivity_ms: dict[int, float] = field(default_factory=dict)
    kernel_interactivity_ms: float = 0.0  # the last cell's, whichever replica ran it
    # Per-cell container policies (batch, lcp): where the next cell's container restores from
    # (the execution_count its checkpoint covers; 0 = start empty), the cached kernel_info
    # reply the parked kernel answers with, and what the last cell's container was.
    checkpoint_count: int = 0
    kernel_info: dict[str, Any] | None = None
    parking: bool = False
    lost_cells: set[str] = field(default_factory=set)
    last_container_start_ms: float = 0.0
    last_cell_pid: int = 0
    last_cell_from_prewarm_pool: bool = False
    # Hibernation (hibernation.py): when the kernel last had a cell, whether its idle clock is
    # set, and how its last sleep and wake went.
    last_active: float = field(default_factory=time.monotonic)
    hibernation_armed: bool = False
    hibernated_unix: float = 0.0
    wake_started: float = 0.0
    wake_error: str = ""
    last_wake_s: float = 0.0
    # (host, replica) of the replicas hibernation stopped, until each stop is confirmed: kept in
    # the registry, so that a scheduler that died meanwhile stops them before a wake
    pending_stops: list[tuple[str, int]] = field(default_factory=list)
    # The kernel is stopping because its client sent a shutdown_request (Jupyter's shutdown or
    # restart), not because of a StopKernel: a RestartKernel may follow and takes it over.
    client_shutdown: bool = False

    def endpoints(self) -> list[ReplicaEndpoint]:
        return [r.endpoint for r in self.replicas.values()]

    def to_doc(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"kernel_id": self.kernel_id, "key": self.key,
                "signature_scheme": self.signature_scheme, "kernel_name": self.kernel_name,
                "env": self.env, "hints": self.hints.to_map(), "request": request,
                "front_ports": dict(self.front.ports) if self.front else {},
                "replicas": [r.to_doc() for r in self.replicas.values()],
                "next_replica_id": self.next_replica_id, "created_unix": self.created_unix,
                "raft_removals": list(self.raft_removals),
                "removal_addresses": {str(k): v for k, v in self.removal_addresses.items()},
                "session_gpus": list(self.session_gpus) if self.session_gpus else None,
                "checkpoint_count": self.checkpoint_count, "kernel_info": self.kernel_info,
                "gpu_seconds": self.gpu_seconds,
                # a hibernated kernel stays so across a Global Scheduler restart
                "hibernated": self.state in ("hibernating", "hibernated", "waking")
                and not self.replicas,
                "hibernated_unix": self.hibernated_unix,
                "pending_stops": [list(p) for p in self.pending_stops]}
