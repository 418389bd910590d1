"""Trivial-cell round trip over Jupyter Server's kernel websocket.

Measures, in one run and with one client:

- ``plain_p50_ms`` / ``plain_p99_ms``: the plain ``python3`` kernel on a Jupyter Server with
  NotebookOS's websocket fix (TCP_NODELAY, installed through jupyter_server_config.d);
- ``stock_plain_p50_ms``: the same kernel on a stock server (the fix switched off);
- ``nbos_p50_ms`` / ``nbos_p99_ms``: the ``notebookos`` kernel on the fixed server, when the
  ``notebookos`` kernelspec is installed and its cluster is reachable (else ``null`` with a reason);
- ``plain_cpu_ms_per_cell`` / ``nbos_cpu_ms_per_cell``: CPU time (user + system) spent per cell
  by the plain kernel process, and by the whole NotebookOS cluster (Global Scheduler, Local
  Schedulers, three replicas): a figure that, unlike latency on a shared 2-core machine, barely
  moves with what else runs.

A round trip is from sending ``execute_request`` on the websocket to receiving both its
``execute_reply`` and the ``status: idle`` that follows. The two kernels on the fixed server run
side by side and are measured in alternating blocks of 25 cells, so both see the same machine
(on a shared VM the speed drifts within minutes). Usage:
``python benchmarks/jupyter.py [--json] [--cells N] [--starts N]``.

``--starts N`` measures kernel starts instead, as a notebook user sees them: ``N`` times each
way, alternating plain and ``notebookos`` on the fixed server, the REST ``POST /api/kernels``
(``create_s``) and from that POST to the first cell's ``execute_reply`` over a new websocket
(``start_s``); after each start the kernel is deleted and the cluster left to settle (its hosts
refill their prewarm pools, as they would between two users opening notebooks; a start that
finds the pools empty is the cold start of ``benchmarks/idle.py --starts``). Reports every
sample, the medians and the median of the per-pair ratios. ``--prewarm 0`` runs the cluster
without prewarm pools (every replica starts as when the pools are empty: forked from each host's
fork server), and ``--no-fork-server`` without fork servers (then such a start is cold: a new
interpreter per replica).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect

from notebookos.config import load_config
from notebookos.local_scheduler.prewarm import REFILL_DELAY_S
from notebookos.ports import free_ports
from notebookos.supervisor import Supervisor, marked_processes
from notebookos.testing import smoke

STOCK_CLASS = "jupyter_server.services.kernels.connection.channels.ZMQChannelsWebsocketConnection"


def free_port() -> int:
    return free_ports(1)[0]  # below the ephemeral range: no outgoing connection takes it


class Server:
    def __init__(self, stock: bool, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.token = uuid.uuid4().hex
        cmd = [sys.executable, "-m", "jupyter_server", "--no-browser", f"--port={self.port}",
               "--ip=127.0.0.1", "--allow-root", f"--IdentityProvider.token={self.token}",
               f"--ServerApp.root_dir={workdir}"]
        if stock:
            cmd.append(f"--ServerApp.kernel_websocket_connection_class={STOCK_CLASS}")
        self.log = open(workdir / f"server-{'stock' if stock else 'fixed'}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, cwd=workdir)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def wait_ready(self, timeout: float = 60) -> None:
        client = AsyncHTTPClient()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("jupyter server exited; see its log")
            try:
                await client.fetch(f"{self.base}/api/status?token={self.token}")
                return
            except Exception:  # noqa: BLE001 - not up yet
                await asyncio.sleep(0.2)
        raise RuntimeError("jupyter server did not start")

    async def kernelspecs(self) -> set[str]:
        resp = await AsyncHTTPClient().fetch(f"{self.base}/api/kernelspecs?token={self.token}")
        return set(json.loads(resp.body)["kernelspecs"])

    async def start_kernel(self, name: str) -> str:
        req = HTTPRequest(f"{self.base}/api/kernels?token={self.token}", method="POST",
                          body=json.dumps({"name": name}), request_timeout=120)
        resp = await AsyncHTTPClient().fetch(req)
        return json.loads(resp.body)["id"]

    async def delete_kernel(self, kernel_id: str) -> None:
        req = HTTPRequest(f"{self.base}/api/kernels/{kernel_id}?token={self.token}",
                          method="DELETE", request_timeout=60)
        await AsyncHTTPClient().fetch(req, raise_error=False)

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far (those that exist)."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


async def wait_quiet(pids: Callable[[], list[int]], timeout: float = 90,
                     busy_ms_per_s: float = 50) -> None:
    """Until the kernel side has settled: after a kernel starts, its hosts refill their prewarm
    pools (a new interpreter doing its heavy imports per host), which would otherwise land in
    the first measured cells. Two quiet half-second windows in a row, or the timeout."""
    quiet = 0
    deadline = time.monotonic() + timeout
    while quiet < 2 and time.monotonic() < deadline:
        watched = pids()
        before = cpu_seconds(watched)
        await asyncio.sleep(0.5)
        busy = (cpu_seconds(watched) - before) * 1000 / 0.5
        quiet = quiet + 1 if busy < busy_ms_per_s else 0


class KernelUnderTest:
    """One kernel on a server, its websocket, and the processes whose CPU counts as its own."""

    def __init__(self, server: Server, kernel_name: str,
                 kernel_pids: Callable[[], list[int]] | None = None) -> None:
        self.server = server
        self.kernel_name = kernel_name
        self._pids = kernel_pids
        self.kernel_id = ""
        self.session = uuid.uuid4().hex
        self.ws = None
        self.times: list[float] = []
        self.cpu_s = 0.0

    def pids(self) -> list[int]:
        if self._pids is not None:
            return self._pids()
        return [c.pid for c in psutil.Process(self.server.proc.pid).children(recursive=True)]

    async def open(self) -> None:
        self.kernel_id = await self.server.start_kernel(self.kernel_name)
        await wait_quiet(self.pids)
        self.ws = await websocket_connect(
            f"ws://127.0.0.1:{self.server.port}/api/kernels/{self.kernel_id}/channels"
            f"?session_id={self.session}&token={self.server.token}"
        )

    async def timed_start(self) -> tuple[float, float]:
        """Start the kernel and run its first cell: (REST create s, create to reply s)."""
        start = time.perf_counter()
        self.kernel_id = await self.server.start_kernel(self.kernel_name)
        created = time.perf_counter() - start
        self.ws = await websocket_connect(
            f"ws://127.0.0.1:{self.server.port}/api/kernels/{self.kernel_id}/channels"
            f"?session_id={self.session}&token={self.server.token}"
        )
        await self.cell(wait_idle=False, timeout=120)
        return created, time.perf_counter() - start

    async def cell(self, wait_idle: bool = True, timeout: float = 60) -> float:
        """One trivial cell's round trip in ms."""
        msg_id = uuid.uuid4().hex
        msg = {
            "header": {"msg_id": msg_id, "username": "bench", "session": self.session,
                       "msg_type": "execute_request", "version": "5.3",
                       "date": "2026-01-01T00:00:00Z"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": "1+1", "silent": False, "store_history": True,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
        }
        start = time.perf_counter()
        await self.ws.write_message(json.dumps(msg))
        got_reply, got_idle = False, not wait_idle
        while not (got_reply and got_idle):
            raw = await asyncio.wait_for(self.ws.read_message(), timeout=timeout)
            if raw is None:
                raise RuntimeError("websocket closed")
            reply = json.loads(raw)
            if reply.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = reply["header"]["msg_type"]
            if kind == "execute_reply":
                got_reply = True
            elif kind == "status" and reply["content"]["execution_state"] == "idle":
                got_idle = True
        return (time.perf_counter() - start) * 1000

    async def block(self, cells: int, record: bool = True) -> None:
        """``cells`` cells in a row; their round trips and CPU are added when ``record``."""
        pids = self.pids()
        cpu_before = cpu_seconds(pids)
        times = [await self.cell() for _ in range(cells)]
        if record:
            self.times.extend(times)
            self.cpu_s += cpu_seconds(pids) - cpu_before

    def cpu_ms_per_cell(self) -> float:
        return self.cpu_s * 1000 / max(1, len(self.times))

    async def close(self) -> None:
        if self.ws is not None:
            self.ws.close()
        if self.kernel_id:
            await self.server.delete_kernel(self.kernel_id)


async def measure_interleaved(kernels: list[KernelUnderTest], cells: int, block: int = 25,
                              warmup: int = 10) -> None:
    """``cells`` cells per kernel, in alternating blocks of ``block``: each kernel sees the same
    machine (a shared VM's speed drifts within minutes, which a back-to-back comparison would
    book as one kernel's cost)."""
    for k in kernels:
        await k.block(warmup, record=False)
    done = 0
    while done < cells:
        n = min(block, cells - done)
        for k in kernels:
            await k.block(n)
        done += n


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def start_cluster(workdir: Path, prewarm: int = 1,
                  fork_server: bool = True) -> tuple[Supervisor, dict[str, str]]:
    """A Global Scheduler and three Local Schedulers (as `notebookos up` starts them)."""
    from notebookos.commands.up_cmd import start_schedulers
    from notebookos.provisioner.kernelspecs import install_kernelspecs

    install_kernelspecs(prefix=sys.prefix)
    config = load_config(env={}, overrides={
        "cluster.state_dir": str(workdir / "cluster"),
        "global_scheduler.grpc_port": free_port(),
        "local_scheduler.virtual_gpus": 2,
    })
    supervisor = Supervisor(workdir / "cluster" / "logs")
    env = start_schedulers(config, 3, supervisor, threading.Event(), extra_env={
        "NOTEBOOKOS_LOCAL_SCHEDULER_PREWARM_POOL_SIZE": str(prewarm),
        "NOTEBOOKOS_LOCAL_SCHEDULER_FORK_SERVER": "true" if fork_server else "false"})
    assert env is not None
    return supervisor, env


async def run(cells: int, starts: int = 0, prewarm: int = 1, fork_server: bool = True) -> dict:
    result: dict = {"cells": cells}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        supervisor, env = start_cluster(workdir, prewarm, fork_server)
        try:
            if starts:
                out = await measure_starts(workdir, env, starts,
                                           lambda: marked_processes(supervisor.marker))
                return {**out, "prewarm_pool_size": prewarm, "fork_server": fork_server}
            await measure_servers(workdir, env, cells, result,
                                  lambda: marked_processes(supervisor.marker))
        finally:
            supervisor.stop()
    if result.get("stock_plain_p50_ms") and result.get("plain_p50_ms"):
        result["fix_speedup"] = round(result["stock_plain_p50_ms"] / result["plain_p50_ms"], 2)
    if result.get("nbos_p50_ms") and result.get("plain_p50_ms"):
        result["nbos_vs_plain"] = round(result["nbos_p50_ms"] / result["plain_p50_ms"], 2)
    return result


async def measure_starts(workdir: Path, env: dict[str, str], count: int,
                         cluster_pids: Callable[[], list[int]]) -> dict:
    """``count`` starts each way, alternating which goes first (see the module's docstring)."""
    server = Server(False, workdir, env)
    samples: dict[str, dict[str, list[float]]] = {
        name: {"create_s": [], "start_s": []} for name in ("python3", "notebookos")}
    try:
        await server.wait_ready()
        if "notebookos" not in await server.kernelspecs():
            return {"starts_skipped": "the notebookos kernelspec is not installed"}
        await wait_quiet(cluster_pids)
        for i in range(count):
            order = ("python3", "notebookos") if i % 2 == 0 else ("notebookos", "python3")
            for name in order:
                kernel = KernelUnderTest(server, name)
                try:
                    created, started = await kernel.timed_start()
                finally:
                    await kernel.close()
                samples[name]["create_s"].append(round(created, 3))
                samples[name]["start_s"].append(round(started, 3))
                # hosts refill their pools refill_delay_s (2 s) after a take, then go quiet
                await asyncio.sleep(REFILL_DELAY_S + 0.5)
                await wait_quiet(cluster_pids)
    finally:
        server.stop()
    result: dict = {"starts": count, "start_samples": samples}
    for name, key in (("python3", "plain"), ("notebookos", "nbos")):
        for what in ("create_s", "start_s"):
            result[f"{key}_{what}_p50"] = round(statistics.median(samples[name][what]), 3)
    for what in ("create_s", "start_s"):
        ratios = [n / p for n, p in zip(samples["notebookos"][what], samples["python3"][what],
                                        strict=True)]
        result[f"{what.removesuffix('_s')}_ratio_p50"] = round(statistics.median(ratios), 2)
    return result


async def measure_servers(workdir: Path, env: dict[str, str], cells: int, result: dict,
                          cluster_pids: Callable[[], list[int]]) -> None:
    """The fixed server with both kernels, interleaved; then the stock server's plain kernel."""
    server = Server(False, workdir, env)
    kernels: list[KernelUnderTest] = []  # measured
    opened: list[KernelUnderTest] = []  # to delete at the end
    try:
        await server.wait_ready()
        plain = KernelUnderTest(server, "python3")
        kernels.append(plain)
        opened.append(plain)
        nbos: KernelUnderTest | None = None
        if "notebookos" not in await server.kernelspecs():
            result["nbos_skipped"] = "the notebookos kernelspec is not installed"
        else:
            nbos = KernelUnderTest(server, "notebookos", kernel_pids=cluster_pids)
            opened.append(nbos)
            try:
                await nbos.open()
                kernels.append(nbos)
            except Exception as exc:  # noqa: BLE001 - report why, keep the baseline
                result["nbos_skipped"] = f"notebookos kernel did not start: {exc}"
                nbos = None
        await plain.open()
        try:
            await measure_interleaved(kernels, cells)
        except Exception as exc:  # noqa: BLE001
            if nbos is None:
                raise
            result["nbos_skipped"] = f"notebookos kernel did not run: {exc}"
            kernels.remove(nbos)
            plain.times.clear()  # measured again alone, not beside a failing kernel
            plain.cpu_s = 0.0
            await measure_interleaved(kernels, cells)
            nbos = None
        result["plain_p50_ms"] = pct(plain.times, 0.5)
        result["plain_p99_ms"] = pct(plain.times, 0.99)
        result["plain_cpu_ms_per_cell"] = round(plain.cpu_ms_per_cell(), 2)
        if nbos is None:
            result["nbos_p50_ms"] = result["nbos_p99_ms"] = None
        else:
            result["nbos_p50_ms"] = pct(nbos.times, 0.5)
            result["nbos_p99_ms"] = pct(nbos.times, 0.99)
            result["nbos_cpu_ms_per_cell"] = round(nbos.cpu_ms_per_cell(), 2)
    finally:
        for k in opened:
            await k.close()
        server.stop()
    stock = Server(True, workdir, env)
    try:
        await stock.wait_ready()
        plain = KernelUnderTest(stock, "python3")
        try:
            await plain.open()
            await measure_interleaved([plain], cells)
        finally:
            await plain.close()
        result["stock_plain_p50_ms"] = pct(plain.times, 0.5)
        result["stock_plain_p99_ms"] = pct(plain.times, 0.99)
    finally:
        stock.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--starts", type=int, default=0,
                        help="measure N kernel starts each way instead of cells")
    parser.add_argument("--prewarm", type=int, default=1,
                        help="prewarmed replicas per host (0: every start as with empty pools)")
    parser.add_argument("--no-fork-server", action="store_true",
                        help="no fork servers: a start that finds the pool empty is cold")
    args = smoke.parse_args(parser, cells=10, starts=0)
    result = asyncio.run(run(args.cells, args.starts, args.prewarm, not args.no_fork_server))
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>22}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
