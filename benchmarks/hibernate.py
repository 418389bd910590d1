"""Hibernation (issue 34): what a sleeping notebook costs, and how long waking it takes.

    python benchmarks/hibernate.py [--json] [--mib 100] [--notebooks 100] [--wake 20]
        [--preload torch] [--smoke]

On a real loopback cluster (a Global Scheduler and three Local Schedulers, real replicas;
``global_scheduler.hibernate_after_s`` = 2 s):

- ``plain_cold_start_s``: the baseline, same run: a plain ipykernel started by jupyter_client
  until its first cell's reply;
- ``fresh_start_s``: a NotebookOS kernel started until its first cell's reply (three replicas,
  nothing to restore: the replica-start part of a wake);
- one notebook holding a --mib MiB numpy array and a small torch model with its Adam optimizer:
  ``hibernated_replica_processes`` (its processes alive once hibernated: 0 is the target) and
  ``gs_cpu_ms_per_s_hibernated`` (the Global Scheduler's CPU over 5 s while it sleeps);
  ``wake_cell_s``: its next cell sent -> that cell's reply, with its state checked;
  ``wake_replicas_s``: the scheduler's own wake time (its replicas started and answering);
  ``wake_split``: where the wake's cell spent its time, as the replica that ran it reports
  (``metadata.notebookos.restore`` of its reply): ``start_s`` (its process handed the order ->
  its kernel running), ``read_s`` (the checkpoint's records and large objects fetched),
  ``apply_s`` (decoding left after the last fetch), ``agree_s`` (the Raft group ready and the
  restore committed), ``rest_s`` (the remainder of wake_cell_s: scheduling, the election, the
  cell, its reply and its state sync before ``idle``);
- --notebooks small notebooks (a dict and a list each) hibernated one after another, then --wake
  of them woken at once by a cell each: ``mass_wake_s`` (all replies in), all values checked.

--no-torch: the big notebook holds the array only (a woken replica that restores a torch model
imports torch first: 2.3 s alone on the 2-core VM). --smoke: 8 MiB, 4 notebooks, 2 woken.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "schedulers"))

from jupyter_client import KernelManager  # noqa: E402
from sched_cluster import Cluster, run_seen, stream_text  # noqa: E402

from notebookos.proto import common_pb2  # noqa: E402
from notebookos.testing import smoke  # noqa: E402
from notebookos.testing.credentials import (  # noqa: E402
    install_session_credentials,
    remove_session_credentials,
)

HIBERNATED = common_pb2.KERNEL_STATE_HIBERNATED


def plain_cold_start() -> float:
    started = time.perf_counter()
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        client.execute_interactive("x = 1", timeout=60)
        return time.perf_counter() - started
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


@contextlib.contextmanager
def cluster_folder(keep: str) -> Iterator[str]:
    """``keep`` (made if missing, left in place) when given, else a temporary folder."""
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory() as folder:
        yield folder


def wait_hibernated(cluster: Cluster, kernel_id: str, timeout: float = 120) -> None:
    cluster.wait(lambda: cluster.kernel(kernel_id).state == HIBERNATED
                 and not cluster.kernel(kernel_id).replicas, timeout, f"{kernel_id} hibernated")


def wake_split(woke: dict[str, Any], wake_cell_s: float) -> dict[str, float] | None:
    """The woken cell's split as its executor reported it, and the rest of ``wake_cell_s``."""
    metadata = woke["reply"].get("metadata") or {}
    split = (metadata.get("notebookos") or {}).get("restore")
    if not split:
        return None
    return {**split, "rest_s": round(wake_cell_s - sum(split.values()), 4)}


def cpu_ms_per_s(pid: int, window: float) -> float:
    process = psutil.Process(pid)
    before = sum(process.cpu_times()[:2])
    time.sleep(window)
    return (sum(process.cpu_times()[:2]) - before) * 1000 / window


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--notebooks", type=int, default=100)
    parser.add_argument("--wake", type=int, default=20)
    parser.add_argument("--no-torch", action="store_true",
                        help="the big notebook holds the array only (no torch import to redo)")
    parser.add_argument("--preload", default="", metavar="MODULES",
                        help="local_scheduler.preload_modules of the hosts (e.g. torch: the "
                             "replicas a wake starts find torch imported)")
    parser.add_argument("--logs", default="", metavar="DIR",
                        help="run the cluster in DIR and keep it (its daemons' and replicas' "
                             "logs) instead of a temporary folder")
    args = smoke.parse_args(parser, argv, mib=8, notebooks=4, wake=2)
    results: dict[str, Any] = {"mib": args.mib, "notebooks": args.notebooks, "woken": args.wake,
                               "preload": args.preload}
    results["plain_cold_start_s"] = plain_cold_start()
    credentials = install_session_credentials()  # TLS files for the cluster, as the tests do
    with cluster_folder(args.logs) as folder:
        cluster = Cluster(Path(folder), {"NOTEBOOKOS_GLOBAL_SCHEDULER_HIBERNATE_AFTER_S": "2",
                                         "NOTEBOOKOS_GLOBAL_SCHEDULER_REPLICA_START_TIMEOUT_S":
                                         "300",
                                         "NOTEBOOKOS_LOCAL_SCHEDULER_PRELOAD_MODULES":
                                         args.preload})
        try:
            cluster.start_gs()
            for i in range(3):
                cluster.start_ls(f"host-{i}", gpus=8, prewarm=1)
            cluster.wait_hosts(3)
            started = time.perf_counter()
            fresh_id, fresh = cluster.start_kernel(gpus=0)
            run_seen(fresh, "x = 1")
            results["fresh_start_s"] = time.perf_counter() - started

            kernel_id, kc = cluster.start_kernel(gpus=1)
            state = (f"import numpy as np, torch\nbig = np.full({args.mib} << 17, 7.0)\n"
                     "torch.manual_seed(0)\nmodel = torch.nn.Sequential(torch.nn.Linear(64, 64), "
                     "torch.nn.ReLU(), torch.nn.Linear(64, 10))\n"
                     "opt = torch.optim.Adam(model.parameters())\n"
                     "model(torch.randn(8, 64)).sum().backward()\nopt.step()\n"
                     "probe = float(model(torch.ones(1, 64)).sum())")
            check = ("print(float(big.sum()), float(model(torch.ones(1, 64)).sum()) == probe, "
                     "len(opt.state))")
            expected = f"{7.0 * (args.mib << 17)} True 4\n"
            if args.no_torch:
                state = f"import numpy as np\nbig = np.full({args.mib} << 17, 7.0)"
                check, expected = "print(float(big.sum()))", f"{7.0 * (args.mib << 17)}\n"
            results["torch"] = not args.no_torch
            assert run_seen(kc, state, timeout=300)["reply"]["content"]["status"] == "ok"
            pids = [r.pid for r in cluster.kernel(kernel_id).replicas]
            wait_hibernated(cluster, kernel_id)
            wait_hibernated(cluster, fresh_id)
            time.sleep(1.0)
            results["hibernated_replica_processes"] = sum(psutil.pid_exists(p) for p in pids)
            assert cluster.gs is not None
            results["gs_cpu_ms_per_s_hibernated"] = cpu_ms_per_s(cluster.gs.pid, 5.0)
            started = time.perf_counter()
            woke = run_seen(kc, check, timeout=300)
            results["wake_cell_s"] = time.perf_counter() - started
            results["wake_state_ok"] = stream_text(woke, "stdout") == expected
            message = cluster.kernel(kernel_id).message
            results["wake_replicas_s"] = float(message.split(" in ")[-1].split(" s")[0]) \
                if "woke from hibernation in" in message else None
            results["wake_split"] = wake_split(woke, results["wake_cell_s"])

            small = []
            for i in range(args.notebooks):
                nid, client = cluster.start_kernel(gpus=0)
                run_seen(client, f"rows = {{'n': {i}}}\nseen = [{i}] * 3")
                small.append((nid, client, i))
                if len(small) % 10 == 0:  # keep the awake ones few on 2 cores
                    for other, _, _ in small[-10:]:
                        wait_hibernated(cluster, other, timeout=300)
            for nid, _, _ in small:
                wait_hibernated(cluster, nid, timeout=300)
            results["hibernated_notebooks"] = sum(
                cluster.kernel(nid).state == HIBERNATED for nid, _, _ in small)
            woken = small[:args.wake]
            outputs: dict[int, str] = {}

            def wake(client: Any, i: int) -> None:
                run = run_seen(client, "print(rows['n'], seen)", timeout=600)
                outputs[i] = stream_text(run, "stdout")

            started = time.perf_counter()
            threads = [threading.Thread(target=wake, args=(c, i)) for _, c, i in woken]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            results["mass_wake_s"] = time.perf_counter() - started
            wrong = {i: outputs.get(i) for _, _, i in woken
                     if outputs.get(i) != f"{i} {[i] * 3}\n"}
            results["mass_wake_state_ok"] = not wrong
            if wrong:  # what each woken notebook printed instead
                results["mass_wake_wrong"] = {
                    str(i): {"printed": out, "kernel": nid, "status": str(cluster.kernel(nid))}
                    for nid, _, i in woken if i in wrong for out in [wrong[i]]}
        finally:
            cluster.close()
            remove_session_credentials(credentials)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for key, value in results.items():
            print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
