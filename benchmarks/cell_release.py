"""What one release costs the Global Scheduler's loop while batch/lcp cells wait for a host, or
replicated kernels' cells (notebookos) wait for GPUs (issue 32: one release with 200 lcp cells
waiting held the fronts' loop about 100 ms).

    python benchmarks/cell_release.py [--json] [--cells 200] [--policy lcp|batch|notebookos]
                                      [--repeats 5] [--code DIR] [--compare DIR] [--smoke]

In-process: the service's own per-cell container waits (``CellContainerMixin``) on a stand-in
holding just the state they use, a cluster model of --hosts 1-GPU hosts, each running a cell;
--cells parked kernels each send a 1-GPU cell, which waits on one ``LoopThread`` (the fronts'
loop). Then the running cells' GPUs are released, --hosts waiting cells take a host, and we
read, per repeat:

- ``loop_cpu_ms``: CPU the loop's thread spent from the release until it is idle again (every
  look at the queue runs on it: the time every front waits);
- ``order_keys``: how often the cell order was asked for a cell's key (each look at the queue
  sorts it: the work, counted, not timed);
- ``decisions``: container cycles run.

``--policy notebookos`` (replicated kernels, execution.py): --cells cells wait for GPUs in the
cell queue (``_wait_for_gpus``, the service's own turns and pauses; a try takes a free GPU or
fails, on a thread of the placement pool as in the service: it stands for the scheduling
cycle and the Local Scheduler's CommitGpus), every GPU committed; then --hosts GPUs are
released, and we read, from the release until every waiting cell has tried since it (each
does, in its turn) and the freed GPUs are taken: ``loop_cpu_ms``, ``order_keys``, and
``decisions``: the tries.

Figures are the medians over --repeats. ``--code DIR`` imports the ``notebookos`` packages from
another checkout (a worktree of the code before); ``--compare DIR`` runs this benchmark on DIR
and on this checkout, alternately, and prints both.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"notebookos": "notebookos", "notebookos.global_scheduler": "global_scheduler",
            "notebookos.kernel": "kernel", "notebookos.local_scheduler": "local_scheduler",
            "notebookos.provisioner": "provisioner"}


def use_code(root: Path) -> None:
    """Import the ``notebookos`` packages from checkout ``root`` (as its editable install
    would), before anything imports them."""
    mapping = {name: str(root / folder) for name, folder in PACKAGES.items()}

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname in mapping:
                return importlib.util.spec_from_file_location(
                    fullname, str(Path(mapping[fullname]) / "__init__.py"),
                    submodule_search_locations=[mapping[fullname]])
            parent = fullname.rpartition(".")[0]
            if parent in mapping:
                return importlib.machinery.PathFinder.find_spec(fullname, path=[mapping[parent]])
            return None

    sys.meta_path.insert(0, Finder())


def measure(policy: str, cells: int, hosts: int) -> dict[str, float]:
    from notebookos.cluster import Cluster, Host
    from notebookos.global_scheduler.cell_containers import CellContainerMixin
    from notebookos.global_scheduler.cell_queue import CellQueue
    from notebookos.global_scheduler.execution import ExecutionMixin
    from notebookos.global_scheduler.kernel_modes import CellContainers
    from notebookos.global_scheduler.kernels import KernelEntry
    from notebookos.global_scheduler.loop_waits import SignallingCondition
    from notebookos.global_scheduler.state_lock import StateLock
    from notebookos.loop_thread import LoopThread
    from notebookos.policies import get_policy
    from notebookos.policies.cell_order import ArrivalOrder
    from notebookos.resources import ResourceSpec

    one_gpu = ResourceSpec(1000, 1000, 1, 1.0)

    class CountingOrder(ArrivalOrder):
        keys = 0

        def key(self, cell: Any, now: float) -> Any:
            CountingOrder.keys += 1
            return super().key(cell, now)

    class Link:
        draining = False
        unreachable_since = 0.0

    class Slots(CellContainerMixin, ExecutionMixin):
        def __init__(self) -> None:
            self.lock = StateLock()  # as the service's: awaited on the loop
            self._cell_cv = SignallingCondition(self.lock)
            self._placement_cv = SignallingCondition()
            self._kernels_changed = SignallingCondition(self._placement_cv._lock)
            self._gpu_releases = 0
            self._withdrawn_cells: set[tuple[str, str]] = set()
            self._stop = threading.Event()
            self._pool = type("Pool", (), {"submit": staticmethod(lambda *_: None)})()
            self.cell_queue = CellQueue(CountingOrder())
            self._cell_waiters: list = []
            self.cell_queue_timeout_s = 600.0
            self.cluster = Cluster()
            for i in range(hosts):
                self.cluster.add_host(Host(f"h{i}", ResourceSpec(8000, 64000, 1, 80.0)))
            self.policy = get_policy(policy)
            self.hosts = {h: Link() for h in self.cluster.hosts}
            self.kernels: dict[str, KernelEntry] = {}
            self.cycle_recorder = None
            self.on_capacity_wanted = None
            self.decisions = 0

        def _decide_containers(self, *args: Any, **kwargs: Any) -> Any:
            self.decisions += 1
            return super()._decide_containers(*args, **kwargs)

        async def _start_cell_container(self, *args: Any) -> tuple[int, list[int]]:
            return 1, [0]  # a coroutine on the loop, as the service's (cell_containers.py)

    s = Slots()
    for host in s.cluster.hosts.values():
        host.reserve("running", one_gpu)
    for i in range(cells):
        s.cluster.add_kernel(f"k{i}", one_gpu)
        s.kernels[f"k{i}"] = KernelEntry(f"k{i}", "key", "hmac-sha256", "python3", {},
                                         state="parked")
    mode = CellContainers(s)
    loop = LoopThread("cell-release-bench")
    waits = [loop.spawn(mode.place_execute_async(f"k{i}", "m", {})) for i in range(cells)]
    try:
        deadline = time.monotonic() + 120
        while len(s._cell_waiters) < cells:
            assert time.monotonic() < deadline, "the cells did not all join"
            time.sleep(0.01)
        time.sleep(0.3)  # every look done: the loop idles
        cpu_before = loop.run(time.thread_time)
        keys_before, decisions_before = CountingOrder.keys, s.decisions
        with s.lock:
            for host in s.cluster.hosts.values():
                host.cancel_reservation("running")
        s._cell_released("running")
        for f in waits[:hosts]:
            f.result(timeout=60)
        idle_since = loop.run(time.thread_time)
        while True:  # until the loop spends no more CPU (the release's work is done)
            time.sleep(0.2)
            now_cpu = loop.run(time.thread_time)
            if now_cpu - idle_since < 0.002:
                break
            idle_since = now_cpu
        result = {"loop_cpu_ms": (idle_since - cpu_before) * 1000,
                  "order_keys": CountingOrder.keys - keys_before,
                  "decisions": s.decisions - decisions_before}
        assert not any(f.done() for f in waits[hosts:]), "a cell went without a host"
    finally:
        _stop(s, loop, waits)
    return result


def measure_replicated(cells: int, gpus: int) -> dict[str, float]:
    """One release of ``gpus`` GPUs while ``cells`` replicated kernels' cells wait for them."""
    from types import SimpleNamespace

    from notebookos.global_scheduler.cell_queue import CellQueue
    from notebookos.global_scheduler.execution import ExecutionMixin, _Pass
    from notebookos.global_scheduler.loop_waits import SignallingCondition
    from notebookos.global_scheduler.state_lock import StateLock
    from notebookos.loop_thread import LoopThread
    from notebookos.policies.cell_order import ArrivalOrder
    from notebookos.resources import ResourceSpec

    class CountingOrder(ArrivalOrder):
        keys = 0

        def key(self, cell: Any, now: float) -> Any:
            CountingOrder.keys += 1
            return super().key(cell, now)

    class Cells(ExecutionMixin):
        def __init__(self) -> None:
            self.lock = StateLock()  # as the service's: awaited on the loop
            self._placement_cv = SignallingCondition()
            self._kernels_changed = SignallingCondition(self._placement_cv._lock)
            self._cell_cv = SignallingCondition()
            self._gpu_releases = 0
            self._withdrawn_cells: set[tuple[str, str]] = set()
            self._stop = threading.Event()
            self.cell_queue = CellQueue(CountingOrder())
            self.kernels: dict = {}
            self.cluster = SimpleNamespace(total_gpus=gpus)
            self.cell_queue_timeout_s = 600.0
            self.migration_retries = 3
            self.free = 0
            self.tries = 0
            self.placed = 0
            self.free_lock = threading.Lock()

        def _try_held(self, kernel_id: str, msg_id: str, request: Any) -> Any:
            return _Pass(None, None, None, False)  # no held GPUs: every try goes to a thread

        def _try_place(self, kernel_id: str, msg_id: str, request: Any,
                       first: Any = None) -> Any:
            with self.free_lock:
                self.tries += 1
                if self.free <= 0:
                    return None, "every GPU is committed", False
                self.free -= 1
                self.placed += 1
                return (1, [0]), "", False

        def all_tried_since(self, releases: int) -> bool:
            with self._placement_cv:
                return all(w.failed_at >= releases
                           for w in self.cell_queue._waiters.values())

    def until(predicate: Any, what: str) -> None:
        deadline = time.monotonic() + 300
        while not predicate():
            assert time.monotonic() < deadline, what
            time.sleep(0.005)

    s = Cells()
    loop = LoopThread("cell-release-bench")
    waits = [loop.spawn(s._wait_for_gpus(f"k{i}", "m", ResourceSpec(1000, 1000, 1, 1.0)))
             for i in range(cells)]
    try:
        until(lambda: s.cell_queue.waiting() == cells and s.all_tried_since(0),
              "the cells did not all try")
        time.sleep(0.3)
        cpu_before = loop.run(time.thread_time, timeout=120)
        keys_before, tries_before = CountingOrder.keys, s.tries
        with s.free_lock:
            s.free = gpus
        s._gpus_released()
        until(lambda: s.placed == gpus and s.all_tried_since(1),
              "the release's turns did not all come")
        cpu_after = loop.run(time.thread_time, timeout=120)
        result = {"loop_cpu_ms": (cpu_after - cpu_before) * 1000,
                  "order_keys": CountingOrder.keys - keys_before,
                  "decisions": s.tries - tries_before}
    finally:
        _stop(s, loop, waits)
    return result


def _stop(s: Any, loop: Any, waits: list) -> None:
    """Stop the stand-in's waits, wait for each to end, and close its loop."""
    from notebookos.global_scheduler.front import PlacementFailed

    s._stop.set()
    s._wake_waiting_placements()
    for f in waits:
        try:
            f.result(timeout=120)
        except PlacementFailed:
            pass
    loop.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.policy == "notebookos":
        rows = [measure_replicated(args.cells, args.hosts) for _ in range(args.repeats)]
    else:
        rows = [measure(args.policy, args.cells, args.hosts) for _ in range(args.repeats)]
    out: dict[str, Any] = {"policy": args.policy, "cells": args.cells, "hosts": args.hosts,
                           "repeats": args.repeats}
    for name in rows[0]:
        values = [row[name] for row in rows]
        out[name] = round(statistics.median(values), 2)
        out[f"{name}_all"] = [round(v, 2) for v in values]
    return out


def compare(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """This benchmark on ``base``'s code and on this checkout's, alternately (one repeat per
    subprocess, so that neither runs on a warmer machine), medians of each."""
    common = ["--json", "--policy", args.policy, "--cells", str(args.cells),
              "--hosts", str(args.hosts), "--repeats", "1"]
    rows: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(args.repeats):
        for label, code in (("before", str(base)), ("after", str(ROOT))):
            done = subprocess.run([sys.executable, __file__, *common, "--code", code],
                                  capture_output=True, text=True, check=True, timeout=600)
            rows[label].append(json.loads(done.stdout))
    out: dict[str, Any] = {"policy": args.policy, "cells": args.cells, "hosts": args.hosts,
                           "repeats": args.repeats, "base": str(base)}
    for label, runs in rows.items():
        for name in ("loop_cpu_ms", "order_keys", "decisions"):
            values = [r[name] for r in runs]
            out[f"{label}_{name}"] = round(statistics.median(values), 2)
            out[f"{label}_{name}_all"] = values
    return out


def main(argv: list[str] | None = None) -> int:
    from notebookos.testing import smoke

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--policy", choices=["batch", "lcp", "notebookos"], default="lcp",
                        help="notebookos: replicated kernels' cells waiting for GPUs")
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--hosts", type=int, default=2,
                        help="1-GPU hosts (notebookos: the GPUs the release frees)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--code", type=Path, help="a checkout whose code runs (default: this)")
    parser.add_argument("--compare", type=Path, help="a checkout of the code before")
    args = smoke.parse_args(parser, argv, cells=10, repeats=1)
    results = compare(args, args.compare) if args.compare else run(args)
    if args.json:
        print(json.dumps(results))
    else:
        for name, value in results.items():
            print(f"{name}: {value}")
    return 0


if __name__ == "__main__":
    if "--code" in sys.argv:
        use_code(Path(sys.argv[sys.argv.index("--code") + 1]).resolve())
    sys.exit(main())
