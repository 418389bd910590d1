"""``notebookos up``: a whole local cluster and JupyterLab, on the embedded defaults.

Starts a Global Scheduler, ``--hosts`` Local Schedulers (virtual GPUs unless real ones are found),
installs the NotebookOS kernelspecs into this environment, and starts JupyterLab with ``notebookos``
as its default kernel. It prints the URL with its token. A daemon that dies once the cluster is
up (JupyterLab included) is restarted with a capped exponential backoff (said so on stderr, and
written to ``<state_dir>/run/supervisor.json`` for ``notebookos status`` and JupyterLab) while
everything else keeps running; it never gives up on it. Ctrl-C (SIGINT) or SIGTERM stops
everything and leaves no process behind; nothing else does. A daemon that fails before the
cluster first came up (a port in use, a bad setting) stops ``notebookos up`` with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import sys
import threading
import time
from pathlib import Path

import grpc

from notebookos.config import Config, ConfigError, load_config
from notebookos.proto import global_scheduler_pb2, global_scheduler_pb2_grpc
from notebookos.security import (
    SecurityError,
    child_environment,
    ensure_cluster_credentials,
    secure_channel,
)
from notebookos.supervisor import (
    RestartPolicy,
    Supervisor,
    port_probe,
    say_on_stderr,
    state_file,
)


def restart_policy(config: Config) -> RestartPolicy:
    """How `notebookos up` restarts a daemon that died (DESIGN section 4: a crashed daemon is
    restarted by whatever supervises it), from the ``cluster.restart_*`` settings."""
    cluster = config.cluster
    return RestartPolicy(backoff_initial_s=cluster.restart_backoff_s,
                         backoff_max_s=max(cluster.restart_backoff_s,
                                           cluster.restart_backoff_max_s),
                         healthy_after_s=cluster.restart_healthy_after_s)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "up", help="start a local cluster and JupyterLab",
        description="Start a Global Scheduler, N Local Schedulers and JupyterLab whose default "
                    "kernel is NotebookOS. Ctrl-C stops everything.",
    )
    parser.add_argument("--hosts", type=int, default=3, help="Local Schedulers to start (default 3)")
    parser.add_argument("--gpus-per-host", type=int,
                        help="virtual GPUs per host when no real GPU is found (default from config)")
    parser.add_argument("--policy", help="scheduling policy (default from config: notebookos)")
    parser.add_argument("--store", help="large-object store URL (default: a local directory)")
    parser.add_argument("--port", type=int, help="JupyterLab port (default 8888)")
    parser.add_argument("--token", help="Jupyter token (default: a random one)")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser")
    parser.add_argument("--state-dir", help="directory for logs, registry and store")
    parser.add_argument("--scheduler-port", type=int, help="Global Scheduler gRPC port")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.hosts < 1:
        print(f"notebookos up: --hosts {args.hosts} is not allowed: expected at least 1 "
              "(3 for replicated kernels)", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config, overrides={
            "cluster.policy": args.policy,
            "cluster.store": args.store,
            "cluster.state_dir": args.state_dir,
            "local_scheduler.virtual_gpus": args.gpus_per_host,
            "global_scheduler.grpc_port": args.scheduler_port,
            "jupyter.port": args.port,
            "jupyter.token": args.token,
            "jupyter.open_browser": False if args.no_browser else None,
        })
    except ConfigError as exc:
        print(f"notebookos up: {exc}", file=sys.stderr)
        return 2
    if args.hosts < config.cluster.replicas_per_kernel:
        print(f"notebookos up: warning: {args.hosts} host(s) cannot hold "
              f"{config.cluster.replicas_per_kernel} replicas on distinct hosts; kernels will "
              "not start until the cluster has enough hosts", file=sys.stderr)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    state_dir = config.state_path
    gs = config.global_scheduler
    supervisor = Supervisor(state_dir / "logs" / time.strftime("%Y%m%d-%H%M%S"),
                            state_path=state_file(config.state_path),
                            facts={"global_scheduler": f"{gs.host}:{gs.grpc_port}"})
    try:
        url = start_cluster(config, args.hosts, supervisor, stop)
        if url is None:
            return 130
        print(f"NotebookOS is up: {url}", flush=True)
        state = f" --state-dir {state_dir}" if args.state_dir else ""
        print(f"  status: notebookos status{state} --global-scheduler "
              f"{config.global_scheduler.host}:{config.global_scheduler.grpc_port}", flush=True)
        print(f"  logs:   {supervisor.log_dir}", flush=True)
        print("  Ctrl-C stops everything.", flush=True)
        why = supervisor.serve(stop)  # until Ctrl-C or SIGTERM: every daemon has a policy
        if why is not None:
            print(f"notebookos up: {why}", file=sys.stderr, flush=True)
            return 1
        return 0
    except (RuntimeError, SecurityError) as exc:
        print(f"notebookos up: {exc}", file=sys.stderr)
        return 1
    finally:
        say_on_stderr("notebookos up: stopping ...")
        leftovers = supervisor.stop()
        if leftovers:
            say_on_stderr(f"notebookos up: killed leftover processes {leftovers}")
        say_on_stderr("notebookos up: stopped")


def start_cluster(config: Config, hosts: int, supervisor: Supervisor,
                  stop: threading.Event) -> str | None:
    """Start everything; returns the JupyterLab URL, or None when asked to stop meanwhile."""
    from notebookos.provisioner.kernelspecs import install_kernelspecs

    install_kernelspecs(prefix=sys.prefix)
    env = start_schedulers(config, hosts, supervisor, stop)
    if env is None:
        return None
    jupyter = config.jupyter
    token = jupyter.token or secrets.token_hex(24)
    port = jupyter.port
    argv = [sys.executable, "-m", "jupyterlab", "--ip=127.0.0.1", f"--port={port}",
            "--port-retries=0", f"--IdentityProvider.token={token}",
            "--MappingKernelManager.default_kernel_name=notebookos",
            f"--ServerApp.open_browser={jupyter.open_browser}",
            f"--ServerApp.root_dir={Path.cwd()}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")
    lab = supervisor.start("jupyterlab", argv, env=env, restart=restart_policy(config),
                           ready=port_probe("127.0.0.1", port))
    supervisor.wait_for_port(lab, "127.0.0.1", port, timeout=90)
    return f"http://127.0.0.1:{port}/lab?token={token}"


def start_schedulers(config: Config, hosts: int, supervisor: Supervisor,
                     stop: threading.Event,
                     extra_env: dict[str, str] | None = None) -> dict[str, str] | None:
    """Start the Global Scheduler and ``hosts`` Local Schedulers; wait until all registered.

    Returns the environment under which clients (the provisioner in JupyterLab) find this
    cluster, or None when asked to stop meanwhile. ``extra_env`` (``NOTEBOOKOS_*`` settings)
    goes to every daemon and overrides the defaults set here.

    The cluster's CA, certificate and join token are made in the state directory on first start
    (unless the configuration points at files of its own: then they are only checked) and every
    process started here gets them through ``NOTEBOOKOS_SECURITY_*`` variables. Raises
    ``SecurityError`` (naming the setting to check) when they are unusable.
    """
    gs = config.global_scheduler
    ensure_cluster_credentials(config)
    address = f"{gs.host}:{gs.grpc_port}"
    state_dir = str(config.state_path)
    env = dict(os.environ)
    env.update({
        "NOTEBOOKOS_GLOBAL_SCHEDULER_HOST": gs.host,
        "NOTEBOOKOS_GLOBAL_SCHEDULER_GRPC_PORT": str(gs.grpc_port),
        "NOTEBOOKOS_CLUSTER_STATE_DIR": state_dir,
        "NOTEBOOKOS_CLUSTER_STORE": config.store_url,
        "NOTEBOOKOS_CLUSTER_POLICY": config.cluster.policy,
        # The autoscaler must not release the hosts started here; it may add more.
        "NOTEBOOKOS_GLOBAL_SCHEDULER_MIN_HOSTS": str(max(hosts, gs.min_hosts)),
        "NOTEBOOKOS_GLOBAL_SCHEDULER_MAX_HOSTS": str(max(hosts, gs.max_hosts)),
        **child_environment(config),
    })
    env.update(extra_env or {})
    cli = [sys.executable, "-m", "notebookos.cli"]
    gs_child = supervisor.start("global-scheduler", [
        *cli, "global-scheduler", "--host", gs.host, "--port", str(gs.grpc_port),
        "--policy", config.cluster.policy, "--store", config.store_url, "--state-dir", state_dir,
    ], env=env, restart=restart_policy(config), ready=port_probe(gs.host, gs.grpc_port))
    supervisor.wait_for_port(gs_child, gs.host, gs.grpc_port, timeout=60)
    for i in range(hosts):
        supervisor.start(f"local-scheduler-{i}", [
            *cli, "local-scheduler", "--host-id", f"host-{i}", "--host", "127.0.0.1",
            "--port", "0", "--global-scheduler", address,
            "--virtual-gpus", str(config.local_scheduler.virtual_gpus), "--state-dir", state_dir,
        ], env=env, restart=restart_policy(config), stop_group="local-schedulers")
    if not wait_for_hosts(config, address, hosts, timeout=90, stop=stop, supervisor=supervisor):
        return None
    return env


def wait_for_hosts(config: Config, address: str, hosts: int, timeout: float,
                   stop: threading.Event, supervisor: Supervisor) -> bool:
    deadline = time.monotonic() + timeout
    seen = 0
    with secure_channel(config, address) as channel:
        stub = global_scheduler_pb2_grpc.GlobalSchedulerStub(channel)
        while time.monotonic() < deadline:
            if stop.is_set():
                return False
            dead = supervisor.first_dead()
            if dead is not None:
                raise RuntimeError(f"{dead.name} exited with code {dead.proc.returncode}; last "
                                   f"lines of {dead.log_path}:\n{dead.tail()}")
            with contextlib.suppress(grpc.RpcError):
                status = stub.GetClusterStatus(global_scheduler_pb2.GetClusterStatusRequest(),
                                               timeout=2)
                seen = len(status.hosts)
                if seen >= hosts:
                    return True
            time.sleep(0.2)
    raise RuntimeError(f"only {seen} of {hosts} Local Schedulers registered within {timeout:g} s")
