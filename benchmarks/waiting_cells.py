"""What cells waiting for GPUs cost the Global Scheduler (issue 32): threads, CPU, wake-up.

    python benchmarks/waiting_cells.py [--json] [--kernels 12] [--hold-s 20] [--smoke]

A real loopback cluster (the Global Scheduler, three Local Schedulers with one virtual GPU each,
real replicas) and --kernels 1-GPU notebooks, each with ``v = i`` set. Three of them start a
--hold-s cell that holds every GPU; then every other notebook sends ``print(v)`` at once: those
cells wait for GPUs (every host already holds a replica of each kernel, so no migration helps).
Read from the Global Scheduler's process:

- ``gs_threads_idle``: its threads with every notebook idle;
- ``gs_threads_waiting``: its threads while the cells wait (the most seen over the wait, read
  every 0.5 s from /proc), and ``waiting_cells``, how many waited;
- ``gs_cpu_ms_per_s_waiting``: its CPU while they wait;
- ``first_waiting_cell_s``: the first holding cell's reply -> the first waiting cell's reply,
  and ``all_cells_s``: -> the last one's; ``state_ok``: every cell printed its own ``v``.

Before issue 32's change each waiting cell held a thread of the placement pool for its whole
wait; a waiting cell is now a coroutine on the fronts' loop.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "schedulers"))

from sched_cluster import Cluster, run_seen, stream_text  # noqa: E402

from notebookos.testing import smoke  # noqa: E402
from notebookos.testing.credentials import (  # noqa: E402
    install_session_credentials,
    remove_session_credentials,
)

HOSTS = 3


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kernels", type=int, default=12)
    parser.add_argument("--hold-s", type=float, default=20.0)
    args = smoke.parse_args(parser, argv, kernels=5, hold_s=6.0)
    if args.kernels <= HOSTS:
        parser.error(f"--kernels must be more than {HOSTS} (the GPUs the cells hold)")
    results: dict[str, Any] = {"kernels": args.kernels, "hold_s": args.hold_s}
    credentials = install_session_credentials()
    with tempfile.TemporaryDirectory() as folder:
        cluster = Cluster(Path(folder), {
            "NOTEBOOKOS_CLUSTER_MAX_SUBSCRIPTION_RATIO": str(args.kernels),
            "NOTEBOOKOS_GLOBAL_SCHEDULER_CELL_QUEUE_TIMEOUT_S": str(args.hold_s * 4 + 60),
            "NOTEBOOKOS_GLOBAL_SCHEDULER_REPLICA_START_TIMEOUT_S": "300"})
        try:
            cluster.start_gs()
            for i in range(HOSTS):
                cluster.start_ls(f"host-{i}", gpus=1, prewarm=0)
            cluster.wait_hosts(HOSTS)
            kernels = [cluster.start_kernel(gpus=1, timeout=300)[1] for _ in range(args.kernels)]
            for i, kc in enumerate(kernels):
                assert run_seen(kc, f"import time\nv = {i}", timeout=120)[
                    "reply"]["content"]["status"] == "ok"
            assert cluster.gs is not None
            gs = psutil.Process(cluster.gs.pid)
            time.sleep(3.0)
            results["gs_threads_idle"] = _threads(gs.pid)

            held_until: list[float] = []

            def holding_cell(kc: Any) -> None:
                run_seen(kc, f"time.sleep({args.hold_s})", timeout=args.hold_s * 4 + 60)
                held_until.append(time.monotonic())

            holders = [threading.Thread(target=holding_cell, args=(kc,))
                       for kc in kernels[:HOSTS]]
            for t in holders:
                t.start()
            time.sleep(2.0)  # the holders have their GPUs
            runs: dict[int, dict] = {}
            done_at: dict[int, float] = {}

            def waiting_cell(i: int) -> None:
                runs[i] = run_seen(kernels[i], "print(v)", timeout=args.hold_s * 4 + 60)
                done_at[i] = time.monotonic()

            waiters = [threading.Thread(target=waiting_cell, args=(i,))
                       for i in range(HOSTS, args.kernels)]
            for t in waiters:
                t.start()
            time.sleep(2.0)  # every waiting cell is placed and waits
            cpu_before, seen_threads = sum(gs.cpu_times()[:2]), 0
            window_started = time.monotonic()
            while any(t.is_alive() for t in holders):
                seen_threads = max(seen_threads, _threads(gs.pid))
                time.sleep(0.5)
            window = time.monotonic() - window_started
            results["gs_cpu_ms_per_s_waiting"] = round(
                (sum(gs.cpu_times()[:2]) - cpu_before) * 1000 / window, 2)
            results["gs_threads_waiting"] = seen_threads
            released = min(held_until)  # the first holder's reply: a GPU is free
            for t in waiters:
                t.join(args.hold_s * 4 + 60)
            results["waiting_cells"] = sum(
                1 for run in runs.values()
                if (run["reply"]["metadata"].get("notebookos") or {}).get("waited_for"))
            results["first_waiting_cell_s"] = round(min(done_at.values()) - released, 3)
            results["all_cells_s"] = round(max(done_at.values()) - released, 3)
            results["state_ok"] = all(
                run["reply"]["content"]["status"] == "ok"
                and stream_text(run, "stdout") == f"{i}\n" for i, run in runs.items()) \
                and len(runs) == args.kernels - HOSTS
        finally:
            cluster.close()
            remove_session_credentials(credentials)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for name, value in results.items():
            print(f"{name}: {value}")
    return 0 if results.get("state_ok") else 1


if __name__ == "__main__":
    sys.exit(main())
