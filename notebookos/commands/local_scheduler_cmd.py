"""``notebookos local-scheduler``: run one Local Scheduler daemon (one per GPU host)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from notebookos.config import ConfigError, load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "local-scheduler", help="run a Local Scheduler daemon (one per GPU host)",
        description="Run a Local Scheduler: registers this host with the Global Scheduler, "
                    "launches replicas, binds GPUs per cell, keeps a prewarm pool.",
    )
    parser.add_argument("--host-id", help="this host's id (default: <hostname>-<grpc port>)")
    parser.add_argument("--host", help="address to bind and advertise")
    parser.add_argument("--port", type=int, help="gRPC port (0 picks a free one)")
    parser.add_argument("--metrics-port", type=int,
                        help="port of the Prometheus /metrics endpoint (0 picks a free one)")
    parser.add_argument("--global-scheduler", metavar="HOST:PORT",
                        help="the Global Scheduler's gRPC address")
    parser.add_argument("--virtual-gpus", type=int,
                        help="GPUs to offer when no real GPU is found")
    parser.add_argument("--prewarm", type=int, help="prewarmed replica processes to keep")
    parser.add_argument("--replica-module", help="Python module a replica runs")
    parser.add_argument("--state-dir", help="directory for logs and connection files")
    parser.add_argument("--log-level", default=os.environ.get("NOTEBOOKOS_LOG_LEVEL", "INFO"),
                        help="logging level (default INFO, or NOTEBOOKOS_LOG_LEVEL)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s local-scheduler %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config, overrides={
            "local_scheduler.host_id": args.host_id,
            "local_scheduler.host": args.host,
            "local_scheduler.grpc_port": args.port,
            "local_scheduler.metrics_port": args.metrics_port,
            "local_scheduler.global_scheduler": args.global_scheduler,
            "local_scheduler.virtual_gpus": args.virtual_gpus,
            "local_scheduler.prewarm_pool_size": args.prewarm,
            "local_scheduler.replica_module": args.replica_module,
            "cluster.state_dir": args.state_dir,
        })
    except ConfigError as exc:
        print(f"notebookos: {exc}", file=sys.stderr)
        return 2
    from notebookos.local_scheduler.daemon import run as run_daemon
    from notebookos.security import SecurityError

    try:
        return run_daemon(config)
    except (OSError, SecurityError) as exc:
        print(f"notebookos local-scheduler: {exc}", file=sys.stderr)
        return 1
