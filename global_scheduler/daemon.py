"""The Global Scheduler daemon: the gRPC service, the host liveness monitor, the registry.

Who owns what (issue 32; docs/architecture.md, "The Global Scheduler's loop"):

- the fronts' loop (``FrontLoop.shared()``, one thread) runs the ``grpc.aio`` server: every
  call's I/O, the interceptors (join token, registry flush), and the handlers written as
  coroutines (``Heartbeat``, ``ReportReplicaEvent``, the status queries ``GetKernelStatus``,
  ``ListKernels``, ``GetClusterStatus``, and the kernel life cycle ``StartKernel``,
  ``RestartKernel``, ``WakeKernel``, ``MigrateReplica``, ``StopKernel``,
  ``InterruptKernel``, and the host calls ``RegisterHost``, ``DeregisterHost``,
  ``DrainHost``), which await ``service.lock`` without blocking the loop (state_lock.py,
  status.py, lifecycle.py, host_registry.py, host_drain.py); it also runs the host monitor's
  timer (host_monitor.py) and every kernel front;
- no handler is synchronous now; one that were would run in a ``gs-grpc`` pool thread
  (grpc_loop.SyncHandlersInPool), as the synchronous server ran them;
- the service's ``gs-work`` pool runs the effects (replica starts and migrations, recovery,
  host checks).
"""

from __future__ import annotations

import logging
import signal
import threading
from concurrent import futures
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import grpc

from notebookos.config import Config
from notebookos.global_scheduler.autoscaler import Autoscaler
from notebookos.global_scheduler.front_loop import FrontLoop
from notebookos.global_scheduler.grpc_loop import SyncHandlersInPool
from notebookos.global_scheduler.host_monitor import HostMonitor
from notebookos.global_scheduler.limits import kernels_room, open_file_limit, raise_limits
from notebookos.global_scheduler.providers import (
    HostProvider,
    LocalProcessProvider,
    StaticPoolProvider,
)
from notebookos.global_scheduler.registry_store import (
    FileRegistryStore,
    RedisRegistryStore,
    RegistryStore,
)
from notebookos.global_scheduler.registry_writer import FlushBeforeAnswer
from notebookos.global_scheduler.service import GlobalSchedulerService
from notebookos.metrics import MetricsServer
from notebookos.policies import get_policy
from notebookos.policies.forecast_scaling import ForecastScaling
from notebookos.policies.live import policy_params
from notebookos.policies.profile import profile_from_config
from notebookos.proto import global_scheduler_pb2_grpc as gs_grpc
from notebookos.security import (
    KEEPALIVE_OPTIONS,
    AioJoinTokenInterceptor,
    add_secure_port,
    child_environment,
    connector,
    ensure_cluster_credentials,
    metrics_ssl_context,
)

log = logging.getLogger(__name__)


def make_policy(config: Config):  # noqa: ANN201 - a notebookos.policies.Policy
    return get_policy(config.cluster.policy, **policy_params(config))


def make_store(config: Config) -> RegistryStore:
    url = config.global_scheduler.registry_redis_url
    if url:
        return RedisRegistryStore(url, config.global_scheduler.registry_redis_prefix)
    return FileRegistryStore(Path(config.state_path) / "global_scheduler" / "registry.json")


class GlobalSchedulerDaemon:
    def __init__(self, config: Config) -> None:
        gs = config.global_scheduler
        self.config = config
        # The state directory's CA, certificate and join token are made on first start; files a
        # deployment configured are only checked. Unusable files raise SecurityError (naming the
        # setting) before anything binds.
        ensure_cluster_credentials(config)
        interceptor = AioJoinTokenInterceptor(config)
        connect = connector(config, KEEPALIVE_OPTIONS)  # a host gone silent shows in seconds
        # The scheduling profile: a plug-in per extension point, each with its configuration
        # section (notebookos/policies/profile.py); the cycle runs it (policies/cycle.py).
        self.profile = profile_from_config(config)
        self.policy = self.profile.policy
        self.service = GlobalSchedulerService(
            self.policy, make_store(config), ip=gs.host, store_url=config.store_url,
            replicas_per_kernel=(config.cluster.replicas_per_kernel
                                 if self.policy.replicas_per_kernel > 1 else 1),
            oversubscription=config.cluster.oversubscription,
            heartbeat_interval_s=config.local_scheduler.heartbeat_interval_s,
            heartbeat_timeout_s=gs.heartbeat_timeout_s,
            start_timeout_s=gs.replica_start_timeout_s,
            cell_queue_timeout_s=gs.cell_queue_timeout_s,
            cell_checkpoint_timeout_s=gs.cell_checkpoint_timeout_s,
            cell_order=self.profile.queue_sort,
            replicas_wait_for_client_s=gs.replicas_wait_for_client_s,
            idle_links_close_s=gs.idle_links_close_s,
            hibernate_after_s=gs.hibernate_after_s,
            connect=connect,
        )
        self.service.migration_retries = gs.migration_retries
        self.service.silent_host_timeout_s = gs.silent_host_timeout_s
        self.service.node_probe_timeout_s = gs.node_probe_timeout_s
        self.service.max_kernels = gs.max_kernels or kernels_room(open_file_limit())
        log.info("room for %s open kernels (global_scheduler.max_kernels %d, open-file limit %s)",
                 self.service.max_kernels or "any number of", gs.max_kernels,
                 open_file_limit() or "none")
        self.service.profile = self.profile
        if self.profile.shares:
            sharing = self.service.gpu_sharing
            log.info("GPU sharing on (tensorshare): %s predictor, test SMAPE %.1f%%",
                     sharing.predictor_name, getattr(sharing.predictor, "test_smape", 0.0))
        # The gRPC server runs on the fronts' loop (grpc.aio binds a server to the loop it is
        # made on); its synchronous handlers in this pool, made lazily up to 32 threads.
        self.loop = FrontLoop.shared()
        self.grpc_pool = futures.ThreadPoolExecutor(max_workers=32,
                                                    thread_name_prefix="gs-grpc")

        def make_server() -> tuple[grpc.aio.Server, int]:
            # mutual TLS; the Local Schedulers' methods also need the cluster join token.
            # The last interceptor wraps the handler first: the registry flush (a synchronous
            # handler's wrapper flushes in the thread the handler ran in), then the pool that
            # runs synchronous handlers, then the token check.
            server = grpc.aio.server(
                migration_thread_pool=self.grpc_pool,
                interceptors=[interceptor, SyncHandlersInPool(self.grpc_pool),
                              FlushBeforeAnswer(self.service.store)])
            gs_grpc.add_GlobalSchedulerServicer_to_server(self.service, server)
            try:
                port = add_secure_port(server, config, f"{gs.host}:{gs.grpc_port}")
            except (OSError, RuntimeError):
                raise OSError(f"cannot bind the Global Scheduler's gRPC port {gs.host}:"
                              f"{gs.grpc_port}") from None
            return server, port

        self.server, port = self.loop.run(make_server, timeout=30)
        self.address = f"{gs.host}:{port}"
        try:
            self.metrics_server = MetricsServer(self.service.metrics.registry, gs.host,
                                                gs.metrics_port,
                                                {"/sd": self.service.service_discovery},
                                                ssl_context=metrics_ssl_context(config))
        except OSError as exc:
            self._stop_server(None)
            raise OSError(f"cannot bind the Global Scheduler's metrics port {gs.host}:"
                          f"{gs.metrics_port}: {exc}") from exc
        self.service.metrics_address = self.metrics_server.address
        self._stopped = threading.Event()
        self._stop_done = threading.Event()
        self.autoscaler: Autoscaler | None = None
        if gs.autoscale and gs.host_provider in ("local", "static"):
            provider: HostProvider
            if gs.host_provider == "local":
                provider = LocalProcessProvider(
                    self.address, Path(config.state_path), config.local_scheduler.virtual_gpus,
                    config.local_scheduler.prewarm_pool_size, ip=gs.host, connect=connect,
                    env=child_environment(config))
            else:
                provider = StaticPoolProvider(self.service)
            forecast = (self.profile.scale if isinstance(self.profile.scale, ForecastScaling)
                        else None)
            self.autoscaler = Autoscaler(
                self.service, provider, interval_s=gs.autoscale_interval_s,
                gpus_per_host=max(1, config.local_scheduler.virtual_gpus),
                max_hosts=gs.max_hosts, forecast=forecast,
                history_path=Path(config.state_path) / "global_scheduler" / "scaling-history.json")
        # host liveness: a timer on the loop, armed for the next deadline (host_monitor.py)
        self.monitor = HostMonitor(self.service, self.loop, self.service._pool)
        self.service.on_host_deadlines = self.monitor.poke

    def start(self) -> None:
        self.service.restore()
        self.loop.spawn(self.server.start()).result(timeout=30)
        # no heartbeat could arrive before now (a restore may take seconds: a front's port
        # waited for): each restored host gets a whole heartbeat timeout from here
        self.service.listening()
        self.metrics_server.start()
        self.monitor.start()
        if self.autoscaler is not None:
            self.autoscaler.start()
        log.info("Global Scheduler listening on %s (policy %s); metrics on %s", self.address,
                 self.policy.name, self.metrics_server.url)

    def _stop_server(self, grace: float | None) -> futures.Future:
        """Stop the gRPC server on its loop; its future (done once the calls ended)."""
        return self.loop.spawn(self.server.stop(grace))

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.monitor.close()
        if self.autoscaler is not None:
            self.autoscaler.close()
        # New calls are refused at once and those running get 1 s; meanwhile the service
        # closes (as when the synchronous server's stop returned at once), then the stop is
        # waited for: the process exits with no call half-answered on the loop.
        stopped = self._stop_server(1)
        self.metrics_server.close()
        self.service.close()
        try:
            stopped.result(timeout=5)
        except (FutureTimeout, RuntimeError) as exc:
            log.warning("the gRPC server did not stop cleanly: %r", exc)
        self.grpc_pool.shutdown(wait=False, cancel_futures=True)
        self._stop_done.set()

    def wait(self) -> None:
        """Until ``stop`` (on another thread: a signal's) has finished, or 20 s after it began
        (the registry's flush waits up to 10 s)."""
        self._stopped.wait()
        self._stop_done.wait(20)


def run(config: Config) -> int:
    raise_limits()  # before the first ZMQ socket: room for thousands of kernels
    daemon = GlobalSchedulerDaemon(config)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: threading.Thread(target=daemon.stop, daemon=True).start())
    daemon.start()
    print(f"notebookos global-scheduler listening on {daemon.address}", flush=True)
    daemon.wait()
    return 0
