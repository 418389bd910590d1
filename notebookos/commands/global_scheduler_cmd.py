"""``notebookos global-scheduler``: run the Global Scheduler daemon."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from notebookos.config import ConfigError, load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "global-scheduler", help="run the Global Scheduler daemon",
        description="Run the Global Scheduler: host registry, kernel placement, message "
                    "routing through per-kernel fronts, failure recovery.",
    )
    parser.add_argument("--host", help="address to bind (gRPC and kernel fronts)")
    parser.add_argument("--port", type=int, help="gRPC port")
    parser.add_argument("--metrics-port", type=int,
                        help="port of the Prometheus /metrics endpoint (0 picks a free one)")
    parser.add_argument("--policy", help="scheduling policy (notebookos, reservation, ...)")
    parser.add_argument("--registry-redis-url", help="keep the registry in this Redis")
    parser.add_argument("--state-dir", help="directory for the registry file and the store")
    parser.add_argument("--store", help="large-object store URL for the replicas")
    parser.add_argument("--log-level", default=os.environ.get("NOTEBOOKOS_LOG_LEVEL", "INFO"),
                        help="logging level (default INFO, or NOTEBOOKOS_LOG_LEVEL)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s global-scheduler %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config, overrides={
            "global_scheduler.host": args.host,
            "global_scheduler.grpc_port": args.port,
            "global_scheduler.metrics_port": args.metrics_port,
            "global_scheduler.registry_redis_url": args.registry_redis_url,
            "cluster.policy": args.policy,
            "cluster.state_dir": args.state_dir,
            "cluster.store": args.store,
        })
    except ConfigError as exc:
        print(f"notebookos: {exc}", file=sys.stderr)
        return 2
    from notebookos.global_scheduler.daemon import run as run_daemon
    from notebookos.security import SecurityError

    try:
        return run_daemon(config)
    except (OSError, ValueError, SecurityError) as exc:
        print(f"notebookos global-scheduler: {exc}", file=sys.stderr)
        return 1
