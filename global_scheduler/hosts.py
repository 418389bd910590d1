"""What the Global Scheduler knows about each host beyond its accounting: address, liveness."""

from __future__ import annotations

import logging
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from notebookos.proto import local_scheduler_pb2
from notebookos.proto import local_scheduler_pb2_grpc as ls_grpc

log = logging.getLogger(__name__)


@dataclass
class HostLink:
    host_id: str
    address: str
    instance_id: str
    gpus: list[dict[str, Any]]  # [{"device_id", "name", "vram_gb"}]
    virtual_gpus: bool
    prewarm_pool_size: int = 0  # prewarmed processes ready now (reported)
    prewarm_pool_target: int = 0  # how many the host is asked to keep
    last_heartbeat: float = field(default_factory=time.time)
    draining: bool = False
    _stub: ls_grpc.LocalSchedulerStub | None = None
    _channel: grpc.Channel | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _releases: list[futures.Future] = field(default_factory=list)

    @property
    def stub(self) -> ls_grpc.LocalSchedulerStub:
        with self._lock:
            if self._stub is None:
                self._channel = grpc.insecure_channel(self.address)
                self._stub = ls_grpc.LocalSchedulerStub(self._channel)
            return self._stub

    def release_gpus_async(self, request: local_scheduler_pb2.ReleaseGpusRequest) -> None:
        """Release a cell's GPUs without waiting for the reply (it is off the cell's critical
        path); ``wait_for_releases`` orders the next commit on this host after it."""
        future = _release_pool().submit(self.stub.ReleaseGpus, request, timeout=5)
        future.add_done_callback(self._report_release)
        with self._lock:
            self._releases = [f for f in self._releases if not f.done()]
            self._releases.append(future)

    def _report_release(self, future: futures.Future) -> None:
        try:
            future.result()
        except grpc.RpcError as exc:
            log.warning("release of GPUs on %s failed: %s", self.host_id, exc.details())
        except Exception as exc:  # noqa: BLE001 - cancelled at shutdown
            log.info("release of GPUs on %s did not finish: %s", self.host_id, exc)

    def wait_for_releases(self, timeout: float = 5.0) -> None:
        """Wait until every release sent to this host so far has been answered (or failed)."""
        with self._lock:
            pending, self._releases = self._releases, []
        for future in pending:
            try:
                future.result(timeout=timeout)
            except Exception:  # noqa: BLE001 - reported by _report_release
                pass

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
                "prewarm_pool_size": self.prewarm_pool_size,
                "prewarm_pool_target": self.prewarm_pool_target}


_POOL: futures.ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _release_pool() -> futures.ThreadPoolExecutor:
    """Threads that send GPU releases (a grpc future would start a thread per call)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="gs-release")
        return _POOL
