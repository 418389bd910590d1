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

from notebookos import __version__
from notebookos.config import Config
from notebookos.local_scheduler.gpus import detect_gpus
from notebookos.local_scheduler.gs_link import GlobalSchedulerLink
from notebookos.local_scheduler.launcher import ExitCallback, Launcher, ProcessLauncher
from notebookos.local_scheduler.preload_learning import LearnSettings
from notebookos.local_scheduler.prewarm import Prewarmed, PrewarmPool
from notebookos.local_scheduler.prewarm_main import PRELOAD_ENV
from notebookos.local_scheduler.service import HostInfo, LocalSchedulerService
from notebookos.metrics import LocalSchedulerMetrics, MetricsServer
from notebookos.proto import local_scheduler_pb2_grpc as ls_grpc
from notebookos.security import (
    KEEPALIVE_SERVER_OPTIONS,
    JoinTokens,
    add_secure_port,
    check_credentials,
    metrics_ssl_context,
    secure_channel,
)

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
        # TLS files and the join token must be usable before anything binds (SecurityError names
        # the settings); this daemon never creates them
        check_credentials(config, join_token=True)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16),
                                  options=KEEPALIVE_SERVER_OPTIONS)
        try:
            port = add_secure_port(self.server, config, f"{ls.host}:{ls.grpc_port}")
        except OSError:
            raise OSError(f"cannot bind the Local Scheduler's gRPC port {ls.host}:"
                          f"{ls.grpc_port}") from None
        self.address = f"{ls.host}:{port}"
        docker = None
        if ls.launcher == "docker":
            from notebookos.local_scheduler import docker_launcher

            docker = docker_launcher.connect()
            host_id = host_id or ls.host_id or docker_launcher.default_host_id(docker)
        self.host_id = host_id or ls.host_id or f"{socket.gethostname()}-{port}"
        if docker is not None:
            gpus, virtual = docker_launcher.detect_gpus(docker, ls.docker_image,
                                                        ls.virtual_gpus, ls.vram_gb_per_gpu)
        else:
            gpus, virtual = detect_gpus(ls.virtual_gpus, ls.vram_gb_per_gpu)
        # /metrics is bound before the host registers, so the Global Scheduler learns its address
        self.metrics = LocalSchedulerMetrics(lambda: self.service.metrics_snapshot(),
                                             host_id=self.host_id, version=__version__)
        try:
            self.metrics_server = MetricsServer(self.metrics.registry, ls.host, ls.metrics_port,
                                                ssl_context=metrics_ssl_context(config))
        except OSError as exc:
            self.server.stop(None)
            raise OSError(f"cannot bind the Local Scheduler's metrics port {ls.host}:"
                          f"{ls.metrics_port}: {exc}") from exc
        host = HostInfo(
            host_id=self.host_id, address=self.address,
            millicpus=ls.millicpus or (os.cpu_count() or 1) * 1000,
            memory_mb=ls.memory_mb or _total_memory_mb(), gpus=gpus, virtual_gpus=virtual,
            metrics_address=self.metrics_server.address,
        )
        workdir = Path(config.state_path) / "local_scheduler" / self.host_id
        # what the fork server and the pool's interpreters import besides the replica's own
        os.environ[PRELOAD_ENV] = ls.preload_modules

        def make_launcher(on_exit: ExitCallback) -> Launcher:
            if docker is None:
                # learned preloads renew the pool: its waiting replicas were forked before
                return ProcessLauncher(workdir, on_exit, ip=ls.host, module=ls.replica_module,
                                       fork_server=ls.fork_server,
                                       orphan_grace_s=ls.orphan_grace_s,
                                       learn=LearnSettings.of(ls), on_learned=self.pool.renew,
                                       preload_modules=[n.strip() for n in
                                                        ls.preload_modules.split(",")
                                                        if n.strip()])
            return docker_launcher.DockerLauncher(
                docker, on_exit, host_id=self.host_id, image=ls.docker_image,
                network=ls.docker_network, user=ls.docker_user, module=ls.replica_module,
                gpu_device_ids=[] if virtual else [g.device_id for g in gpus],
                pass_env=[n.strip() for n in ls.docker_pass_env.split(",") if n.strip()])

        self.drain_timeout_s = ls.drain_timeout_s
        self.pool = PrewarmPool(self._start_prewarmed, ls.prewarm_pool_size)
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self.service = LocalSchedulerService(
            host, make_launcher, self.pool, self._report,
            stop_grace_period_s=ls.stop_grace_period_s, on_shutdown=self._shutdown_requested,
            metrics=self.metrics, mps_percentage=ls.mps_percentage if ls.mps else None,
        )
        self.link = GlobalSchedulerLink(self.service, ls.global_scheduler,
                                        ls.heartbeat_interval_s, ls.prewarm_pool_size,
                                        channel=secure_channel(config, ls.global_scheduler),
                                        tokens=JoinTokens(config))
        learner = getattr(self.service.launcher, "learner", None)
        if learner is not None:  # reads the replicas' import reports on each heartbeat
            self.link.on_heartbeat.append(learner.tick)
        ls_grpc.add_LocalSchedulerServicer_to_server(self.service, self.server)

    def _start_prewarmed(self) -> Prewarmed:
        return self.service.launcher.start_prewarmed()

    def _report(self, event) -> None:  # noqa: ANN001 - a ReplicaEvent message
        self.link.report(event)

    def _shutdown_requested(self, reason: str) -> None:
        self.stop(reason, deregister=True)

    def start(self) -> None:
        self.server.start()
        self.metrics_server.start()
        self.link.start()
        self.pool.start()
        gpus = self.service.host.gpus
        log.info("Local Scheduler %s listening on %s with %d %s GPU(s)", self.host_id,
                 self.address, len(gpus), "virtual" if self.service.host.virtual_gpus else "real")

    def stop(self, reason: str = "shutdown", deregister: bool = True, drain: bool = False) -> None:
        """Stop once: a second caller (SIGTERM while the Global Scheduler asked for it) waits
        for the first to finish rather than racing it through the launcher's close. With
        ``drain`` (a SIGTERM: the host is going away), the Global Scheduler first moves the
        replicas to other hosts (``local_scheduler.drain_timeout_s``), while this daemon still
        serves the calls that takes."""
        with self._stop_lock:
            if self._stopped.is_set():
                return
            if drain:
                self.link.drain(self.drain_timeout_s)
            self.service.draining = True
            self.service.release_watchers()
            self.service.stop_all()
            self.service.close()
            self.pool.close()
            self.service.launcher.close()
            self.link.close(deregister=deregister, reason=reason)
            self.server.stop(grace=1)
            self.metrics_server.close()
            self._stopped.set()

    def wait(self) -> None:
        self._stopped.wait()


def run(config: Config, host_id: str = "") -> int:
    daemon = LocalSchedulerDaemon(config, host_id)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: threading.Thread(target=daemon.stop,
                                                       kwargs={"drain": True},
                                                       daemon=True).start())
    daemon.start()
    print(f"notebookos local-scheduler {daemon.host_id} listening on {daemon.address}",
          flush=True)
    daemon.wait()
    return 0
