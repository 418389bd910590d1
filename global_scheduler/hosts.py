"""What the Global Scheduler knows about each host beyond its accounting: address, liveness."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from notebookos.proto import local_scheduler_pb2_grpc as ls_grpc


@dataclass
class HostLink:
    host_id: str
    address: str
    instance_id: str
    gpus: list[dict[str, Any]]  # [{"device_id", "name", "vram_gb"}]
    virtual_gpus: bool
    prewarm_pool_size: int = 0
    last_heartbeat: float = field(default_factory=time.time)
    draining: bool = False
    _stub: ls_grpc.LocalSchedulerStub | None = None
    _channel: grpc.Channel | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def stub(self) -> ls_grpc.LocalSchedulerStub:
        with self._lock:
            if self._stub is None:
                self._channel = grpc.insecure_channel(self.address)
                self._stub = ls_grpc.LocalSchedulerStub(self._channel)
            return self._stub

    @property
    def ip(self) -> str:
        return self.address.rpartition(":")[0] or "127.0.0.1"

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._stub = None
            self._channel = None

    def to_doc(self, capacity: dict[str, Any]) -> dict[str, Any]:
        return {"host_id": self.host_id, "address": self.address,
                "instance_id": self.instance_id, "gpus": self.gpus,
                "virtual_gpus": self.virtual_gpus, "capacity": capacity,
                "prewarm_pool_size": self.prewarm_pool_size}
