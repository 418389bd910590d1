"""What an idle kernel costs: NotebookOS (three replicas) against a plain ipykernel, same run.

    python benchmarks/idle.py [--json] [--kernels 1,8] [--window 20] [--settle 5]

For each count N in --kernels: N plain ipykernels and N NotebookOS replica groups (three replica
processes each, on loopback, started like benchmarks/kernel.py does) are started, each runs one
small cell, then all sit idle. After --settle seconds, the CPU time (user + system, every process
of the kernel and its children, summed over their threads' ``schedstat`` in ns) is read over
--window seconds, and the resident memory (RSS).
Figures are per kernel (a NotebookOS kernel = its three replicas together):

- ``plain_idle_cpu_ms_per_s`` / ``nbos_idle_cpu_ms_per_s`` and their ratio;
- ``plain_rss_mb`` / ``nbos_rss_mb`` (MB = 10^6 bytes) and their ratio; ``plain_pss_mb`` /
  ``nbos_pss_mb`` and ``pss_ratio``: the proportional set size (a page shared by k processes
  counts 1/k in each: the three replicas share their libraries' pages, which RSS counts three
  times, as it counts a plain kernel's pages shared with this benchmark's own interpreter);
  ``plain_uss_mb`` / ``nbos_uss_mb`` and ``uss_ratio``: the unique set size (pages no other
  process maps: what the kernel's end would give back);
- ``plain_start_s`` / ``nbos_start_s``: launching the processes until the first cell's reply
  (the first kernel of the run, measured before the others start);
- ``plain_cell_after_idle_ms`` / ``nbos_cell_after_idle_ms``: a trivial cell sent after the idle
  window (the group has rested: does waking it cost?), median over the kernels;
- ``nbos_awake_idle_cpu_ms_per_s`` (``--awake``): N more groups with Raft resting switched off
  (``NOTEBOOKOS_RAFT_REST=0``), idle in the same window: the cost before resting, same run
  (and ``nbos_awake_cell_after_idle_ms``, their next cell);
- ``failover_after_idle_s``: SIGKILL the executor of an idle group, then the next cell on a
  survivor: kill -> that cell's ``execute_input``.

``--starts N`` (issue 18) also times N kernel starts each way, alternating plain and NotebookOS,
one kernel at a time, nothing else of the run alive: launch until the first cell's reply.
Reported under ``starts``: every sample, the medians and the median ratio (one start is noisy on
a shared machine: a single ``plain_start_s`` above ranged 0.3-1.4 s on the 2-core VM).

``--no-hb``: no client pings a kernel's heartbeat socket (the harness clients ping every replica
once a second otherwise, as jupyter_client's do; in a cluster nothing pings a replica's: the
Global Scheduler's front answers the Jupyter client's heartbeat itself, ``front.py``). The plain
kernel is then not pinged either.

``--cell CODE``: the first cell, run by each plain kernel and each group before the idle window
(default ``x = 1``). ``--cell "x = [bytes(600) for _ in range(40000)]; keep = [bytes(600) for _ in
range(10)]; del x"`` frees 25 MB that later objects pin between pages still in use: what an idle
kernel keeps of a cell's freed memory.

``--fork-server``: the replicas are forked from a fork server, as the Local Scheduler's process
launcher starts them (``local_scheduler/fork_server.py``: the pool's replicas and those started
when it is empty), instead of started as three new interpreters. Their pages inherited from the
server stay shared copy-on-write until written, which PSS and USS see and RSS does not. The
server serves every kernel of its host and is not counted in a notebook's figures; its own RSS /
PSS are reported (``fork_server_rss_mb``, ``fork_server_pss_mb``).

The Global and Local Schedulers are not counted (they serve every kernel of a cluster).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "kernel"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import ReplicaGroup, kill_group  # noqa: E402
from jupyter_client import BlockingKernelClient  # noqa: E402
from jupyter_client.connect import write_connection_file  # noqa: E402

from kernel import failover, wait_idle, wait_reply  # noqa: E402
from notebookos.local_scheduler.fork_server import ForkServer  # noqa: E402
from notebookos.ports import free_ports  # noqa: E402
from notebookos.testing import smoke  # noqa: E402

KERNEL_MODULE = "notebookos.kernel"


class PlainKernel:
    def __init__(self, cf: Path, heartbeat: bool = True) -> None:
        # ports claimed machine-wide (a port merely free now may be taken before ipykernel binds)
        shell, iopub, stdin, hb, control = free_ports(5)
        write_connection_file(str(cf), ip="127.0.0.1", key=b"plain-key", shell_port=shell,
                              iopub_port=iopub, stdin_port=stdin, hb_port=hb,
                              control_port=control)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ipykernel_launcher", "-f", str(cf),
             "--HistoryManager.enabled=False"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        self.client = BlockingKernelClient(connection_file=str(cf))
        self.client.load_connection_file()
        self.client.start_channels(hb=heartbeat)
        deadline = time.monotonic() + 60
        # Ready once a kernel_info is answered and its idle seen on IOPub. Asked again every
        # 0.1 s: an idle published before the SUB socket joined is never seen, and waiting a
        # whole second for it made a third of the plain starts a second longer than they were.
        while True:
            try:
                msg_id = self.client.kernel_info()
                wait_reply(self.client.get_shell_msg, msg_id, 0.1)
                wait_idle(self.client, msg_id, 0.1)
                return
            except (TimeoutError, queue.Empty):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the plain ipykernel did not start") from None

    def execute(self, code: str) -> None:
        msg_id = self.client.execute(code)
        wait_reply(self.client.get_shell_msg, msg_id)
        wait_idle(self.client, msg_id)

    def pids(self) -> list[int]:
        return [self.proc.pid]

    def stop(self) -> None:
        self.client.stop_channels()
        kill_group(self.proc)


class ForkedGroup(ReplicaGroup):
    """A replica group whose replicas the fork server forks (``--fork-server``)."""

    def __init__(self, *args: Any, fork_server: ForkServer, **kwargs: Any) -> None:
        self.fork_server = fork_server
        super().__init__(*args, **kwargs)

    def _launch(self, replica, peers, *flags) -> None:  # noqa: ANN001 - the harness's
        argv = self.command(replica, peers, *flags)
        assert argv[1:3] == ["-m", KERNEL_MODULE], argv
        replica.proc = self.fork_server.fork(argv[3:], {"PYTHONUNBUFFERED": "1"},
                                             replica.log_path)


def new_group(workdir: Path, fork_server: ForkServer | None, **kwargs: Any) -> ReplicaGroup:
    if fork_server is None:
        return ReplicaGroup(workdir, **kwargs)
    return ForkedGroup(workdir, fork_server=fork_server, **kwargs)


def group_pids(group: ReplicaGroup) -> list[int]:
    return [r.proc.pid for r in group.replicas.values() if r.alive]


def _tree(pids: list[int]) -> list[psutil.Process]:
    procs = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs.append(p)
            procs.extend(p.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    return procs


def _task_cpu_ns(pid: int) -> int | None:
    """CPU time of a process's live threads in ns (``/proc/<pid>/task/*/schedstat``): the
    10 ms ticks of ``cpu_times`` are 0.5 ms/s over a 20 s window, too coarse for an idle kernel."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total


def pss_bytes(pids: list[int], field: str = "pss") -> int:
    total = 0
    for p in _tree(pids):
        try:
            total += getattr(p.memory_full_info(), field)
        except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
            pass
    return total


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for p in _tree(pids):
        ns = _task_cpu_ns(p.pid)
        if ns is not None:
            total += ns / 1e9
            continue
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for p in _tree(pids):
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def awake_group(workdir: Path) -> ReplicaGroup:
    """A group with resting switched off (NOTEBOOKOS_RAFT_REST=0): the before, in the same run."""
    group = ReplicaGroup(workdir, store_url=f"file://{workdir}/store")
    os.environ["NOTEBOOKOS_RAFT_REST"] = "0"
    try:
        group.start()
    finally:
        del os.environ["NOTEBOOKOS_RAFT_REST"]
    group.execute("x = 1", target=1)
    return group


def measure(workdir: Path, count: int, window: float, settle: float,
            failover_too: bool, awake: bool, heartbeat: bool = True,
            fork_server: ForkServer | None = None, cell: str = "x = 1") -> dict[str, Any]:
    plains: list[PlainKernel] = []
    groups: list[ReplicaGroup] = []
    awakes: list[ReplicaGroup] = []
    out: dict[str, Any] = {}
    try:
        for i in range(count):
            t0 = time.perf_counter()
            plain = PlainKernel(workdir / f"plain-{count}-{i}.json", heartbeat)
            plains.append(plain)
            plain.execute(cell)
            if i == 0:
                out["plain_start_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            group = new_group(workdir / f"group-{count}-{i}", fork_server,
                              store_url=f"file://{workdir}/store-{count}-{i}",
                              heartbeat=heartbeat)
            groups.append(group)
            group.start()
            group.execute(cell, target=1)
            if i == 0:
                out["nbos_start_s"] = time.perf_counter() - t0
            if awake:
                awakes.append(awake_group(workdir / f"awake-{count}-{i}"))
        group_pid_lists = [group_pids(g) for g in groups]
        awake_pid_lists = [group_pids(g) for g in awakes]
        plain_pid_lists = [p.pids() for p in plains]
        time.sleep(settle)
        plain_cpu0 = [cpu_seconds(p) for p in plain_pid_lists]
        nbos_cpu0 = [cpu_seconds(p) for p in group_pid_lists]
        awake_cpu0 = [cpu_seconds(p) for p in awake_pid_lists]
        t0 = time.monotonic()
        time.sleep(window)
        elapsed = time.monotonic() - t0
        plain_cpu = [(cpu_seconds(p) - c) / elapsed * 1e3
                     for p, c in zip(plain_pid_lists, plain_cpu0, strict=True)]
        nbos_cpu = [(cpu_seconds(p) - c) / elapsed * 1e3
                    for p, c in zip(group_pid_lists, nbos_cpu0, strict=True)]
        awake_cpu = [(cpu_seconds(p) - c) / elapsed * 1e3
                     for p, c in zip(awake_pid_lists, awake_cpu0, strict=True)]
        if awake:
            out["nbos_awake_idle_cpu_ms_per_s"] = sum(awake_cpu) / count
        plain_rss = [rss_bytes(p) / 1e6 for p in plain_pid_lists]
        nbos_rss = [rss_bytes(p) / 1e6 for p in group_pid_lists]
        plain_pss = [pss_bytes(p) / 1e6 for p in plain_pid_lists]
        nbos_pss = [pss_bytes(p) / 1e6 for p in group_pid_lists]
        plain_uss = [pss_bytes(p, "uss") / 1e6 for p in plain_pid_lists]
        nbos_uss = [pss_bytes(p, "uss") / 1e6 for p in group_pid_lists]
        if fork_server is not None and fork_server._process is not None:
            server = [fork_server._process.pid]  # not _tree: its children are the replicas
            out["fork_server_rss_mb"] = psutil.Process(server[0]).memory_info().rss / 1e6
            out["fork_server_pss_mb"] = psutil.Process(server[0]).memory_full_info().pss / 1e6
        plain_after, nbos_after = [], []
        for plain, group in zip(plains, groups, strict=True):
            t0 = time.perf_counter()
            plain.execute("y = 2")
            plain_after.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            msg_id = group.send_execute("y = 2", target=1)
            wait_reply(group.replicas[1].client.get_shell_msg, msg_id)
            wait_idle(group.replicas[1].client, msg_id)
            nbos_after.append(time.perf_counter() - t0)
            group.collect(msg_id, [2, 3], target=None)
        awake_after = []
        for group in awakes:
            t0 = time.perf_counter()
            msg_id = group.send_execute("y = 2", target=1)
            wait_reply(group.replicas[1].client.get_shell_msg, msg_id)
            wait_idle(group.replicas[1].client, msg_id)
            awake_after.append(time.perf_counter() - t0)
            group.collect(msg_id, [2, 3], target=None)
        if awakes:
            out["nbos_awake_cell_after_idle_ms"] = median(awake_after) * 1e3
        out.update({
            "plain_idle_cpu_ms_per_s": sum(plain_cpu) / count,
            "nbos_idle_cpu_ms_per_s": sum(nbos_cpu) / count,
            "nbos_idle_cpu_max_ms_per_s": max(nbos_cpu),
            "plain_rss_mb": sum(plain_rss) / count,
            "nbos_rss_mb": sum(nbos_rss) / count,
            "plain_pss_mb": sum(plain_pss) / count,
            "nbos_pss_mb": sum(nbos_pss) / count,
            "plain_uss_mb": sum(plain_uss) / count,
            "nbos_uss_mb": sum(nbos_uss) / count,
            "plain_cell_after_idle_ms": median(plain_after) * 1e3,
            "nbos_cell_after_idle_ms": median(nbos_after) * 1e3,
        })
        out["cpu_ratio"] = out["nbos_idle_cpu_ms_per_s"] / max(out["plain_idle_cpu_ms_per_s"], 1e-3)
        out["rss_ratio"] = out["nbos_rss_mb"] / out["plain_rss_mb"]
        out["pss_ratio"] = out["nbos_pss_mb"] / max(out["plain_pss_mb"], 1e-3)
        out["uss_ratio"] = out["nbos_uss_mb"] / max(out["plain_uss_mb"], 1e-3)
        out["start_ratio"] = out["nbos_start_s"] / out["plain_start_s"]
        if failover_too:
            time.sleep(settle)  # let the group rest again
            out["failover_after_idle_s"] = failover(groups[0])
    finally:
        for plain in plains:
            plain.stop()
        for group in groups + awakes:
            group.stop()
    return out


def measure_starts(workdir: Path, count: int) -> dict[str, Any]:
    plain, nbos = [], []
    for i in range(count):
        t0 = time.perf_counter()
        kernel = PlainKernel(workdir / f"start-plain-{i}.json")
        try:
            kernel.execute("x = 1")
            plain.append(time.perf_counter() - t0)
        finally:
            kernel.stop()
        group = ReplicaGroup(workdir / f"start-group-{i}", store_url=f"file://{workdir}/ss-{i}")
        t0 = time.perf_counter()
        try:
            group.start()
            group.execute("x = 1", target=1)
            nbos.append(time.perf_counter() - t0)
        finally:
            group.stop()
    return {
        "plain_start_s": [round(v, 3) for v in plain],
        "nbos_start_s": [round(v, 3) for v in nbos],
        "plain_start_median_s": round(median(plain), 3),
        "nbos_start_median_s": round(median(nbos), 3),
        "start_ratio_median": round(median([n / p for n, p in zip(nbos, plain, strict=True)]), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--kernels", default="1", help="comma-separated kernel counts")
    parser.add_argument("--window", type=float, default=20.0, help="seconds of idle measured")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds idle before")
    parser.add_argument("--awake", action="store_true",
                        help="also N groups with resting switched off, measured alongside")
    parser.add_argument("--starts", type=int, default=0,
                        help="also time N starts each way, alternating (see the docstring)")
    parser.add_argument("--no-hb", action="store_true",
                        help="no client pings a kernel's heartbeat socket (see the docstring)")
    parser.add_argument("--cell", default="x = 1",
                        help="the first cell, before the idle window (see the docstring)")
    parser.add_argument("--fork-server", action="store_true",
                        help="replicas forked from a fork server, as the Local Scheduler's are")
    args = smoke.parse_args(parser, kernels="1", window=2.0, settle=1.0, awake=False, starts=0)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    # NotebookOS compiled as the plain kernel's ipykernel is (as `make compile` and a wheel's
    # install do): else, where PYTHONDONTWRITEBYTECODE is set, every replica compiles it again
    for folder in ("notebookos", "kernel", "provisioner", "global_scheduler", "local_scheduler"):
        compileall.compile_dir(ROOT / folder, quiet=1)
    results: dict[str, Any] = {"cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="nbos-idle-") as tmp:
        if args.starts:
            results["starts"] = measure_starts(Path(tmp), args.starts)
        server = None
        if args.fork_server:
            server = ForkServer(sys.executable, KERNEL_MODULE, Path(tmp) / "fork-server.log")
            server.start()
        try:
            for count in (int(c) for c in args.kernels.split(",")):
                row = measure(Path(tmp), count, args.window, args.settle, failover_too=True,
                              awake=args.awake, heartbeat=not args.no_hb, fork_server=server,
                              cell=args.cell)
                results[str(count)] = {k: round(v, 4) if isinstance(v, float) else v
                                       for k, v in row.items()}
        finally:
            if server is not None:
                server.close()
    if args.json:
        print(json.dumps(results))
    else:
        for key, value in results.items():
            if isinstance(value, dict):
                print(f"{key}:" if key == "starts" else f"{key} kernel(s):")
                for k, v in value.items():
                    print(f"  {k:>28}: {v}")
            else:
                print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
