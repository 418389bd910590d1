"""One typed configuration for every component.

Sources, lowest to highest precedence: defaults in code < a TOML file < environment variables
(``NOTEBOOKOS_<SECTION>_<NAME>``) < command-line flags (passed in as ``overrides``). Every
setting is declared once below with its type, default, allowed values and help text; the
docs (docs/configuration.md) are generated from the same declarations, and a test fails when they
drift apart.

An invalid value stops the program at start with ``ConfigError``, whose message names the
setting, the value, where it came from, and what is allowed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from notebookos.policies import defaults as policy_defaults

ENV_PREFIX = "NOTEBOOKOS_"
CONFIG_FILE_ENV = "NOTEBOOKOS_CONFIG"


class ConfigError(ValueError):
    """A configuration value is not allowed."""


def default_state_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "notebookos"


# -- validators ------------------------------------------------------------------------------


def _at_least(low: float) -> Callable[[Any], str | None]:
    return lambda value: None if value >= low else f"a number >= {low:g}"


def _between(low: float, high: float) -> Callable[[Any], str | None]:
    return lambda value: None if low <= value <= high else f"a number from {low:g} to {high:g}"


def _port(value: int) -> str | None:
    return None if 0 <= value <= 65535 else "a TCP port from 0 to 65535 (0 picks a free one)"


def _module_list(value: str) -> str | None:
    names = [n.strip() for n in value.split(",") if n.strip()]
    bad = [n for n in names if not all(part.isidentifier() for part in n.split("."))]
    return f"module names separated by commas (not {', '.join(bad)})" if bad else None


def _store_url(value: str) -> str | None:
    scheme = urlparse(value).scheme
    if scheme in ("file", "redis", "rediss", "s3"):
        return None
    return "a URL file:///path, redis://host:port/db or s3://bucket/prefix?endpoint_url=..."


def _optional_redis_url(value: str) -> str | None:
    return None if value == "" or urlparse(value).scheme in ("redis", "rediss") else (
        "empty (use the local state file) or a redis://host:port/db URL"
    )


def _policy_name(value: str) -> str | None:
    try:
        from notebookos.policies import available_policies
    except ImportError:  # the registry is not importable: accept any name, checked at use
        return None if value else "a policy name"
    names = available_policies()
    return None if value in names else f"one of {', '.join(sorted(names))}"


def _plugin_config(value: str) -> str | None:
    if value == "":
        return None
    try:
        doc = json.loads(value)
    except ValueError as exc:
        return f"a JSON object ({exc})"
    allowed = {"policy", "queue_sort", "post_filter", "scale"}
    if not isinstance(doc, dict) or set(doc) - allowed or not all(
            isinstance(v, dict) for v in doc.values()):
        return f"a JSON object whose keys are among {sorted(allowed)}, each an object"
    return None


def setting(
    default: Any,
    help: str,  # noqa: A002 - the natural name in declarations
    check: Callable[[Any], str | None] | None = None,
    secret: bool = False,
) -> Any:
    """``secret``: the value is never printed (``config show``, error messages)."""
    return field(default=default, metadata={"help": help, "check": check, "secret": secret})


SECRET_MASK = "********"


def _join_token_value(value: str) -> str | None:
    if value == "" or (len(value) >= 16 and value.isprintable() and value.strip() == value):
        return None
    return "empty (read security.join_token_file) or at least 16 printable characters"


def _absolute_or_empty(value: str) -> str | None:
    return None if value == "" or Path(value).is_absolute() else "an absolute path, or empty"


# -- sections --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterSettings:
    replicas_per_kernel: int = setting(3, "Replicas of each distributed kernel (Raft group size).",
                                       _at_least(1))
    policy: str = setting("notebookos", "Scheduling policy (a name from `notebookos.policies`).",
                          _policy_name)
    store: str = setting("", "Large-object store URL; empty means file://<state_dir>/store.",
                         lambda v: None if v == "" else _store_url(v))
    state_dir: str = setting("", "Directory for local state (registry file, store, logs); empty "
                             "means $XDG_DATA_HOME/notebookos.")
    max_subscription_ratio: float = setting(
        policy_defaults.MAX_SUBSCRIPTION_RATIO,
        "notebookos: the most a host's subscription ratio SR = subscribed GPUs / (GPUs x R) may "
        "reach; the limit itself is dynamic (the paper's total subscribed GPUs / total GPUs, "
        "at least 1) up to this. Below 1 it is a fixed limit. The simulator's default is the "
        "same (docs/policies.md).", _between(0.01, 100.0))
    oversubscription: float = setting(
        policy_defaults.HOST_OVERSUBSCRIPTION,
        "Hard cap of a host's subscribed resources, as a multiple of its capacity (at "
        "least replicas x the policy's largest subscription ratio, 3 x 7).", _at_least(1.0))
    restart_backoff_s: float = setting(
        1.0, "`notebookos up`: the wait before restarting a daemon (Global Scheduler, Local "
        "Scheduler, JupyterLab) that exited; it doubles with each exit in a row, up to "
        "restart_backoff_max_s, and never gives up (Kubernetes' CrashLoopBackOff).",
        _at_least(0.01))
    restart_backoff_max_s: float = setting(
        300.0, "`notebookos up`: the longest wait between two restarts of a daemon that keeps "
        "exiting.", _at_least(0.01))
    restart_healthy_after_s: float = setting(
        10.0, "`notebookos up`: a daemon that stays up this long (or reports ready sooner: the "
        "Global Scheduler's and JupyterLab's ports accept connections) served, and its next "
        "exit is restarted after restart_backoff_s again.", _at_least(0.01))


@dataclass(frozen=True)
class GlobalSchedulerSettings:
    host: str = setting("127.0.0.1", "Address the Global Scheduler binds (gRPC and kernel fronts).")
    grpc_port: int = setting(8079, "gRPC port of the Global Scheduler.", _port)
    metrics_port: int = setting(
        0, "Port of the Global Scheduler's Prometheus endpoint (`/metrics`, and `/sd`: HTTP "
        "service discovery of every daemon's endpoint), bound on `host`; 0 picks a free one "
        "(`notebookos status --json` shows it).", _port)
    registry_redis_url: str = setting(
        "", "Redis URL that keeps the registry across restarts; empty uses a local state file.",
        _optional_redis_url)
    registry_redis_prefix: str = setting(
        "notebookos:registry", "Key prefix of the registry in Redis (one per cluster sharing a "
        "Redis).", lambda v: None if v else "a non-empty key prefix")
    heartbeat_timeout_s: float = setting(
        10.0, "A Local Scheduler silent this long is declared dead.", _at_least(0.5))
    silent_host_timeout_s: float = setting(
        1.0, "A host that answers none of the Global Scheduler's keepalive pings (one a second, "
        "each given 2 s: its machine or its network is gone, or it hangs) is declared lost this "
        "long after the first unanswered one, about 4 s after it fell silent instead of "
        "heartbeat_timeout_s; its replicas are replaced and its kernels' cells go on elsewhere. A "
        "Local Scheduler that merely exited (its replicas live on) is not affected. 0: only the "
        "heartbeat timeout.", _at_least(0.0))
    node_probe_timeout_s: float = setting(
        1.0, "When a Local Scheduler's connection is closed or reset (a daemon that exited, whose "
        "replicas live on for its restart, or its whole node killed), the Global Scheduler opens "
        "a TCP connection to each replica on its host; if none accepts within this long (each "
        "refused, unreachable or unanswered) the node is gone and the host is declared lost at "
        "once instead of after heartbeat_timeout_s. A host with no replica is left to the "
        "heartbeat timeout. 0: only the heartbeat timeout.", _at_least(0.0))
    max_kernels: int = setting(
        0, "Most kernels the Global Scheduler holds open at once (hibernated ones included); "
        "a start beyond it is refused with a clear message, and the kernels already open keep "
        "what they need. 0: as many as its open-file limit leaves room for (27 open files a "
        "kernel with Jupyter attached, a twentieth of the limit kept for the rest: about 700 "
        "at 20,000, 37,000 at 1,048,576). Raise the limit (`ulimit -n`, systemd's "
        "LimitNOFILE, compose's `ulimits: nofile`) to hold more.", _at_least(0))
    migration_retries: int = setting(
        3, "Failed migrations (a target host was chosen but moving the replica failed) before a "
        "waiting cell fails; a cell that merely finds no host free waits (cell_queue_timeout_s).",
        _at_least(0))
    gpu_sharing: str = setting(
        "off", "GPU sharing between two kernels' cells where a cell's GPUs are committed on "
        "one of its kernel's replicas (notebookos and the other policies with long-lived "
        "replicas; not reservation's session GPUs, nor batch/lcp containers): `off`, or "
        "`tensorshare` (when a "
        "cell's GPUs are busy on its replicas' hosts, it may share a device with one running "
        "cell of another kernel if both kernels' gpu_sla allow it and the slowdown predictor "
        "says both stay within it; never three on a device). A kernel's gpu_sla comes from its "
        "kernelspec (docs/policies.md, Live GPU sharing).",
        lambda v: None if v in ("off", "tensorshare") else "off or tensorshare")
    gpu_sharing_predictor: str = setting(
        "auto", "gpu_sharing = tensorshare: the slowdown predictor for two known workloads: "
        "`mlp` (TensorShare's network, needs torch), `ridge` (a linear model, no torch), "
        "`oracle` (the simulator's synthetic ground truth), `blind` (no slowdown), `auto` (mlp "
        "when torch is installed, else ridge). The model is trained when the Global Scheduler "
        "starts (mlp: about 10 s on two cores; ridge: about 1 s). Pairs with an unknown "
        "workload get the slowdown measured on an H100 (1.72, docs/evaluation.md).",
        lambda v: None if v in ("auto", "mlp", "ridge", "oracle", "blind") else
        "auto, mlp, ridge, oracle or blind")
    plugin_config: str = setting(
        "", "Configuration sections for the scheduling profile's plug-ins (issue 35, "
        "notebookos/policies/profile.py), as a JSON object: `policy` (keyword arguments of "
        "cluster.policy, on top of the settings' own: how a policy from an entry point gets "
        "its configuration), `queue_sort` (of cell_order's order), `scale` (of scaling's) and "
        "`post_filter` (one object per post-filter by name, e.g. {\"share\": {\"predictor\": "
        "\"ridge\"}}). Empty: the settings' own.", _plugin_config)
    autoscale: bool = setting(True, "Scale hosts out and in automatically.")
    autoscale_interval_s: float = setting(15.0, "Seconds between autoscaler runs.", _at_least(0.1))
    scaling_factor: float = setting(
        policy_defaults.SCALE_FACTOR,
        "Expected capacity = committed GPUs x this factor (plus the buffer).", _at_least(1.0))
    scaling_buffer_hosts: int = setting(1, "Spare hosts kept beyond expected capacity.",
                                        _at_least(0))
    scaling: str = setting(
        "policy", "How the autoscaler decides: `policy` (the policy's own scaling: committed GPUs "
        "x scaling_factor plus a buffer) or `ces` (Helios's Cluster Energy Saving: hosts are put "
        "to sleep through the host provider when the recent trend and a forecast of the demand, "
        "learnt from this cluster's history, both fall; a cell that waits for GPUs wakes the "
        "hosts it lacks plus scaling_buffer_hosts). See docs/policies.md.",
        lambda v: None if v in ("policy", "ces") else "policy or ces")
    ces_check_interval_s: float = setting(
        600.0, "scaling = ces: seconds between the checks the forecast learns from and decides "
        "at.", _at_least(0.1))
    ces_day_s: float = setting(
        86400.0, "scaling = ces: the demand's period (a day); nothing sleeps before one period "
        "of history. Shorter only for compressed replays and tests.", _at_least(1.0))
    min_hosts: int = setting(policy_defaults.MIN_HOSTS,
                             "The autoscaler never goes below this many hosts.", _at_least(0))
    max_hosts: int = setting(32, "The autoscaler never goes above this many hosts.", _at_least(1))
    host_provider: str = setting(
        "local", "Where the autoscaler gets hosts: `local` starts Local Scheduler processes with "
        "local_scheduler.virtual_gpus virtual GPUs on this machine (and scales in only those: a "
        "Local Scheduler it did not start has a supervisor that would start it again); `static` "
        "keeps a fixed pool "
        "of registered hosts and moves idle ones in and out of reserve; `none` never adds hosts.",
        lambda v: None if v in ("local", "static", "none") else "local, static or none")
    replicas_wait_for_client_s: float = setting(
        0.25, "A kernel started from Jupyter (its front bound first) starts its replicas once "
        "a client attaches to it (Jupyter Server's IOPub subscription, ~15 ms after the start "
        "was answered, or any request), or after this long; 0 starts them at once. Replicas "
        "starting on the machine that runs Jupyter Server take its CPU while it finishes the "
        "REST create (docs/performance.md); where they run on other machines, 0 saves the first "
        "cell those ~15 ms.", _at_least(0.0))
    idle_links_close_s: float = setting(
        30.0, "A kernel's connections that nothing has used for this long, with no request "
        "in flight, are closed in the Global Scheduler and made again when next needed: its "
        "replicas' control and stdin, and its standbys' shell and IOPub (the replica that ran "
        "the last cell keeps its own). An idle kernel then holds 2 of its 12 (each about 26 KB "
        "and two open files there).", _at_least(0.1))
    replica_start_timeout_s: float = setting(
        120.0, "How long a new replica may take to answer before its start fails.",
        _at_least(1.0))
    cell_queue_timeout_s: float = setting(
        300.0, "How long a cell may wait for GPUs before it fails with an error reply that says "
        "why. Meanwhile it runs as soon as a replica's host, a migration target or a new host "
        "can bind them (batch, lcp: a host for its container), and the notebook is told it "
        "waits and why.", _at_least(0.1))
    cell_order: str = setting(
        "arrival", "The order in which cells waiting for GPUs are served, with any policy: "
        "`arrival` (first come, first served), `themis` (finish-time fairness between users: "
        "the user whose cells waited longest for the GPU time they got goes first) or `qssf` "
        "(smallest predicted GPU-time first, predicted from the cluster's history of cell "
        "durations per user and notebook). See docs/policies.md.",
        lambda v: None if v in ("arrival", "themis", "qssf") else "arrival, themis or qssf")
    hibernate_after_s: float = setting(
        3600.0, "A kernel with no cell for this long hibernates: its checkpoint is made to hold "
        "its last cell, its replicas stop, and the next cell wakes it from the checkpoint (its "
        "output says so and how long it took). 0: never. Needs a store (cluster.store_url). "
        "The simulator models it as `simulate --hibernate-after-s` (off there by default; "
        "docs/evaluation.md measures 3600 and 900).",
        _at_least(0.0))
    cell_checkpoint_timeout_s: float = setting(
        60.0, "batch, lcp: how long a cell's container may take to make the cell's checkpoint "
        "durable before it is stopped anyway (the kernel's message then says so).",
        _at_least(0.1))
    warm_containers_per_host: int = setting(
        8, "lcp: warm containers (prewarmed replica processes) the Global Scheduler asks every "
        "host to keep; each cell borrows one and the host refills its pool.", _at_least(0))
    scale_in: str = setting(
        policy_defaults.SCALE_IN,
        "notebookos: which hosts the autoscaler may release: `empty` (holding no replica), "
        "`idle` (no GPU bound: their standby replicas move to other hosts first) or `drain` (as "
        "idle, fewest last executors first; the simulator adds the prototype's hysteresis). "
        "Fewest replicas first, then the newest host; the same decision as the simulator's "
        "(notebookos/policies/scale_in.py), whose default is the same (docs/evaluation.md "
        "measures the three). A policy that cannot migrate releases empty hosts only.",
        lambda v: None if v in ("empty", "idle", "drain") else "empty, idle or drain")


@dataclass(frozen=True)
class LocalSchedulerSettings:
    host: str = setting("127.0.0.1", "Address this Local Scheduler binds and advertises.")
    grpc_port: int = setting(0, "gRPC port of this Local Scheduler (0 picks a free one).", _port)
    metrics_port: int = setting(
        0, "Port of this Local Scheduler's Prometheus `/metrics`, bound on `host`; 0 picks a "
        "free one (the Global Scheduler's `/sd` and `notebookos status --json` list it).", _port)
    global_scheduler: str = setting("127.0.0.1:8079", "host:port of the Global Scheduler.")
    virtual_gpus: int = setting(
        4, "GPUs to offer when no real GPU is found (nvidia-smi / CUDA).", _at_least(0))
    millicpus: int = setting(0, "CPU capacity to offer in millicpus; 0 = all cores.", _at_least(0))
    memory_mb: int = setting(0, "Memory to offer in MB; 0 = all physical memory.", _at_least(0))
    vram_gb_per_gpu: float = setting(16.0, "GPU memory per virtual GPU.", _at_least(0.0))
    prewarm_pool_size: int = setting(1, "Prewarmed replica processes kept ready on this host.",
                                     _at_least(0))
    fork_server: bool = setting(
        True, "Start replicas that find the prewarm pool empty by forking a preloaded "
        "interpreter (one per host) instead of a new one; `process` launcher only.")
    preload_modules: str = setting(
        "", "Comma-separated modules imported once by the interpreter replicas are forked from "
        "(the fork server and the prewarm pool; `process` launcher), for example `torch`: a "
        "replica, a replacement and a hibernated notebook's wake then find them imported "
        "instead of importing them (torch: 2-3 s of CPU per replica). Forked replicas share "
        "these pages copy-on-write, but each one's RSS counts them. Not needed for what "
        "`learn_preload` learns; set it for a host that should hold them from its start, before "
        "any notebook there imported them.", _module_list)
    learn_preload: bool = setting(
        True, "`process` launcher: learn what to preload. Installed top-level packages that "
        "replicas' cells import on this host (torch, pandas...) are imported by the fork server "
        "(and the prewarm pool's new interpreters) once the host is idle, so replicas started, "
        "replaced or woken from hibernation afterwards find them imported, as with "
        "`preload_modules` but without setting it. Only packages found under the standard "
        "library or site-packages, never a notebook's own modules; a failed import is logged "
        "and not retried; the fork server's memory is logged (shared copy-on-write with the "
        "replicas). What was learned: `preload-learned.json` in the host's state folder.")
    learn_preload_max: int = setting(
        8, "`learn_preload`: the most packages a host learns to preload (the configured "
        "`preload_modules` do not count).", _at_least(0))
    learn_preload_deny: str = setting(
        "debugpy", "`learn_preload`: comma-separated top-level packages never learned (debugpy: "
        "replicas leave the debugger unloaded on purpose).", _module_list)
    learn_preload_allow: str = setting(
        "", "`learn_preload`: when set, only these comma-separated top-level packages are "
        "learned; empty: any installed package.", _module_list)
    orphan_grace_s: float = setting(
        60.0, "`process` launcher: how long a replica whose Local Scheduler died waits for a "
        "restarted one to take it back before it ends itself (replicas outlive a crashed Local "
        "Scheduler).", _at_least(0.0))
    heartbeat_interval_s: float = setting(2.0, "Seconds between heartbeats.", _at_least(0.1))
    host_id: str = setting("", "This host's id in the cluster; empty means <hostname>-<grpc port>.")
    replica_module: str = setting(
        "notebookos.kernel", "Python module a replica process runs (`python -m MODULE -f FILE`).")
    stop_grace_period_s: float = setting(
        5.0, "Seconds a stopped replica gets between SIGTERM and SIGKILL.", _at_least(0.0))
    drain_timeout_s: float = setting(
        45.0, "On SIGTERM (a Swarm drain, a maintenance stop), the longest this Local Scheduler "
        "waits for the Global Scheduler to migrate its replicas to other hosts (each once its "
        "running cell has finished) before it stops what is left; keep it below the "
        "orchestrator's grace period (docker-compose.yml: 60 s). 0: no drain, the replicas stop "
        "with the host and are replaced afterwards.", _at_least(0.0))
    launcher: str = setting(
        "process", "How replicas run: `process` (a child process of this Local Scheduler) or "
        "`docker` (a container per replica, made through the Docker engine of this host; see "
        "docs/deployment.md).",
        lambda v: None if v in ("process", "docker") else "process or docker")
    docker_image: str = setting(
        "notebookos:latest", "docker launcher: the image replica containers run (the NotebookOS "
        "image, built by scripts/build-image.sh).", lambda v: None if v else "an image name")
    docker_network: str = setting(
        "", "docker launcher: the network replica containers join (a user-defined bridge, or an "
        "attachable overlay under Swarm); empty means the network of this Local Scheduler's own "
        "container.")
    docker_user: str = setting(
        "1000:1000", "docker launcher: the user replica containers run as (never root).",
        lambda v: None if v and v.split(":")[0] not in ("0", "root") else
        "a user other than root, e.g. 1000:1000")
    docker_pass_env: str = setting(
        "AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY,AWS_SESSION_TOKEN,AWS_DEFAULT_REGION,AWS_REGION",
        "docker launcher: comma-separated environment variables of this Local Scheduler handed to "
        "every replica container (the large-object store's credentials).")
    mps: bool = setting(
        False, "This host runs an MPS control daemon (`nvidia-cuda-mps-control -d`): replicas of "
        "kernels that may share a GPU (gpu_sla > 1, global_scheduler.gpu_sharing on) start with "
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = mps_percentage, capping each sharer's SMs.")
    mps_percentage: int = setting(
        50, "mps: the share of a GPU's SMs each sharing replica may use (1-100).",
        _between(1, 100))


@dataclass(frozen=True)
class KernelSettings:
    election_timeout_s: float = setting(
        0.5, "After the first committed LEAD, wait at most this long for missing proposals.",
        _at_least(0.0))
    sync_threshold_bytes: int = setting(
        1 << 20, "Values serialised larger than this go to the large-object store.", _at_least(0))
    raft_timeout_s: float = setting(2.0, "Raft leader-election timeout (upper bound).",
                                    _at_least(0.1))
    checkpoint: bool = setting(True, "Write a checkpoint of the namespace after each cell.")


@dataclass(frozen=True)
class JupyterSettings:
    port: int = setting(8888, "Port of JupyterLab started by `notebookos up`.", _port)
    token: str = setting("", "Jupyter Server token; empty generates one.", secret=True)
    open_browser: bool = setting(True, "Open a browser on `notebookos up`.")


@dataclass(frozen=True)
class SecuritySettings:
    ca_file: str = setting(
        "", "PEM file of the CA certificate(s) every gRPC peer must be signed by (several CAs may "
        "be concatenated while rotating); empty means <state_dir>/security/ca.pem, which "
        "`notebookos up` and the Global Scheduler create on first start.", _absolute_or_empty)
    cert_file: str = setting(
        "", "PEM certificate this process presents, as server and as client (mutual TLS); empty "
        "means <state_dir>/security/node.pem.", _absolute_or_empty)
    key_file: str = setting(
        "", "PEM private key of cert_file (keep it mode 0600); empty means "
        "<state_dir>/security/node-key.pem.", _absolute_or_empty)
    server_name: str = setting(
        "notebookos", "Name every gRPC client expects in the server's certificate (a DNS "
        "subject alternative name); `notebookos security init` puts it in every certificate. "
        "Empty checks the host part of each address instead.")
    join_token_file: str = setting(
        "", "File holding the cluster join token (one per line; the Global Scheduler accepts "
        "any line, a Local Scheduler presents the first); empty means "
        "<state_dir>/security/join-token.", _absolute_or_empty)
    join_token: str = setting(
        "", "The cluster join token itself, instead of join_token_file (prefer the file: "
        "environment variables are easier to leak).", _join_token_value, secret=True)
    metrics_tls: bool = setting(
        False, "Serve every daemon's Prometheus endpoint (/metrics, and the Global Scheduler's "
        "/sd) over HTTPS with cert_file, and accept only scrapers that present a certificate "
        "signed by ca_file (mutual TLS, as gRPC); Prometheus then needs `scheme: https` and a "
        "tls_config (docs/observability.md). Off: plain HTTP on each daemon's `host`.")


@dataclass(frozen=True)
class Config:
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    global_scheduler: GlobalSchedulerSettings = field(default_factory=GlobalSchedulerSettings)
    local_scheduler: LocalSchedulerSettings = field(default_factory=LocalSchedulerSettings)
    kernel: KernelSettings = field(default_factory=KernelSettings)
    jupyter: JupyterSettings = field(default_factory=JupyterSettings)
    security: SecuritySettings = field(default_factory=SecuritySettings)

    @property
    def state_path(self) -> Path:
        return Path(self.cluster.state_dir) if self.cluster.state_dir else default_state_dir()

    @property
    def store_url(self) -> str:
        return self.cluster.store or (self.state_path / "store").resolve().as_uri()

    def get(self, dotted: str) -> Any:
        section, name = _split(dotted)
        return getattr(getattr(self, section), name)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


# -- introspection ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SettingInfo:
    section: str
    name: str
    type: type
    default: Any
    help: str
    check: Callable[[Any], str | None] | None
    secret: bool = False

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def env_var(self) -> str:
        return f"{ENV_PREFIX}{self.section.upper()}_{self.name.upper()}"


_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def settings() -> list[SettingInfo]:
    """Every setting, in declaration order."""
    out = []
    for section in dataclasses.fields(Config):
        cls = section.default_factory  # type: ignore[misc]
        for f in dataclasses.fields(cls):
            out.append(SettingInfo(section.name, f.name, _TYPES[str(f.type)], f.default,
                                   f.metadata["help"], f.metadata["check"],
                                   f.metadata.get("secret", False)))
    return out


def _split(dotted: str) -> tuple[str, str]:
    section, _, name = dotted.partition(".")
    known = {s.dotted for s in settings()}
    if dotted not in known:
        raise ConfigError(f"unknown setting {dotted!r}; known settings: {', '.join(sorted(known))}")
    return section, name


# -- loading ---------------------------------------------------------------------------------


def _coerce(info: SettingInfo, value: Any, source: str) -> Any:
    """Turn a raw value (a TOML value, or a string from the environment) into the setting's type."""

    def fail(reason: str) -> ConfigError:
        shown = SECRET_MASK if info.secret else repr(value)
        return ConfigError(
            f"setting {info.dotted} = {shown} (from {source}) is not allowed: {reason}"
        )

    t = info.type
    if t is bool:
        if isinstance(value, bool):
            result: Any = value
        elif isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
            result = True
        elif isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
            result = False
        else:
            raise fail("expected true or false")
    elif t is int:
        if isinstance(value, bool):
            raise fail("expected an integer")
        if isinstance(value, int):
            result = value
        elif isinstance(value, str):
            try:
                result = int(value.strip(), 0)
            except ValueError:
                raise fail("expected an integer") from None
        else:
            raise fail("expected an integer")
    elif t is float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise fail("expected a number")
        try:
            result = float(value)
        except ValueError:
            raise fail("expected a number") from None
        if result != result or result in (float("inf"), float("-inf")):
            raise fail("expected a finite number")
    else:
        if not isinstance(value, str):
            raise fail("expected a string")
        result = value
    if info.check is not None:
        allowed = info.check(result)
        if allowed is not None:
            raise fail(f"expected {allowed}")
    return result


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Build the configuration from defaults, a TOML file, the environment and overrides.

    ``path`` defaults to ``$NOTEBOOKOS_CONFIG`` when set. ``overrides`` maps dotted names
    (``"cluster.policy"``) to values from command-line flags; ``None`` values are ignored so
    that unset flags fall through to lower sources.
    """
    env = os.environ if env is None else env
    infos = {info.dotted: info for info in settings()}
    values: dict[str, Any] = {}

    if path is None:
        path = env.get(CONFIG_FILE_ENV) or None
    if path is not None:
        values.update(_from_toml(Path(path), infos))

    for info in infos.values():
        if info.env_var in env:
            values[info.dotted] = _coerce(info, env[info.env_var], f"${info.env_var}")
    sections = {info.section.upper() + "_" for info in infos.values()}
    env_vars = {info.env_var for info in infos.values()}
    unknown_env = sorted(
        k for k in env
        if k.startswith(ENV_PREFIX) and k not in env_vars
        and any(k[len(ENV_PREFIX):].startswith(section) for section in sections)
    )
    if unknown_env:  # a typo in a section's variable must not be silently ignored
        raise ConfigError(
            f"unknown environment setting(s) {unknown_env}; see docs/configuration.md"
        )

    for dotted, raw in (overrides or {}).items():
        if raw is None:
            continue
        if dotted not in infos:
            raise ConfigError(f"unknown setting {dotted!r}")
        values[dotted] = _coerce(infos[dotted], raw, "the command line")

    sections: dict[str, dict[str, Any]] = {}
    for info in infos.values():
        value = values.get(info.dotted, info.default)
        if info.dotted not in values and info.check is not None:
            _coerce(info, value, "the default")
        sections.setdefault(info.section, {})[info.name] = value
    config = Config(**{
        f.name: f.default_factory(**sections.get(f.name, {}))  # type: ignore[misc]
        for f in dataclasses.fields(Config)
    })
    _cross_check(config)
    return config


def _from_toml(path: Path, infos: Mapping[str, SettingInfo]) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"configuration file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration file {path} is not valid TOML: {exc}") from None
    values: dict[str, Any] = {}
    for section, table in data.items():
        if not isinstance(table, dict):
            raise ConfigError(
                f"{path}: top-level key {section!r} must be a table such as [{section}]; "
                f"sections are {sorted({i.section for i in infos.values()})}"
            )
        for name, raw in table.items():
            dotted = f"{section}.{name}"
            if dotted not in infos:
                raise ConfigError(f"{path}: unknown setting {dotted!r}; see docs/configuration.md")
            values[dotted] = _coerce(infos[dotted], raw, str(path))
    return values


def _cross_check(config: Config) -> None:
    gs = config.global_scheduler
    if gs.min_hosts > gs.max_hosts:
        raise ConfigError(
            f"setting global_scheduler.min_hosts = {gs.min_hosts} is not allowed: expected at most "
            f"global_scheduler.max_hosts ({gs.max_hosts})"
        )
    if gs.ces_day_s < gs.ces_check_interval_s:
        raise ConfigError(
            f"setting global_scheduler.ces_day_s = {gs.ces_day_s:g} is not allowed: expected at "
            f"least global_scheduler.ces_check_interval_s ({gs.ces_check_interval_s:g})")


# -- documentation ---------------------------------------------------------------------------


def render_markdown() -> str:
    """docs/configuration.md, generated from the declarations above."""
    lines = [
        "# Configuration",
        "",
        "<!-- Generated by `notebookos config docs`; tests/test_config.py fails when it is stale. -->",
        "",
        "Every component reads one configuration. Sources, lowest to highest precedence:",
        "",
        "1. the defaults below;",
        "2. a TOML file (`--config PATH` or `$NOTEBOOKOS_CONFIG`), with one table per section;",
        "3. environment variables `NOTEBOOKOS_<SECTION>_<NAME>`;",
        "4. command-line flags of the command being run.",
        "",
        "An invalid value stops the program at start with a message that names the setting, the",
        "value, where it came from and what is allowed. `notebookos config show` prints the",
        "effective configuration.",
        "",
        "```toml",
        "[cluster]",
        'policy = "notebookos"',
        "",
        "[local_scheduler]",
        "virtual_gpus = 8",
        "```",
    ]
    section = None
    for info in settings():
        if info.section != section:
            section = info.section
            lines += ["", f"## [{section}]", "", "| setting | type | default | environment | meaning |",
                      "|---|---|---|---|---|"]
        default = repr(info.default) if info.type is str else str(info.default).lower() \
            if info.type is bool else str(info.default)
        lines.append(
            f"| `{info.name}` | {info.type.__name__} | `{default}` | `{info.env_var}` | {info.help} |"
        )
    return "\n".join(lines) + "\n"
