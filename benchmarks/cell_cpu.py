"""CPU per trivial cell, per process and per thread, on the kernel's own ZMQ ports.

Starts a Global Scheduler and three Local Schedulers as ``notebookos up`` does (virtual GPUs),
one ``notebookos`` kernel, and a jupyter_client client that runs ``1+1`` cell after cell
(``execute_interactive``), after warm-up cells and once the cluster has settled. Reports the
CPU (user + system, ``/proc``) each process spent per cell over the measured cells: the Global
Scheduler split by thread (its front loop, libzmq's I/O thread, the placement pool, the release
timer: threads are told apart by id, the busiest Python one is the loop), the Local Schedulers,
the executor and the two standbys (each by thread too: the main thread vs pysyncobj's tick
thread). On a saturated 2-core machine CPU per cell is what a cell's latency follows; its
ratios (Global Scheduler / executor, standby / executor) move less with other load than the
absolute figures, so compare two trees by running this alternately with each.

``--py-spy FILE``: also record the Global Scheduler with py-spy (``pip install py-spy``) over
the measured cells, raw (collapsed stacks) to FILE; a debugging aid, not part of the product.
Usage: ``python benchmarks/cell_cpu.py [--json] [--cells N] [--py-spy FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from jupyter_client.manager import KernelManager

sys.path.insert(0, str(Path(__file__).resolve().parent))
from jupyter import start_cluster, wait_quiet  # noqa: E402 - the sibling benchmark's helpers

from notebookos.supervisor import marked_processes  # noqa: E402
from notebookos.testing import smoke  # noqa: E402


def role(pid: int) -> str:
    try:
        cmdline = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return "gone"
    if "local-scheduler" in cmdline:
        return "local_scheduler"
    if "global-scheduler" in cmdline:
        return "global_scheduler"
    if "ReplicaKernel" in cmdline:  # a replica's arguments (a fork server's child too)
        return "replica"
    return "other"  # fork servers, prewarmed interpreters not yet a replica


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of each thread of ``pid`` ("name#tid")."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[f"{name}#{task.name}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def measure(cells: int, warmup: int, spy: str | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        supervisor, env = start_cluster(Path(tmp))
        saved = dict(os.environ)
        os.environ.update({k: v for k, v in env.items() if k.startswith("NOTEBOOKOS_")})
        km = KernelManager(kernel_name="notebookos")
        try:
            km.start_kernel()
            kc = km.client()
            kc.start_channels()
            kc.wait_for_ready(120)
            for _ in range(warmup):
                kc.execute_interactive("1+1", timeout=60, output_hook=lambda _: None)
            asyncio.run(wait_quiet(lambda: marked_processes(supervisor.marker)))
            roles = {pid: role(pid) for pid in marked_processes(supervisor.marker)}
            gs = next(pid for pid, r in roles.items() if r == "global_scheduler")
            recorder = None
            if spy:
                exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
                recorder = subprocess.Popen([exe, "record", "-p", str(gs), "-r", "500", "-f",
                                             "raw", "-o", spy, "--nonblocking"],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            before = {pid: thread_cpu(pid) for pid in roles}
            times = []
            for _ in range(cells):
                start = time.perf_counter()
                kc.execute_interactive("1+1", timeout=60, output_hook=lambda _: None)
                times.append((time.perf_counter() - start) * 1000)
            after = {pid: thread_cpu(pid) for pid in roles if psutil.pid_exists(pid)}
            if recorder is not None:
                recorder.send_signal(2)
                recorder.wait(30)
            kc.stop_channels()
        finally:
            km.shutdown_kernel(now=False)
            os.environ.clear()
            os.environ.update(saved)
            supervisor.stop()
    per_cell = {}
    for pid, threads in after.items():
        spent = {name: (cpu - before[pid].get(name, 0.0)) * 1000 / cells
                 for name, cpu in threads.items()}
        per_cell[pid] = {name: round(ms, 3) for name, ms in
                         sorted(spent.items(), key=lambda kv: -kv[1]) if ms >= 0.005}
    replicas = sorted((pid for pid in per_cell if roles[pid] == "replica"),
                      key=lambda pid: -sum(per_cell[pid].values()))
    total = {pid: round(sum(per_cell[pid].values()), 3) for pid in per_cell}
    result: dict = {
        "cells": cells,
        "p50_ms": round(statistics.median(times), 3),
        "global_scheduler_ms": total[gs],
        "global_scheduler_threads": per_cell[gs],
        "local_schedulers_ms": round(sum(total[p] for p in per_cell
                                         if roles[p] == "local_scheduler"), 3),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }
    if replicas:
        result["executor_ms"] = total[replicas[0]]
        result["executor_threads"] = per_cell[replicas[0]]
        result["standbys_ms"] = [total[p] for p in replicas[1:]]
        result["standby_threads"] = [per_cell[p] for p in replicas[1:]]
        result["global_scheduler_per_executor"] = round(total[gs] / total[replicas[0]], 3)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--cells", type=int, default=800)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--py-spy", dest="spy", metavar="FILE",
                        help="record the Global Scheduler with py-spy to FILE (raw stacks)")
    args = smoke.parse_args(parser, cells=10, warmup=2)
    result = measure(args.cells, args.warmup, args.spy)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
