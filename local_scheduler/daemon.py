"""The Local Scheduler daemon: serve the LocalScheduler gRPC service and stay registered."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from concurrent import futures
from pathlib import Path

import grpc

from notebookos.config import Config
from notebookos.local_scheduler.gpus import detect_gpus
from notebookos.local_scheduler.gs_link import GlobalSchedulerLink
from notebookos.local_scheduler.launcher import ProcessLauncher
from notebookos.local_scheduler.prewarm import PrewarmPool
from notebookos.local_scheduler.service import HostInfo, LocalSchedulerService
from notebookos.proto import local_scheduler_pb2_grpc as ls_grpc

log = logging.getLogger(__name__)


def _total_memory_mb() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    except (ValueError, OSError):
        return 0


class LocalSchedulerDaemon:
    def __init__(self, config: Config, host_id: str = "") -> None:
        ls = config.local_scheduler
        self.config = config
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        port = self.server.add_insecure_port(f"{ls.host}:{ls.grpc_port}")
        if port == 0:
            raise OSError(f"cannot bind the Local Scheduler's gRPC port {ls.host}:{ls.grpc_port}")
        self.address = f"{ls.host}:{port}"
        self.host_id = host_id or ls.host_id or f"{socket.gethostname()}-{port}"
        gpus, virtual = detect_gpus(ls.virtual_gpus, ls.vram_gb_per_gpu)
        host = HostInfo(
            host_id=self.host_id, address=self.address,
            millicpus=ls.millicpus or (os.cpu_count() or 1) * 1000,
            memory_mb=ls.memory_mb or _total_memory_mb(), gpus=gpus, virtual_gpus=virtual,
        )
        workdir = Path(config.state_path) / "local_scheduler" / self.host_id
        self.pool = PrewarmPool(ls.replica_module, ls.prewarm_pool_size)
        self._stopped = threading.Event()
        self.service = LocalSchedulerService(
            host,
            lambda on_exit: ProcessLauncher(workdir, on_exit, ip=ls.host, module=ls.replica_module),
            self.pool, self._report, stop_grace_period_s=ls.stop_grace_period_s,
            on_shutdown=self._shutdown_requested,
        )
        self.link = GlobalSchedulerLink(self.service, ls.global_scheduler,
                                        ls.heartbeat_interval_s, ls.prewarm_pool_size)
        ls_grpc.add_LocalSchedulerServicer_to_server(self.service, self.server)

    def _report(self, event) -> None:  # noqa: ANN001 - a ReplicaEvent message
        self.link.report(event)

    def _shutdown_requested(self, reason: str) -> None:
        self.stop(reason, deregister=True)

    def start(self) -> None:
        self.server.start()
        self.link.start()
        gpus = self.service.host.gpus
        log.info("Local Scheduler %s listening on %s with %d %s GPU(s)", self.host_id,
                 self.address, len(gpus), "virtual" if self.service.host.virtual_gpus else "real")

    def stop(self, reason: str = "shutdown", deregister: bool = True) -> None:
        if self._stopped.is_set():
            return
        self.service.draining = True
        self.service.stop_all()
        self.pool.close()
        self.link.close(deregister=deregister, reason=reason)
        self.server.stop(grace=1)
        self._stopped.set()

    def wait(self) -> None:
        self._stopped.wait()


def run(config: Config, host_id: str = "") -> int:
    daemon = LocalSchedulerDaemon(config, host_id)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: threading.Thread(target=daemon.stop, daemon=True).start())
    daemon.start()
    print(f"notebookos local-scheduler {daemon.host_id} listening on {daemon.address}",
          flush=True)
    daemon.wait()
    return 0
