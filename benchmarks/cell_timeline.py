"""When each message of a trivial cell reaches a client on the kernel's own ZMQ ports.

For the plain ``python3`` kernel and the ``notebookos`` kernel (a Global Scheduler and three
Local Schedulers started as ``notebookos up`` starts them, virtual GPUs), a jupyter_client
client sends ``1+1`` and records, per cell, how long after sending it received ``busy``,
``execute_input``, ``execute_result``, ``execute_reply`` and ``idle``; the p50 of each is
printed. No Jupyter Server in between: this splits the kernel's own round trip (see
docs/performance.md, "Jupyter integration"). Usage:
``python benchmarks/cell_timeline.py [--json] [--cells N] [--kernel python3|notebookos]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import zmq
from jupyter_client.manager import KernelManager

sys.path.insert(0, str(Path(__file__).resolve().parent))
from jupyter import start_cluster, wait_quiet  # noqa: E402 - the sibling benchmark's helpers

from notebookos.supervisor import marked_processes  # noqa: E402
from notebookos.testing import smoke  # noqa: E402

STAGES = ("busy", "execute_input", "execute_result", "execute_reply", "idle")


def timeline(kernel_name: str, cells: int, warmup: int = 20,
             quiet_pids=None) -> dict[str, float]:  # noqa: ANN001
    km = KernelManager(kernel_name=kernel_name)
    km.start_kernel()
    try:
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(120)
        if quiet_pids is not None:
            asyncio.run(wait_quiet(quiet_pids))
        poller = zmq.Poller()
        poller.register(kc.iopub_channel.socket, zmq.POLLIN)
        poller.register(kc.shell_channel.socket, zmq.POLLIN)
        rows: list[dict[str, float]] = []
        for i in range(warmup + cells):
            start = time.perf_counter()
            msg_id = kc.execute("1+1")
            seen: dict[str, float] = {}
            while "execute_reply" not in seen or "idle" not in seen:
                if not poller.poll(60_000):
                    raise RuntimeError(f"{kernel_name}: no answer to a cell within 60 s")
                while kc.iopub_channel.msg_ready():
                    msg = kc.get_iopub_msg(timeout=5)
                    if msg["parent_header"].get("msg_id") != msg_id:
                        continue
                    kind = msg["msg_type"]
                    if kind == "status":
                        kind = msg["content"]["execution_state"]
                    seen.setdefault(kind, (time.perf_counter() - start) * 1000)
                while kc.shell_channel.msg_ready():
                    msg = kc.get_shell_msg(timeout=5)
                    if msg["parent_header"].get("msg_id") == msg_id:
                        seen["execute_reply"] = (time.perf_counter() - start) * 1000
            if i >= warmup:
                rows.append(seen)
        kc.stop_channels()
        return {f"{stage}_p50_ms": round(statistics.median(r[stage] for r in rows if stage in r),
                                         3) for stage in STAGES}
    finally:
        km.shutdown_kernel(now=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--cells", type=int, default=300)
    parser.add_argument("--kernel", choices=("python3", "notebookos"), action="append")
    args = smoke.parse_args(parser, cells=10)
    result: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        supervisor, env = start_cluster(Path(tmp))
        saved = dict(os.environ)
        os.environ.update({k: v for k, v in env.items() if k.startswith("NOTEBOOKOS_")})
        try:
            for name in args.kernel or ["python3", "notebookos"]:
                result[name] = timeline(name, args.cells,
                                        quiet_pids=lambda: marked_processes(supervisor.marker))
        finally:
            os.environ.clear()
            os.environ.update(saved)
            supervisor.stop()
    if args.json:
        print(json.dumps(result))
    else:
        for name, stages in result.items():
            print(f"{name:>11}: " + "  ".join(f"{k.removesuffix('_p50_ms')} {v:.2f}"
                                              for k, v in stages.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
