"""``notebookos status [--json]``: hosts and kernels as the Global Scheduler sees them.

The JSON keys are a stable contract: ``hosts`` (``id``, ``address``, ``gpus`` with ``total``/
``committed``/``pending``, ``subscription_ratio``) and ``kernels`` (``id``, ``replicas`` with
``replica_id``/``host_id``/``pid``/``state``, ``executor``) and ``metrics`` (``global_scheduler``:
the URL of the Global Scheduler's Prometheus ``/metrics``, ``local_schedulers``: ``{host_id: URL}``,
``service_discovery``: the URL of its Prometheus HTTP service discovery; an empty string where a
daemon serves none). Each host's ``shared_gpus`` lists the devices two kernels' cells share now
(GPU sharing): ``device_id`` and ``replicas`` (``"kernel_id/replica_id"``, the first holder
first). Other keys may be added.

Where ``notebookos up`` runs the cluster, its supervisor's state file (``<state_dir>/run/
supervisor.json``) adds ``supervisor``: ``pid`` and ``daemons`` (``name``, ``state``: running,
starting, restarting, ...; ``attempt``, ``restarts``, ``last_exit``, ``retry_in_s`` while
restarting, ``description``). While the Global Scheduler cannot be reached, that is what is
printed (``{"supervisor": ...}`` with ``--json``), e.g. "global-scheduler: restarting, attempt 4,
next try in 8 s", and the exit code is still 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from notebookos.config import ConfigError, load_config
from notebookos.metrics import metrics_url
from notebookos.proto import common_pb2, global_scheduler_pb2
from notebookos.proto import global_scheduler_pb2_grpc as gs_grpc
from notebookos.security import SecurityError, secure_channel
from notebookos.supervisor import describe, read_state, retry_in_s, state_file


def supervisor_document(state_dir: Path, address: str | None = None) -> dict[str, Any] | None:
    """What a live ``notebookos up`` says of its daemons (None when no such supervisor runs, or
    it runs a cluster whose Global Scheduler is not at ``address``)."""
    doc = read_state(state_file(state_dir))
    if doc is None or (address and doc.get("global_scheduler", address) != address):
        return None
    now = time.time()
    daemons = []
    for entry in doc["daemons"]:
        wait = retry_in_s(entry, now)
        daemons.append({**{k: v for k, v in entry.items() if k != "next_try_at"},
                        "retry_in_s": None if wait is None else round(wait, 1),
                        "description": describe(entry, now)})
    return {"pid": doc.get("supervisor_pid"), "stopping": bool(doc.get("stopping")),
            "global_scheduler": doc.get("global_scheduler", ""), "daemons": daemons}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status", help="show hosts, GPUs and kernels of a running cluster",
        description="Ask the Global Scheduler for hosts (GPUs total/committed/pending, "
                    "subscription ratio) and kernels (replicas, executor).",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--global-scheduler", metavar="HOST:PORT",
                        help="the Global Scheduler's gRPC address (default from the config)")
    parser.add_argument("--state-dir",
                        help="the cluster's state directory, where its TLS files are (default "
                             "from the config; what `notebookos up --state-dir` was given)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait (default 5)")
    parser.set_defaults(func=run)


def status_document(status: global_scheduler_pb2.ClusterStatus,
                    metrics_tls: bool = False) -> dict[str, Any]:
    hosts = [{
        "id": h.host_id,
        "address": h.address,
        "gpus": {"total": h.capacity.gpus, "committed": h.gpus_committed,
                 "pending": h.gpus_pending, "subscribed": h.subscribed.gpus,
                 "virtual": h.virtual_gpus},
        "subscription_ratio": round(h.subscription_ratio, 6),
        "prewarm_pool_size": h.prewarm_pool_size,
        "draining": h.draining,
        "shared_gpus": [{"device_id": g.device_id, "replicas": list(g.shared_by)}
                        for g in h.gpus if g.shared_by],
    } for h in status.hosts]
    kernels = [{
        "id": k.kernel_id,
        "state": common_pb2.KernelState.Name(k.state).removeprefix("KERNEL_STATE_").lower(),
        "replicas": [{
            "replica_id": r.replica_id, "host_id": r.host_id, "pid": r.pid,
            "state": common_pb2.ReplicaState.Name(r.state).removeprefix("REPLICA_STATE_").lower(),
        } for r in k.replicas],
        "executor": k.executor_replica_id or None,
        "message": k.message,
        "dropped_messages": k.dropped_messages,
        "last_interactivity_delay_ms": round(k.last_interactivity_delay_ms, 1),
        "last_container_start_ms": round(k.last_container_start_ms, 1),
        "queued_cells": k.queued_cells,
        # GPU time: GPU-hours the kernel's cells held, and what reserving its GPUs since it
        # started would have held
        "gpu_hours_used": round(k.gpu_seconds_used / 3600, 6),
        "gpu_hours_reserved": round(k.gpu_seconds_reserved / 3600, 6),
    } for k in status.kernels]
    metrics = {
        "global_scheduler": metrics_url(status.metrics_address, metrics_tls),
        "local_schedulers": {h.host_id: metrics_url(h.metrics_address, metrics_tls)
                             for h in status.hosts},
        "service_discovery": metrics_url(status.metrics_address, metrics_tls, "/sd"),
    }
    return {"hosts": hosts, "kernels": kernels, "policy": status.policy, "metrics": metrics,
            "gpus": {"total": status.gpus_total, "committed": status.gpus_committed,
                     "pending": status.gpus_pending},
            "subscription_ratio_limit": status.subscription_ratio_limit}


def render_text(doc: dict[str, Any]) -> str:
    lines = [f"policy {doc['policy']}; GPUs {doc['gpus']['committed']} committed, "
             f"{doc['gpus']['pending']} pending of {doc['gpus']['total']}", "", "HOSTS"]
    lines.append(f"  {'id':<24} {'address':<22} {'gpus':>5} {'comm':>5} {'pend':>5} {'SR':>6}")
    for h in doc["hosts"]:
        g = h["gpus"]
        lines.append(f"  {h['id']:<24} {h['address']:<22} {g['total']:>5} {g['committed']:>5} "
                     f"{g['pending']:>5} {h['subscription_ratio']:>6.3f}")
        for shared in h.get("shared_gpus", []):
            lines.append(f"    GPU {shared['device_id']} shared by "
                         f"{' and '.join(shared['replicas'])}")
    lines += ["", "KERNELS"]
    for k in doc["kernels"]:
        delay = ""
        if k["last_interactivity_delay_ms"]:
            delay = f" delay={k['last_interactivity_delay_ms']:.0f}ms"
            if k["last_container_start_ms"]:
                delay += f" (container start {k['last_container_start_ms']:.0f}ms)"
        if k["queued_cells"]:
            delay += f" queued={k['queued_cells']}"
        if k["gpu_hours_reserved"]:
            delay += (f" gpu-hours={k['gpu_hours_used']:.3f}/{k['gpu_hours_reserved']:.3f}"
                      " reserved")
        lines.append(f"  {k['id']} ({k['state']}) executor={k['executor']}{delay}"
                     + (f"  {k['message']}" if k["message"] else ""))
        for r in k["replicas"]:
            lines.append(f"    replica {r['replica_id']} on {r['host_id']} pid {r['pid']} "
                         f"{r['state']}")
    if not doc["kernels"]:
        lines.append("  (none)")
    if doc["metrics"]["global_scheduler"]:
        lines += ["", f"METRICS  {doc['metrics']['global_scheduler']} (service discovery "
                      f"{doc['metrics']['service_discovery']})"]
    if doc.get("supervisor"):
        lines += ["", *render_supervisor(doc["supervisor"])]
    return "\n".join(lines)


def render_supervisor(supervisor: dict[str, Any]) -> list[str]:
    return [f"DAEMONS (notebookos up, pid {supervisor['pid']})",
            *(f"  {d['description']}" for d in supervisor["daemons"])]


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, overrides={"cluster.state_dir": args.state_dir})
    except ConfigError as exc:
        print(f"notebookos: {exc}", file=sys.stderr)
        return 2
    address = args.global_scheduler or f"{config.global_scheduler.host}:" \
        f"{config.global_scheduler.grpc_port}"
    try:
        channel = secure_channel(config, address)
    except SecurityError as exc:
        print(f"notebookos status: {exc}", file=sys.stderr)
        return 1
    supervisor = supervisor_document(config.state_path, address)
    with channel:
        try:
            status = gs_grpc.GlobalSchedulerStub(channel).GetClusterStatus(
                global_scheduler_pb2.GetClusterStatusRequest(), timeout=args.timeout)
        except grpc.RpcError as exc:
            print(f"notebookos status: cannot reach the Global Scheduler at {address}: "
                  f"{exc.details()}", file=sys.stderr)
            supervisor = supervisor_document(config.state_path, address)  # fresh, after waiting
            if supervisor is not None:
                print(json.dumps({"supervisor": supervisor}, indent=2) if args.json
                      else "\n".join(render_supervisor(supervisor)))
            return 1
    doc = status_document(status, config.security.metrics_tls)
    if supervisor is not None:
        doc["supervisor"] = supervisor
    print(json.dumps(doc, indent=2) if args.json else render_text(doc))
    return 0
