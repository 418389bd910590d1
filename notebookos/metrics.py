"""The Prometheus metrics of the NotebookOS daemons: every name, label and unit is defined here.

Conventions (prometheus.io naming practice, as JupyterHub follows it): the ``notebookos_`` prefix,
base units (``_seconds``, ratios from 0 to 1), ``_total`` only on counters, no per-kernel or
per-user labels (a kernel's own figures go to JupyterLab in its ``execute_reply`` metadata), and
every value of every label created up front, so a series exists (at 0) before its first event
and dashboards and alerts need no ``absent()``. ``promtool check metrics`` passes on every
endpoint (tests/schedulers/test_metrics.py).

The components instrument at the source of each event (a counter where the event happens, a
histogram where the duration ends). Gauges of state (hosts, kernels, GPUs, pools) are read at
scrape time from a snapshot the component builds under its own lock, so they are never stale and
cost nothing between scrapes. Each daemon has its own ``CollectorRegistry`` (tests run several
daemons in one process) and serves it with ``MetricsServer``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric

if TYPE_CHECKING:
    import ssl
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

PREFIX = "notebookos"
KERNEL_STATES = ("starting", "idle", "busy", "degraded", "recovering", "parked", "stopping",
                 "failed", "hibernating", "hibernated", "waking")
CLUSTER_GPU_STATES = ("committed", "pending", "idle")
HOST_GPU_STATES = ("committed", "idle")
HOST_STATES = ("active", "draining")
REPLICA_STATES = ("starting", "idle", "executing", "standby", "migrating", "stopping")
MIGRATION_REASONS = ("contention", "scale_in", "operator")
OUTCOMES = ("succeeded", "failed")
REPLICA_FAILURE_CAUSES = ("died", "exited", "host_lost")
SCALE_DIRECTIONS = ("out", "in")
DROP_REASONS = ("bad_signature", "malformed")
PLACEMENT_OPERATIONS = ("kernel_start", "replica_replacement", "rebuild", "migration")
REPLICA_SOURCES = ("prewarm_pool", "fork_server", "cold")
REPLICA_EXIT_CAUSES = ("stopped", "died")
GPU_COMMIT_OUTCOMES = ("committed", "refused")

# An interactive cell: tens of milliseconds when a GPU is free, seconds to minutes when it waits.
DELAY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                 120.0, 300.0)
# Cells run from milliseconds to hours (the Sensei trace's median task is 2 minutes).
RUN_BUCKETS = (0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0)
# Starting replica processes and joining a Raft group: a fraction of a second to minutes.
# The loop standing still on the state lock: from a scheduling hiccup to a stall a user sees.
LOCK_WAIT_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
START_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)


def _precreate(metric: Counter | Histogram, **values: Iterable[str]) -> None:
    """Create the child of every combination of label values (JupyterHub's Enum idiom)."""
    names = list(values)
    combos: list[dict[str, str]] = [{}]
    for name in names:
        combos = [{**c, name: v} for c in combos for v in values[name]]
    for combo in combos:
        metric.labels(**combo)


def _gauge(name: str, doc: str, value: float | None = None,
           labels: Iterable[str] = ()) -> GaugeMetricFamily:
    family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels) or None)
    if value is not None:
        family.add_metric([], value)
    return family


def _gauge_by(name: str, doc: str, label: str, states: Iterable[str],
              counts: Mapping[str, float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=[label])
    for state in states:
        family.add_metric([state], float(counts.get(state, 0)))
    return family


class _SnapshotCollector(Collector):
    """Gauges computed at scrape time from ``snapshot()``; the component supplies it."""

    def __init__(self, snapshot: Callable[[], Any],
                 families: Callable[[Any], list[Metric]]) -> None:
        self._snapshot = snapshot
        self._families = families

    def collect(self) -> Iterable[Metric]:
        try:
            snap = self._snapshot()
        except Exception:  # noqa: BLE001 - a scrape must never take the daemon down
            log.exception("metrics snapshot failed")
            return []
        return self._families(snap)


# -- the Global Scheduler -----------------------------------------------------------------------


@dataclass
class ClusterSnapshot:
    """What the Global Scheduler's gauges show; built under its lock at scrape time."""

    hosts: dict[str, int] = field(default_factory=dict)  # HOST_STATES -> count
    kernels: dict[str, int] = field(default_factory=dict)  # KERNEL_STATES -> count
    gpus_total: int = 0
    gpus_committed: int = 0
    gpus_pending: int = 0
    gpus_subscribed: float = 0.0
    replicas_per_kernel: int = 3
    subscription_ratio_limit: float = 0.0
    prewarm_pool_size: int = 0
    prewarm_pool_target: int = 0
    queued_cells: int = 0
    replicas: int = 0


def _cluster_families(s: ClusterSnapshot) -> list[Metric]:
    idle = max(0, s.gpus_total - s.gpus_committed - s.gpus_pending)
    ratio = s.gpus_subscribed / (s.gpus_total * s.replicas_per_kernel) if s.gpus_total else 0.0
    return [
        _gauge_by("hosts", "Hosts registered with the Global Scheduler (draining: being scaled "
                  "in).", "state", HOST_STATES, s.hosts),
        _gauge_by("kernels", "Distributed kernels by state.", "state", KERNEL_STATES, s.kernels),
        _gauge_by("gpus", "GPUs of the cluster: committed to a running cell, pending for a "
                  "request about to run, or idle.", "state", CLUSTER_GPU_STATES,
                  {"committed": s.gpus_committed, "pending": s.gpus_pending, "idle": idle}),
        _gauge("gpus_provisioned", "GPUs of every registered host.", s.gpus_total),
        _gauge("gpus_subscribed", "GPUs requested by the replicas placed on the hosts (a "
               "replica subscribes to its kernel's request).", s.gpus_subscribed),
        _gauge("subscription_ratio", "Cluster subscription ratio: subscribed GPUs / (GPUs x "
               "replicas per kernel).", ratio),
        _gauge("subscription_ratio_limit", "The policy's cluster-wide limit on a host's "
               "subscription ratio right now (0: none).", s.subscription_ratio_limit),
        _gauge("replicas", "Replicas of every kernel, as placed by the Global Scheduler.",
               s.replicas),
        _gauge("prewarm_pool_size", "Prewarmed replica processes ready on all hosts.",
               s.prewarm_pool_size),
        _gauge("prewarm_pool_target", "Prewarmed replica processes the hosts are asked to keep.",
               s.prewarm_pool_target),
        _gauge("cells_queued", "Cells waiting for a host that can bind their GPUs (per-cell "
               "container policies).", s.queued_cells),
    ]


class GlobalSchedulerMetrics:
    """The Global Scheduler's metrics. ``snapshot`` is called at each scrape."""

    def __init__(self, snapshot: Callable[[], ClusterSnapshot], *, policy: str = "",
                 version: str = "") -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        Info(f"{PREFIX}_global_scheduler", "The Global Scheduler process.",
             registry=r).info({"policy": policy, "version": version})
        self.cell_interactivity_delay = Histogram(
            f"{PREFIX}_cell_interactivity_delay_seconds",
            "From a cell's execute_request reaching the Global Scheduler to its executor "
            "publishing execute_input (the code starts).", buckets=DELAY_BUCKETS, registry=r)
        self.cell_queue = Histogram(
            f"{PREFIX}_cell_queue_seconds",
            "From a cell's execute_request reaching the Global Scheduler to GPUs committed for "
            "it (waits for replicas, a host with free GPUs, a migration, a container).",
            buckets=DELAY_BUCKETS, registry=r)
        self.placement = Histogram(
            f"{PREFIX}_placement_seconds",
            "Placing replicas and starting them until they are ready: a kernel's start, the "
            "replacement of a lost replica, a rebuild from checkpoint, a migration.",
            ["operation"], buckets=START_BUCKETS, registry=r)
        _precreate(self.placement, operation=PLACEMENT_OPERATIONS)
        self.migrations = Counter(
            f"{PREFIX}_migrations", "Replica migrations, by why and how they ended.",
            ["reason", "outcome"], registry=r)
        _precreate(self.migrations, reason=MIGRATION_REASONS, outcome=OUTCOMES)
        self.replica_failures = Counter(
            f"{PREFIX}_replica_failures", "Replicas lost without being asked to stop.",
            ["cause"], registry=r)
        _precreate(self.replica_failures, cause=REPLICA_FAILURE_CAUSES)
        self.rebuilds = Counter(
            f"{PREFIX}_rebuilds", "Kernels rebuilt from their last checkpoint after losing the "
            "Raft majority.", ["outcome"], registry=r)
        _precreate(self.rebuilds, outcome=OUTCOMES)
        self.hibernations = Counter(
            f"{PREFIX}_hibernations", "Idle kernels hibernated (replicas stopped, state kept in "
            "their checkpoint).", registry=r)
        self.wakes = Counter(
            f"{PREFIX}_wakes", "Hibernated kernels woken (by a cell or on request), by how it "
            "ended.", ["outcome"], registry=r)
        _precreate(self.wakes, outcome=OUTCOMES)
        self.wake_time = Histogram(
            f"{PREFIX}_wake_seconds", "From a hibernated kernel's wake to its replicas ready "
            "with the checkpoint restored.", buckets=START_BUCKETS, registry=r)
        self.scale_events = Counter(
            f"{PREFIX}_scale_events", "Hosts the autoscaler asked for (out) or released (in).",
            ["direction"], registry=r)
        _precreate(self.scale_events, direction=SCALE_DIRECTIONS)
        self.loop_lock_wait = Histogram(
            f"{PREFIX}_gs_loop_lock_wait_seconds",
            "How long the Global Scheduler's loop (every kernel front, every gRPC call) stood "
            "still taking the state lock while a pool thread held it (issue 32: what the "
            "shared lock still costs).", buckets=LOCK_WAIT_BUCKETS, registry=r)
        self.cell_failures = Counter(
            f"{PREFIX}_cell_placement_failures", "Cells answered with an error because no "
            "replica could run them (no GPUs in time, no replica).", registry=r)
        self.dropped_messages = Counter(
            f"{PREFIX}_dropped_messages", "Jupyter messages the kernel fronts dropped.",
            ["reason"], registry=r)
        _precreate(self.dropped_messages, reason=DROP_REASONS)
        r.register(_SnapshotCollector(snapshot, _cluster_families))


# -- a Local Scheduler --------------------------------------------------------------------------


@dataclass
class HostSnapshot:
    """What a Local Scheduler's gauges show; built under its lock at scrape time."""

    gpus_total: int = 0
    gpus_committed: int = 0
    gpus_subscribed: float = 0.0
    replicas: dict[str, int] = field(default_factory=dict)  # REPLICA_STATES -> count
    replicas_per_kernel: int = 3
    prewarm_pool_size: int = 0
    prewarm_pool_target: int = 0
    draining: bool = False


def _host_families(s: HostSnapshot) -> list[Metric]:
    ratio = s.gpus_subscribed / (s.gpus_total * s.replicas_per_kernel) if s.gpus_total else 0.0
    return [
        _gauge_by("host_gpus", "This host's GPUs: committed to an executing replica, or idle.",
                  "state", HOST_GPU_STATES, {"committed": s.gpus_committed,
                                             "idle": s.gpus_total - s.gpus_committed}),
        _gauge("host_gpus_subscribed", "GPUs requested by the replicas on this host.",
               s.gpus_subscribed),
        _gauge("host_subscription_ratio", "This host's subscription ratio: subscribed GPUs / "
               "(GPUs x replicas per kernel).", ratio),
        _gauge_by("host_replicas", "Replica processes on this host by state.", "state",
                  REPLICA_STATES, s.replicas),
        _gauge("host_prewarm_pool_size", "Prewarmed replica processes ready on this host.",
               s.prewarm_pool_size),
        _gauge("host_prewarm_pool_target", "Prewarmed replica processes this host keeps.",
               s.prewarm_pool_target),
        _gauge("host_draining", "1 while the host takes no new replicas (scale-in).",
               1.0 if s.draining else 0.0),
    ]


class LocalSchedulerMetrics:
    """One Local Scheduler's metrics. ``snapshot`` is called at each scrape."""

    def __init__(self, snapshot: Callable[[], HostSnapshot], *, host_id: str = "",
                 version: str = "") -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        Info(f"{PREFIX}_local_scheduler", "The Local Scheduler process.",
             registry=r).info({"host_id": host_id, "version": version})
        self.replica_starts = Counter(
            f"{PREFIX}_replica_starts", "Replica processes started on this host, from the "
            "prewarm pool or cold, and whether they came up.", ["source", "outcome"],
            registry=r)
        _precreate(self.replica_starts, source=REPLICA_SOURCES, outcome=OUTCOMES)
        self.replica_start = Histogram(
            f"{PREFIX}_replica_start_seconds", "From StartReplica to the replica answering.",
            ["source"], buckets=START_BUCKETS, registry=r)
        _precreate(self.replica_start, source=REPLICA_SOURCES)
        self.replica_exits = Counter(
            f"{PREFIX}_replica_exits", "Replica processes that ended: asked to stop, or died.",
            ["cause"], registry=r)
        _precreate(self.replica_exits, cause=REPLICA_EXIT_CAUSES)
        self.gpu_commits = Counter(
            f"{PREFIX}_gpu_commits",
            "Requests to bind GPUs to a replica for a cell (a cell that follows its replica's "
            "previous one within the release hold keeps its GPUs and asks nothing).",
            ["outcome"], registry=r)
        _precreate(self.gpu_commits, outcome=GPU_COMMIT_OUTCOMES)
        r.register(_SnapshotCollector(snapshot, _host_families))


# -- serving ------------------------------------------------------------------------------------


class _QuietHandler(WSGIRequestHandler):
    timeout = 10  # a scraper that connects and sends nothing holds only its own thread

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        log.debug("metrics: " + format, *args)


class _MetricsHttpServer(ThreadingWSGIServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A refused scraper (no client certificate, plain HTTP on an HTTPS port, a timeout):
        a debug line, not a traceback on stderr per scrape."""
        log.debug("metrics: request from %s failed", client_address, exc_info=True)


JsonRoute = Callable[[], Any]


class MetricsServer:
    """Serves ``/metrics`` (the registry, in the Prometheus text format) and JSON routes (the
    Global Scheduler's ``/sd``) on ``host:port`` (0 picks a free port), from one thread."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int,
                 json_routes: Mapping[str, JsonRoute] | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        metrics_app = make_wsgi_app(registry)
        routes = dict(json_routes or {})

        def app(environ: dict, start_response: Callable) -> list[bytes]:
            path = environ.get("PATH_INFO", "")
            if path in routes:
                try:
                    body = json.dumps(routes[path]()).encode()
                    status = "200 OK"
                except Exception as exc:  # noqa: BLE001 - answer, never crash the daemon
                    log.exception("metrics route %s failed", path)
                    body = json.dumps({"message": str(exc)}).encode()
                    status = "500 Internal Server Error"
                start_response(status, [("Content-Type", "application/json"),
                                        ("Content-Length", str(len(body)))])
                return [body]
            if path in ("/metrics", "/"):
                return metrics_app(environ, start_response)
            body = b"not found: this server serves /metrics" + (
                b" and " + ", ".join(routes).encode() if routes else b"")
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [body]

        self._server = make_server(host, port, app, _MetricsHttpServer,
                                   handler_class=_QuietHandler)
        if ssl_context is not None:  # the handshake happens in the request's thread
            self._server.socket = ssl_context.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False)
        self.tls = ssl_context is not None
        self.host = host
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="metrics-http")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return metrics_url(self.address, tls=self.tls)

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def metrics_url(address: str, tls: bool = False, path: str = "/metrics") -> str:
    """``http(s)://host:port/metrics`` (or ``path``) for a ``host:port`` (empty for none)."""
    return f"{'https' if tls else 'http'}://{address}{path}" if address else ""
