"""What open kernels cost the Global Scheduler's fronts, up to thousands of kernels (issue 32).

    python benchmarks/gs_scale.py [--json] [--kernels 10,100,1000] [--window 10] [--cells 300]

The real fronts (global_scheduler/front.py, on the process's one front loop) in this process,
each connected to three stand-in replicas (notebookos/testing/standin_replicas.py: many kernels'
replicas in one other process, speaking the replica's side of the protocol). For each count N:

- ``threads``: this process's threads with N open fronts, and ``threads_before`` with none
  (the fronts' loop and the placement pool are the only threads fronts add);
- ``idle_cpu_ms_per_s`` (the process, N idle fronts, over --window s) and its value per kernel;
- every front runs one cell as it opens (in batches of ``WARM_BATCH``), then rests ``REST_S``:
  its standbys' links rest, as an idle notebook's do after ``idle_links_close_s`` in the daemon;
- ``rss_per_kernel_kb``: resident memory added per open front (its 7 ZMQ sockets while idle,
  its maps);
- ``cell_ms`` p50/p99: a trivial cell through kernel 0's front (client -> front -> stand-in
  executor -> front -> client), against ``direct_ms``, the same request sent straight to the
  stand-in (alternating, same run); ``overhead_ms`` = their difference at p50 and p99;
- ``loaded_cell_ms``: the same while --rate cells/s flow through 200 other fronts (round robin);
  the timed clients and the load run in a process of their own (as Jupyter Server's clients
  do), not beside the fronts;
- ``sweep``: the same loaded cells at each of --sweep rates (cells/s through the 200 other
  fronts), and ``sustained_cells_per_s``: the highest rate reached (at least 90% of the one asked)
  with kernel 0's p99 under 10 ms, the fronts' capacity across kernels;
- ``kernel_info_ms`` p50/p99 through the front;
- ``open_s``: the time to open the N fronts (bind, connect, watch), and ``front_opens_per_s``.

The Global Scheduler's gRPC side and its placement decision are not in this figure (placement
is a stub that answers replica 1); benchmarks/routing.py and placement.py measure those.

``--real 1,10,20``: the whole Global Scheduler daemon with three Local Schedulers and real
replicas (as benchmarks/routing.py starts them), N 0-GPU kernels each run one cell and then sit
idle, each with a client connected as Jupyter Server's websocket connects (shell, IOPub,
stdin, control; no heartbeat channel); the Global Scheduler's process is read from /proc over
--window s: ``gs_threads``,
``gs_idle_cpu_ms_per_s``, ``gs_rss_mb``, ``cell_ms`` (a trivial cell through its front, p50), and
``kernel_start_s`` (StartKernel to the first cell's reply, one kernel at a time: median, max);
``gs_threads_no_kernels`` (hosts registered, before any kernel) and ``gs_threads_starting_max``
(the most, sampled every 20 ms while the N kernels start); then the status queries while cells
flow (``_status_polls``): ``status_ms`` (GetKernelStatus, 4 pollers), ``cluster_status_ms``
(GetClusterStatus) p50/p99, and ``gs_threads_after_polls``; ``loop_lock_waits``: over the whole
run, how often and how long the scheduler's loop stood still on its state lock while a pool
thread held it (what is left of issue 32's shared lock).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import zmq
from jupyter_client.session import Session

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from notebookos.global_scheduler.front import KernelFront, ReplicaEndpoint  # noqa: E402
from notebookos.global_scheduler.limits import (  # noqa: E402
    FDS_PER_IDLE_KERNEL,
    FDS_PER_RESTING_KERNEL,
    raise_limits,
)
from notebookos.testing import smoke  # noqa: E402
from notebookos.testing.standin_replicas import PlaceOnReplicaOne, kernel_id  # noqa: E402


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rss_kb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3) if ordered else 0.0


class Client:
    """A Jupyter client's shell + IOPub on one front (or shell alone, straight to a replica)."""

    def __init__(self, context: zmq.Context, key: str, shell_port: int,
                 iopub_port: int | None = None) -> None:
        self.session = Session(key=key.encode())
        self.shell = context.socket(zmq.DEALER)
        self.shell.linger = 0
        self.shell.connect(f"tcp://127.0.0.1:{shell_port}")
        self.iopub = None
        if iopub_port is not None:
            self.iopub = context.socket(zmq.SUB)
            self.iopub.linger = 0
            self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
            self.iopub.connect(f"tcp://127.0.0.1:{iopub_port}")

    def request(self, msg_type: str, content: dict, timeout_s: float = 10.0) -> float:
        """Send; wait for the reply; seconds taken."""
        msg = self.session.msg(msg_type, content)
        started = time.perf_counter()
        self.session.send(self.shell, msg)
        if not self.shell.poll(timeout_s * 1000):
            raise TimeoutError(f"no {msg_type} reply within {timeout_s} s")
        self.shell.recv_multipart()
        taken = time.perf_counter() - started
        self.drain()
        return taken

    def send(self, msg_type: str, content: dict) -> None:
        self.session.send(self.shell, msg_type, content)

    def drain(self) -> None:
        for sock in (self.shell, self.iopub):
            while sock is not None and sock.poll(0):
                sock.recv_multipart()

    def close(self) -> None:
        for sock in (self.shell, self.iopub):
            if sock is not None:
                sock.close(linger=0)


SUSTAINED_P99_MS = 10.0  # issue 32: the rate the fronts sustain with p99 under this


def measure(count: int, window: float, cells: int, rate: float,
            sweep: list[float], keep_links: bool = False) -> dict[str, Any]:
    key = uuid.uuid4().hex
    standin = subprocess.Popen(
        [sys.executable, "-m", "notebookos.testing.standin_replicas", "--kernels", str(count),
         "--key", key], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    fronts: list[KernelFront] = []
    clients: list[Client] = []
    context = zmq.Context.instance()
    try:
        assert standin.stdout is not None
        ports = json.loads(standin.stdout.readline())
        threads_before, rss_before = _threads(), _rss_kb()
        hooks = PlaceOnReplicaOne()
        open_s = 0.0
        for first in range(0, count, WARM_BATCH):
            opened = time.perf_counter()
            batch = []
            for k in range(first, min(count, first + WARM_BATCH)):
                front = KernelFront(kernel_id(k), key, "hmac-sha256", hooks)
                front.lazy_link_idle_s = REST_S
                front.rest_standby_links = not keep_links
                front.set_replicas([
                    ReplicaEndpoint(int(r), "127.0.0.1", p["shell"], p["iopub"][k],
                                    p["stdin"], p["control"]) for r, p in ports.items()])
                front.start()
                batch.append(front)
            open_s += time.perf_counter() - opened
            fronts += batch
            # every kernel runs a cell, as a notebook does when it opens; then, idle for
            # REST_S, its standbys' links rest (front_replicas.py), as after
            # global_scheduler.idle_links_close_s in the daemon
            _drive({"key": key, "warm": [f.ports["shell_port"] for f in batch]})
            time.sleep(REST_S + 0.5)
        client = Client(context, key, fronts[0].ports["shell_port"], fronts[0].ports["iopub_port"])
        clients.append(client)
        time.sleep(1.0)  # the IOPub subscription reaches the front
        client.request("execute_request", {"code": "0", "silent": False})  # first cell: all asked
        time.sleep(max(1.0, min(5.0, count / 500)))  # connections settle
        threads = _threads()
        rss_per_kernel_kb = (_rss_kb() - rss_before) / count
        cpu0, t0 = _cpu_s(), time.monotonic()
        time.sleep(window)
        idle_cpu_ms_per_s = (_cpu_s() - cpu0) / (time.monotonic() - t0) * 1000
        # The timed clients and the load run in a process of their own, as Jupyter Server's
        # do: in this one they would share the fronts' GIL and the open-file limit.
        client.close()
        clients.remove(client)
        timed = _drive({"key": key, "shell": fronts[0].ports["shell_port"],
                        "iopub": fronts[0].ports["iopub_port"], "direct": ports["1"]["shell"],
                        "others": [f.ports["shell_port"] for f in fronts[1:1 + LOAD_FRONTS]],
                        "cells": cells, "rate": rate, "sweep": sweep})
        via_front, straight, info = timed["via_front"], timed["straight"], timed["info"]
        loaded = timed["loaded"]
        swept = timed.get("sweep", [])
        sustained = [r["load_cells_per_s"] for r in swept
                     if r["loaded_cell_ms"]["p99"] < SUSTAINED_P99_MS
                     and r["load_cells_per_s"] >= 0.9 * r["rate"]]
        ms = [v * 1000 for v in via_front]
        direct_ms = [v * 1000 for v in straight]
        return {
            "kernels": count,
            "links_rest": not keep_links,
            "open_s": round(open_s, 3),
            "front_opens_per_s": round(count / open_s, 1) if open_s > 0 else None,
            "threads_before": threads_before,
            "threads": threads,
            "idle_cpu_ms_per_s": round(idle_cpu_ms_per_s, 3),
            "idle_cpu_ms_per_s_per_kernel": round(idle_cpu_ms_per_s / count, 5),
            "rss_per_kernel_kb": round(rss_per_kernel_kb, 1),
            "cell_ms": {"p50": _pct(ms, 0.5), "p99": _pct(ms, 0.99)},
            "direct_ms": {"p50": _pct(direct_ms, 0.5), "p99": _pct(direct_ms, 0.99)},
            "overhead_ms": {"p50": round(_pct(ms, 0.5) - _pct(direct_ms, 0.5), 3),
                            "p99": round(_pct(ms, 0.99) - _pct(direct_ms, 0.99), 3)},
            "kernel_info_ms": {"p50": _pct([v * 1000 for v in info], 0.5),
                               "p99": _pct([v * 1000 for v in info], 0.99)},
            **loaded,
            "sweep": swept,
            "sustained_cells_per_s": max(sustained, default=0.0),
        }
    finally:
        for c in clients:
            c.close()
        for front in fronts:
            front.close()
        if standin.stdin is not None:
            standin.stdin.close()
        try:
            standin.wait(10)
        except subprocess.TimeoutExpired:
            standin.kill()


LOAD_FRONTS = 200  # the other fronts the load goes through, round robin
WARM_BATCH = 200  # fronts opened (and given their first cell) at a time
REST_S = 1.0  # the fronts' idle_links_close_s here (the daemon's default is 30 s)


def _drive(spec: dict[str, Any]) -> dict[str, Any]:
    """Run ``drive`` in a new process (``--drive``, the spec on its stdin); its result."""
    done = subprocess.run([sys.executable, __file__, "--drive"], input=json.dumps(spec),
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the driver failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def drive(spec: dict[str, Any]) -> dict[str, Any]:
    """The timed cells through kernel 0's front and straight to its stand-in (alternating),
    kernel_info through the front, then kernel 0's cells while ``rate`` cells/s go round robin
    through the other fronts. Times in seconds, the load's figures in ms."""
    context = zmq.Context()
    if "warm" in spec:  # one cell on each of these fronts, one after the other
        for port in spec["warm"]:
            warm = Client(context, spec["key"], port)
            try:
                warm.request("execute_request", {"code": "0", "silent": False})
            finally:
                warm.close()
        context.term()
        return {"warmed": len(spec["warm"])}
    key, cells = spec["key"], spec["cells"]
    client = Client(context, key, spec["shell"], spec["iopub"])
    direct = Client(context, key, spec["direct"])
    clients = [client, direct]
    try:
        time.sleep(1.0)  # the IOPub subscription reaches the front
        client.request("execute_request", {"code": "0", "silent": False})
        via_front: list[float] = []
        straight: list[float] = []
        for _ in range(cells):
            via_front.append(client.request("execute_request", {"code": "1", "silent": False}))
            straight.append(direct.request("execute_request", {"code": "1", "silent": False}))
        info = [client.request("kernel_info_request", {}) for _ in range(max(10, cells // 3))]
        others = [Client(context, key, port) for port in spec["others"]]
        clients += others
        loaded = _loaded(others, client, cells, spec["rate"])
        sweep = []
        for rate in spec.get("sweep", []):
            row = {"rate": rate, **_loaded(others, client, cells, rate)}
            sweep.append(row)
            if row["loaded_cell_ms"]["p99"] >= SUSTAINED_P99_MS * 3 \
                    or row["load_cells_per_s"] < 0.5 * rate:
                break  # far past what it sustains: higher rates say nothing more
        return {"via_front": via_front, "straight": straight, "info": info, "loaded": loaded,
                "sweep": sweep}
    finally:
        for c in clients:
            c.close()
        context.term()


def _loaded(others: list[Client], client: Client, cells: int, rate: float) -> dict[str, Any]:
    """Kernel 0's cells while ``rate`` cells/s go round robin through the other fronts."""
    if not others or rate <= 0:
        return {}
    stop = threading.Event()
    sent = [0]

    def flow() -> None:
        period = 1.0 / rate
        due = time.monotonic()
        while not stop.is_set():
            c = others[sent[0] % len(others)]
            c.drain()
            c.send("execute_request", {"code": "1", "silent": False})
            sent[0] += 1
            due += period
            stop.wait(max(0.0, due - time.monotonic()))

    load = threading.Thread(target=flow, daemon=True)
    started = time.monotonic()
    load.start()
    loaded: list[float] = []
    timed_out = False
    try:
        for _ in range(cells):
            loaded.append(client.request("execute_request", {"code": "1", "silent": False})
                          * 1000)
    except TimeoutError:  # overloaded: the fronts fell more than 10 s behind
        timed_out = True
    finally:
        stop.set()
        load.join(5)
    achieved = sent[0] / (time.monotonic() - started)
    if timed_out:
        return {"loaded_cell_ms": {"p50": float("inf"), "p99": float("inf")},
                "load_cells_per_s": round(achieved, 1), "timed_out": True}
    return {"loaded_cell_ms": {"p50": _pct(loaded, 0.5), "p99": _pct(loaded, 0.99)},
            "load_cells_per_s": round(achieved, 1)}


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _task_cpu(pid: int) -> dict[int, float]:
    cpu: dict[int, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu[int(tid)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return cpu


def _write_thread_cpu(pid: int, before: dict[int, float], after: dict[int, float],
                      seconds: float, out: Path) -> None:
    """Each thread's CPU over the window (ms/s), named from ``py-spy dump``."""
    names: dict[int, str] = {}
    dump = subprocess.run(["py-spy", "dump", "-p", str(pid)], capture_output=True, text=True)
    for line in dump.stdout.splitlines():
        if line.startswith("Thread "):  # Thread 0x7F.. (idle): "name"  or  Thread 12345 ...
            parts = line.split()
            try:
                names[int(parts[1], 0)] = line.split(":", 1)[1].strip()
            except (ValueError, IndexError):
                continue
    (out.parent / f"{out.stem}-dump.txt").write_text(dump.stdout)
    rows = sorted(((after[t] - before.get(t, 0.0)) / seconds * 1000, t) for t in after)
    out.write_text("".join(f"{ms:8.2f} ms/s  tid {t}  {names.get(t, '(native)')}\n"
                           for ms, t in reversed(rows)))


def _status_polls(stub, clients: list, count: int, polls: int = 1000,  # noqa: ANN001
                  pollers: int = 4) -> dict[str, Any]:
    """Status queries while cells flow: ``pollers`` threads each send ``polls`` /
    ``pollers`` GetKernelStatus (round robin over the kernels, as Jupyter's restarter polls
    each kernel) and one GetClusterStatus in ten, while one thread runs trivial cells through
    the kernels in turn. ``status_ms``: GetKernelStatus p50/p99; ``cluster_status_ms`` the
    same for GetClusterStatus; ``status_cells``: the cells run meanwhile."""
    from notebookos.proto import global_scheduler_pb2

    kernel_ms: list[float] = []
    cluster_ms: list[float] = []
    stop = threading.Event()
    ran = [0]

    def cells() -> None:
        i = 0
        while not stop.is_set():
            clients[i % len(clients)].execute_interactive("pass", timeout=30)
            ran[0] += 1
            i += 1

    def poll(offset: int) -> None:
        for i in range(polls // pollers):
            t = time.perf_counter()
            if i % 10 == 9:
                stub.GetClusterStatus(global_scheduler_pb2.GetClusterStatusRequest(), timeout=30)
                cluster_ms.append((time.perf_counter() - t) * 1000)
            else:
                stub.GetKernelStatus(global_scheduler_pb2.GetKernelStatusRequest(
                    kernel_id=f"scale-{(i + offset) % count:03d}"), timeout=30)
                kernel_ms.append((time.perf_counter() - t) * 1000)

    load = threading.Thread(target=cells, daemon=True)
    load.start()
    threads = [threading.Thread(target=poll, args=(k,)) for k in range(pollers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    load.join(60)
    return {"status_ms": {"p50": round(_pct(kernel_ms, 0.5), 2),
                          "p99": round(_pct(kernel_ms, 0.99), 2)},
            "cluster_status_ms": {"p50": round(_pct(cluster_ms, 0.5), 2),
                                  "p99": round(_pct(cluster_ms, 0.99), 2)},
            "status_cells": ran[0]}


def measure_real(count: int, window: float, profile: Path | None = None) -> dict[str, Any]:
    """The Global Scheduler daemon with ``count`` idle kernels of real replicas."""
    import statistics
    import tempfile

    from jupyter_client import BlockingKernelClient

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from routing import Daemons

    from notebookos.proto import common_pb2, global_scheduler_pb2
    from notebookos.proto.convert import connection_info_to_dict

    with tempfile.TemporaryDirectory(prefix="nbos-gs-scale-") as tmp:
        daemons = Daemons(Path(tmp))
        daemons.env.pop("NOTEBOOKOS_LOCAL_SCHEDULER_HEARTBEAT_INTERVAL_S")  # the default, 2 s
        clients: list[BlockingKernelClient] = []
        try:
            stub = daemons.start()
            gs_pid = daemons.procs[0].pid
            time.sleep(2)  # the hosts registered and heartbeating, no kernel
            threads_no_kernels = len(os.listdir(f"/proc/{gs_pid}/task"))
            # the most threads while the kernels start (sampled every 20 ms, here only)
            peak = [threads_no_kernels]
            sampling = threading.Event()

            def sample() -> None:
                while not sampling.wait(0.02):
                    try:
                        peak[0] = max(peak[0], len(os.listdir(f"/proc/{gs_pid}/task")))
                    except OSError:
                        return

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            start_s = []
            for n in range(count):
                t_start = time.perf_counter()
                started = stub.StartKernel(global_scheduler_pb2.StartKernelRequest(
                    kernel_id=f"scale-{n:03d}", key=uuid.uuid4().hex,
                    resources=common_pb2.ResourceSpec(millicpus=10, memory_mb=64, gpus=0)),
                    timeout=180)
                kc = BlockingKernelClient()
                kc.load_connection_info(connection_info_to_dict(started.connection))
                kc.start_channels(hb=False)  # as Jupyter Server's websocket: no heartbeat
                kc.wait_for_ready(timeout=120)
                kc.execute_interactive("x = 1", timeout=60)
                start_s.append(time.perf_counter() - t_start)
                clients.append(kc)
            sampling.set()
            sampler.join()
            time.sleep(5)  # the replicas and the scheduler settle (Raft rests)
            spy = None
            if profile is not None:  # py-spy's folded stacks of the idle window
                spy = subprocess.Popen(["py-spy", "record", "--gil", "-p", str(gs_pid), "-d",
                                        str(int(window)), "-f", "raw", "-o",
                                        str(profile / f"gs-idle-{count}.txt")],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            tasks0 = _task_cpu(gs_pid)
            cpu0, t0 = _proc_cpu_s(gs_pid), time.monotonic()
            time.sleep(window)
            if profile is not None:
                _write_thread_cpu(gs_pid, tasks0, _task_cpu(gs_pid), time.monotonic() - t0,
                                  profile / f"gs-threads-{count}.txt")
            idle = (_proc_cpu_s(gs_pid) - cpu0) / (time.monotonic() - t0) * 1000
            status = Path(f"/proc/{gs_pid}/status").read_text()
            rss_kb = int(next(line.split()[1] for line in status.splitlines()
                              if line.startswith("VmRSS:")))
            threads = len(os.listdir(f"/proc/{gs_pid}/task"))
            if spy is not None:
                spy.wait(30)
            cells = []
            for _ in range(30):
                t = time.perf_counter()
                clients[0].execute_interactive("pass", timeout=30)
                cells.append((time.perf_counter() - t) * 1000)
            polls = _status_polls(stub, clients, count)
            polls["gs_threads_after_polls"] = len(os.listdir(f"/proc/{gs_pid}/task"))
            polls["loop_lock_waits"] = _loop_lock_waits(stub)
            return {"kernels": count, "gs_threads": threads,
                    "gs_threads_no_kernels": threads_no_kernels,
                    "gs_threads_starting_max": peak[0],
                    "gs_idle_cpu_ms_per_s": round(idle, 2),
                    "gs_idle_cpu_ms_per_s_per_kernel": round(idle / count, 3),
                    "gs_rss_mb": round(rss_kb / 1000, 1),
                    "cell_ms_p50": round(statistics.median(cells), 2),
                    "kernel_start_s": {"median": round(statistics.median(start_s), 3),
                                       "max": round(max(start_s), 3)}, **polls}
        finally:
            for kc in clients:
                kc.stop_channels()
            daemons.stop()


def _loop_lock_waits(stub: Any) -> dict[str, Any]:
    """The scheduler's loop standing still on its state lock while a pool thread held it, over
    the whole run (its metric ``notebookos_gs_loop_lock_wait_seconds``, state_lock.py): how
    often, for how long in all, the longest bucket reached, and how many stalls were over
    1 ms and over 10 ms."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from notebookos.proto import global_scheduler_pb2

    address = stub.GetClusterStatus(global_scheduler_pb2.GetClusterStatusRequest(),
                                    timeout=10).metrics_address
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    buckets: dict[float, float] = {}
    count = total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != "notebookos_gs_loop_lock_wait_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                buckets[float(sample.labels["le"])] = sample.value
            elif sample.name.endswith("_count"):
                count = sample.value
            elif sample.name.endswith("_sum"):
                total = sample.value
    bounds = sorted(buckets)
    longest = next((b for b in bounds if buckets[b] >= count), None) if count else 0.0
    return {"stalls": int(count), "total_ms": round(total * 1000, 2),
            "over_1ms": int(count - buckets.get(0.001, count)),
            "over_10ms": int(count - buckets.get(0.01, count)),
            "longest_under_ms": None if longest is None else longest * 1000}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--kernels", default="10,100,500,1000", help="comma-separated counts")
    parser.add_argument("--window", type=float, default=10.0, help="idle seconds measured")
    parser.add_argument("--cells", type=int, default=300, help="cells timed each way")
    parser.add_argument("--rate", type=float, default=100.0,
                        help="cells/s through the other fronts for loaded_cell_ms")
    parser.add_argument("--sweep", default="200,400,800,1600,3200",
                        help="comma-separated load rates (cells/s) for sustained_cells_per_s")
    parser.add_argument("--keep-links", action="store_true",
                        help="the baseline: idle fronts keep their standbys' links (as before "
                             "they rested)")
    parser.add_argument("--real", default="",
                        help="comma-separated counts of idle kernels of real replicas behind "
                             "the whole Global Scheduler daemon (e.g. 1,10,20)")
    parser.add_argument("--profile", type=Path, default=None,
                        help="with --real: py-spy's stacks of the GS's idle window, to this dir")
    parser.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)
    args = smoke.parse_args(parser, argv, kernels="3", window=0.5, cells=10, rate=20.0,
                            sweep="40")
    if args.drive:  # the clients' process (measure): the spec on stdin, the result on stdout
        print(json.dumps(drive(json.loads(sys.stdin.read()))))
        return 0
    try:  # as root, beyond the hard limit too (a daemon's unit or container sets it there)
        nr_open = int(Path("/proc/sys/fs/nr_open").read_text())
        resource.setrlimit(resource.RLIMIT_NOFILE, (nr_open, nr_open))
    except (OSError, ValueError):
        pass
    raise_limits()
    # idle kernels whose standbys' links rest, beside the load's 200 active ones
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    idle_fds = FDS_PER_IDLE_KERNEL if args.keep_links else FDS_PER_RESTING_KERNEL
    room = (soft - 1024 - LOAD_FRONTS * (FDS_PER_IDLE_KERNEL - idle_fds + 2)) // idle_fds
    results = []
    for count in (int(n) for n in args.kernels.split(",") if n):
        if count > room:
            results.append({"kernels": count, "skipped": f"the open-file limit leaves room for "
                                                         f"{room} kernels in one process"})
            if not args.json:
                print(json.dumps(results[-1]), flush=True)
            continue
        sweep = [float(r) for r in args.sweep.split(",") if r]
        results.append(measure(count, args.window, args.cells, args.rate, sweep,
                               args.keep_links))
        if not args.json:
            print(json.dumps(results[-1]), flush=True)
    real = []
    for count in (int(n) for n in args.real.split(",") if n):
        real.append(measure_real(count, args.window, args.profile))
        if not args.json:
            print(json.dumps(real[-1]), flush=True)
    if args.json:
        print(json.dumps({"gs_scale": results, "real": real}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
