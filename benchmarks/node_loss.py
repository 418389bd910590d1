"""A whole node lost, on loopback: the next cell's latency and when the host is declared lost.

    python benchmarks/node_loss.py [--rounds 5] [--where executor] [--modes probe,heartbeat]
                                   [--json] [--smoke]

A real loopback cluster (the Global Scheduler, four Local Schedulers with two virtual GPUs each,
real replicas), the deployment's heartbeat timeout (10 s), one notebook. Each round, a "node"
that holds one of the notebook's replicas (the executor's, or a standby's with --where standby)
is lost --gap-s after a cell (``n += 1``) ended: its Local Scheduler and its replica processes
SIGKILLed at once, as a killed VM or node container resets every connection to it
(docs/deployment.md, "A GPU node lost"). Then the next cell (``n * 10``) is sent; it must see
what the cells before it left. (With the executor lost well after its last cell, the old code's
next cell was fast too: the host was already marked unreachable and the cell went elsewhere; a
node lost right after its executor's cell left the next one waiting for the lost executor.) A fresh Local Scheduler under a new host
id takes the lost node's place before the next round. Per round:

- ``next_cell_s``: the kill -> the next cell's reply;
- ``declared_lost_s``: the kill -> the host gone from the Global Scheduler's status;
- ``three_replicas_s``: the kill -> three replicas again, none on the lost host.

``--modes``: ``probe`` is the Global Scheduler as configured (a reset host whose replicas accept
no connection is declared lost at once, global_scheduler.node_probe_timeout_s); ``heartbeat``
sets node_probe_timeout_s to 0, the code before: only the heartbeat timeout. The modes alternate
round by round, each on its own cluster, so both see the same load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "schedulers"))

from sched_cluster import Cluster, result_text, run_cell  # noqa: E402

from notebookos.testing import smoke  # noqa: E402
from notebookos.testing.credentials import (  # noqa: E402
    install_session_credentials,
    remove_session_credentials,
)

HOSTS = 4
MODES = {"probe": {}, "heartbeat": {"NOTEBOOKOS_GLOBAL_SCHEDULER_NODE_PROBE_TIMEOUT_S": "0"}}


def _replicas(cluster: Cluster, kernel_id: str) -> dict[int, tuple[str, int, bool]]:
    return {r.replica_id: (r.host_id, r.pid, r.executor)
            for r in cluster.kernel(kernel_id).replicas}


def _round(cluster: Cluster, kernel_id: str, kc: Any, count: int, where: str,
           spare: str, gap_s: float) -> dict[str, Any]:
    assert result_text(run_cell(kc, "n += 1\nn", timeout=120)) == str(count)
    time.sleep(gap_s)
    replicas = _replicas(cluster, kernel_id)
    hosts = [h for h, _, executor in replicas.values() if executor == (where == "executor")]
    victim = hosts[0]
    groups = [cluster.ls[victim].pid, *(pid for h, pid, _ in replicas.values() if h == victim)]
    killed = time.monotonic()
    for pid in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    run = run_cell(kc, "n * 10", timeout=120)
    next_cell = time.monotonic() - killed
    ok = result_text(run) == str(count * 10)
    cluster.wait(lambda: victim not in {h.host_id for h in cluster.status().hosts}, 60,
                 "the node declared lost")
    lost = time.monotonic() - killed
    cluster.wait(lambda: len(r := _replicas(cluster, kernel_id)) == 3
                 and victim not in {h for h, _, _ in r.values()}
                 and cluster.kernel(kernel_id).state in (2, 3), 120, "three replicas again")
    whole = time.monotonic() - killed
    cluster.ls.pop(victim).wait(10)
    cluster.start_ls(spare)  # a fresh node in its place
    cluster.wait_hosts(HOSTS, 60)
    return {"next_cell_s": round(next_cell, 3), "declared_lost_s": round(lost, 3),
            "three_replicas_s": round(whole, 3), "state_ok": ok}


def _summary(samples: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(samples), 2), "min": round(min(samples), 2),
            "max": round(max(samples), 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per mode")
    parser.add_argument("--where", choices=("executor", "standby"), default="executor")
    parser.add_argument("--modes", default="probe,heartbeat")
    parser.add_argument("--gap-s", type=float, default=0.0,
                        help="seconds between the round's first cell and the kill")
    parser.add_argument("--heartbeat-timeout-s", type=float, default=10.0)
    parser.add_argument("--json", action="store_true")
    args = smoke.parse_args(parser, argv, rounds=1, modes="probe")
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}: choose from {sorted(MODES)}")
    rounds: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    credentials = install_session_credentials()
    try:
        with contextlib.ExitStack() as stack:
            clusters = {}
            for mode in modes:
                folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
                cluster = Cluster(folder, {
                    "NOTEBOOKOS_GLOBAL_SCHEDULER_HEARTBEAT_TIMEOUT_S":
                        str(args.heartbeat_timeout_s),
                    "NOTEBOOKOS_LOCAL_SCHEDULER_ORPHAN_GRACE_S": "30", **MODES[mode]})
                stack.callback(cluster.close)
                cluster.start_gs()
                for i in range(HOSTS):
                    cluster.start_ls(f"host-{i}")
                cluster.wait_hosts(HOSTS)
                kernel_id, kc = cluster.start_kernel(gpus=1, timeout=120)
                assert result_text(run_cell(kc, "n = 1\nn", timeout=120)) == "1"
                clusters[mode] = (cluster, kernel_id, kc)
            for r in range(args.rounds):
                for mode in modes:
                    cluster, kernel_id, kc = clusters[mode]
                    sample = _round(cluster, kernel_id, kc, r + 2, args.where,
                                    f"host-{HOSTS + r}", args.gap_s)
                    rounds[mode].append(sample)
                    print(f"{mode} round {r + 1}: {sample}", file=sys.stderr, flush=True)
    finally:
        remove_session_credentials(credentials)
    results: dict[str, Any] = {"where": args.where, "heartbeat_timeout_s": args.heartbeat_timeout_s,
                               "rounds": rounds}
    for mode, samples in rounds.items():
        results[mode] = {key: _summary([s[key] for s in samples])
                         for key in ("next_cell_s", "declared_lost_s", "three_replicas_s")}
        results[mode]["state_ok"] = all(s["state_ok"] for s in samples)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for mode in rounds:
            print(f"{mode}: {results[mode]}")
    return 0 if all(results[m]["state_ok"] for m in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
