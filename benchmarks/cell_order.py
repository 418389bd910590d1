"""The cell orders live and simulated on the same input: alice runs four notebooks and bob one,
every notebook running 1 s cells back to back, on three hosts with one GPU each (every host
holds a replica of every kernel). Reports each user's mean wait for GPUs per cell, live (a real
loopback cluster: Global Scheduler, Local Schedulers, replica processes, virtual GPUs) and in the
simulator (the same policy code, ``notebookos.policies.cell_order``), for each order.

    python benchmarks/cell_order.py --seconds 20 --json cell_order.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from notebookos.testing import smoke

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "schedulers"))  # the tests' loopback cluster harness

NOTEBOOKS = [("alice-1", "alice"), ("alice-2", "alice"), ("alice-3", "alice"),
             ("alice-4", "alice"), ("bob", "bob")]
CELL_S = 1.0


def by_user(waits: dict[str, list[float]]) -> dict[str, float]:
    users: dict[str, list[float]] = {}
    for name, user in NOTEBOOKS:
        users.setdefault(user, []).extend(waits.get(name, []))
    return {u: round(statistics.fmean(w), 3) if w else 0.0 for u, w in users.items()}


def live(order: str, seconds: float) -> dict[str, float]:
    from notebookos.testing.credentials import install_session_credentials

    install_session_credentials()
    from sched_cluster import Cluster, run_seen

    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp), {"NOTEBOOKOS_CLUSTER_MAX_SUBSCRIPTION_RATIO": "7",
                                      "NOTEBOOKOS_GLOBAL_SCHEDULER_CELL_ORDER": order})
        try:
            cluster.start_gs()
            for i in range(3):
                cluster.start_ls(f"host-{i}", gpus=1, prewarm=0)
            cluster.wait_hosts(3)
            clients = {}
            for name, user in NOTEBOOKS:
                _, kc = cluster.start_kernel(gpus=1, hints={"user": user, "notebook": name})
                run_seen(kc, "import time")
                clients[name] = kc
            waits: dict[str, list[float]] = {n: [] for n in clients}
            barrier = threading.Barrier(len(clients))

            def notebook(name: str) -> None:
                barrier.wait()
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    meta = run_seen(clients[name], f"time.sleep({CELL_S})")["reply"][
                        "metadata"]["notebookos"]
                    waits[name].append(meta.get("waited_ms", 0) / 1000
                                       if meta.get("waited_for") else 0.0)

            threads = [threading.Thread(target=notebook, args=(n,)) for n in clients]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return by_user(waits)
        finally:
            cluster.close()


def simulated(order: str, cells: int) -> dict[str, float]:
    from notebookos.simulator.config import SimConfig
    from notebookos.simulator.records import cell_waits
    from notebookos.simulator.runner import simulate
    from notebookos.workload.generator import back_to_back

    config = SimConfig(hosts=3, gpus_per_host=1, autoscale=False, max_hosts=3, cell_order=order,
                       policy_params={"notebookos": {"max_subscription_ratio": 7}})
    _, record = simulate(back_to_back(NOTEBOOKS, cells, CELL_S), "notebookos", config)
    return by_user(cell_waits(record))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="live contention per order")
    ap.add_argument("--orders", nargs="+", default=["arrival", "themis"])
    ap.add_argument("--no-live", action="store_true", help="the simulator only")
    ap.add_argument("--json", type=Path)
    args = smoke.parse_args(ap, seconds=3.0, orders=["arrival"])
    rows = []
    for order in args.orders:
        row = {"order": order,
               "simulated": simulated(order, cells=max(1, round(args.seconds / CELL_S * 0.6)))}
        if not args.no_live:
            row["live"] = live(order, args.seconds)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
