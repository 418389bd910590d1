"""The next cell after the executor's SIGKILL, as a notebook user sees it (issue 36).

A cluster started by ``notebookos up``, one notebook over Jupyter Server's websocket holding what
benchmarks/chaos.py holds (a 16 MiB numpy array, a torch model with its SGD optimizer, small
values), a few cells run so that the executor has done its lazy imports. Then, ``--kills`` times:
wait until the kernel is whole again and ``--settle`` seconds more (faults are rare: a standby has
had time to apply what it was sent), SIGKILL the executor, send the next cell at once and time it
to its reply, checking that it saw exactly the state the previous cell left.

Modes, each in its own cluster, run in alternating blocks so that each sees the same machine:

- ``warm``: as shipped (standbys import what the executor imported, kernel/module_warmup.py);
- ``cold``: ``NOTEBOOKOS_WARM_IMPORTS=0`` (standbys import only what applying the state needs);
- ``empty``: as shipped, a namespace with a counter only (the floor: election and routing).

With ``--nofault`` each kill is preceded by the same cell without a kill (and ``--settle`` seconds
more), timed the same way: what the cell costs anyway, the floor of the figure after a kill.

Usage: ``python benchmarks/failover.py [--kills 6] [--blocks 2] [--settle 8] [--modes warm,cold]
[--no-torch] [--nofault] [--json] [--keep DIR]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos import CHAOS_LINE, Verifier, cell_code, setup_code  # noqa: E402 - sibling benchmark

from notebookos.testing import smoke  # noqa: E402
from notebookos.testing.up_session import Notebook, UpCluster  # noqa: E402

EMPTY_SETUP = "counter = 0\nprint('CHAOS', '-', counter)\n"
EMPTY_CELL = "_before = counter\ncounter += 1\nprint('CHAOS', _before, counter)\n"


async def _whole(cluster: UpCluster, kernel_id: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(cluster.whole, kernel_id):
        if time.monotonic() > deadline:
            raise RuntimeError("the kernel did not get its three replicas back")
        await asyncio.sleep(0.1)


async def _timed_cell_without_fault(notebook: Notebook, code: str, verifier: Verifier) -> float:
    t0 = time.monotonic()
    verdict, note = verifier.record(await notebook.execute(code))
    if verdict != "intact":
        raise RuntimeError(f"a cell without a fault: {verdict} {note}")
    return time.monotonic() - t0


async def run_mode(mode: str, args: argparse.Namespace,
                   workdir: Path) -> tuple[list[float], list[float]]:
    """One cluster in ``mode``; the seconds from each kill to the next cell's reply and idle,
    and (``--nofault``) those of the same cell without a kill."""
    os.environ["NOTEBOOKOS_WARM_IMPORTS"] = "0" if mode == "cold" else "1"
    cluster = UpCluster(workdir, args.hosts)
    notebook: Notebook | None = None
    samples: list[float] = []
    floor: list[float] = []
    try:
        await asyncio.to_thread(cluster.wait_up)
        notebook = Notebook(cluster.base, cluster.token)
        await notebook.open()
        empty = mode == "empty"
        setup = EMPTY_SETUP if empty else setup_code(args.big_mib, args.torch)
        code = EMPTY_CELL if empty else cell_code(args.torch)
        verifier = Verifier()
        first = await notebook.execute(setup)
        match = CHAOS_LINE.search(first.stdout)
        if first.status != "ok" or match is None:
            raise RuntimeError(f"setup failed: {first.error} {first.stderr[-1000:]}")
        verifier.accept(first.execution_count, match.group(2))
        for _ in range(3):
            await _timed_cell_without_fault(notebook, code, verifier)
        for _ in range(args.kills):
            await _whole(cluster, notebook.kernel_id)
            await asyncio.sleep(args.settle)
            if args.nofault:
                floor.append(await _timed_cell_without_fault(notebook, code, verifier))
                print(f"  {mode}: the cell without a kill {floor[-1]:.2f} s", file=sys.stderr,
                      flush=True)
                await asyncio.sleep(args.settle)
            status = await asyncio.to_thread(cluster.kernel, notebook.kernel_id)
            assert status is not None
            executor = next(r for r in status.replicas
                            if r.replica_id == status.executor_replica_id)
            t0 = time.monotonic()
            os.kill(executor.pid, signal.SIGKILL)
            result = await notebook.execute(code)
            samples.append(time.monotonic() - t0)
            verdict, note = verifier.record(result)
            if verdict != "intact":
                raise RuntimeError(f"{mode}: the cell after the kill: {verdict} {note}")
            print(f"  {mode}: next cell {samples[-1]:.2f} s", file=sys.stderr, flush=True)
        return samples, floor
    finally:
        if notebook is not None:
            await notebook.close()
        await asyncio.to_thread(cluster.stop)


def _summary(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {"n": len(ordered), "p50_s": round(statistics.median(ordered), 3),
            "p99_s": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
            "samples_s": [round(s, 3) for s in samples]}


async def main_async(args: argparse.Namespace) -> dict:
    modes = args.modes.split(",")
    samples: dict[str, list[float]] = {mode: [] for mode in modes}
    floors: dict[str, list[float]] = {mode: [] for mode in modes}
    for block in range(args.blocks):
        for mode in modes if block % 2 == 0 else reversed(modes):
            if args.keep:
                workdir = Path(args.keep) / f"{mode}-{block}"
                workdir.mkdir(parents=True, exist_ok=True)
                after_kill, without = await run_mode(mode, args, workdir)
            else:
                with tempfile.TemporaryDirectory(prefix=f"nbos-failover-{mode}-") as tmp:
                    after_kill, without = await run_mode(mode, args, Path(tmp))
            samples[mode] += after_kill
            floors[mode] += without
    result = {mode: _summary(values) for mode, values in samples.items()}
    if args.nofault:
        result.update({f"{mode}_nofault": _summary(values) for mode, values in floors.items()})
    if "warm" in result and "cold" in result:
        result["warm_over_cold_p50"] = round(result["warm"]["p50_s"] / result["cold"]["p50_s"], 3)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=6, help="kills per mode and block")
    parser.add_argument("--blocks", type=int, default=2, help="alternating blocks of the modes")
    parser.add_argument("--settle", type=float, default=8.0,
                        help="seconds after the kernel is whole again before the next kill")
    parser.add_argument("--modes", default="warm,cold,empty")
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--big-mib", type=int, default=16)
    parser.add_argument("--no-torch", dest="torch", action="store_false")
    parser.add_argument("--nofault", action="store_true",
                        help="before each kill, time the same cell without one (the floor)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", metavar="DIR", help="run in DIR/<mode>-<block>, keep the logs")
    args = smoke.parse_args(parser, kills=1, blocks=1, settle=1.0, modes="warm", big_mib=1,
                            torch=False)
    result = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for mode in args.modes.split(","):
            row = result[mode]
            print(f"{mode:6s} n={row['n']:3d}  next cell p50 {row['p50_s']:.2f} s  "
                  f"p99 {row['p99_s']:.2f} s")
            if f"{mode}_nofault" in result:
                row = result[f"{mode}_nofault"]
                print(f"{mode:6s} without a kill: p50 {row['p50_s']:.2f} s  "
                      f"p99 {row['p99_s']:.2f} s")
        if "warm_over_cold_p50" in result:
            print(f"warm / cold p50: {result['warm_over_cold_p50']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
