"""Benchmark the distributed kernel against a plain ipykernel, in the same run, same client.

    python benchmarks/kernel.py [--json] [--cells 200] [--large-mib 1024] [--skip-large]
                                [--namespace-sizes 100,1000,10000] [--namespace-mib 256]
                                [--only-namespace] [--only-large]

Measures (see docs/performance.md, "Distributed kernel"):
- roundtrip_p50/p99_ms: a trivial cell on a 3-replica group, from sending the execute/yield
  requests to receiving the executor's execute_reply; plain_p50/p99_ms: the same cell, same
  jupyter_client client code, on a plain ipykernel started the same way.
- sync_p50/p99_ms: from the executor's reply to the moment every standby has applied the cell's
  small-state update (a standby replies only after applying it: the last standby reply).
- large_write_s / large_read_s: a tensor of --large-mib MiB through S3 (a local SeaweedFS):
  write = executor reply -> executor idle (serialise, upload, commit); read = executor idle ->
  last standby reply (fetch, deserialise). raw_write_s / raw_read_s: boto3 alone, same bytes;
  raw_read2_s: two boto3 clients reading them at once (the two standbys read at once), right
  after the write, as the standbys do. Each side runs on a fresh SeaweedFS of its own: on one
  shared server the second side's read was 1.5-2x slower after the first side's 2 GiB of traffic
  (the same raw read measured after the kernel's took 3.9-4.5 s against 1.75 s before it).
  The raw writer holds its bytes until the reads are done, as the executor holds the tensor: a
  reader's time is mostly spent faulting in fresh pages for what it receives, and freeing the
  written GiB first handed the raw readers a GiB of warm pages (two raw readers: 3.3-3.9 s
  after ``del data``, 4.0-5.8 s with the data held, three runs each, 2026-11-26).
- write_vs_raw / read_vs_raw2: the kernel's write and read throughput as a share of the raw
  client's (raw_write_s / large_write_s, raw_read2_s / large_read_s; issue 18 asks for 0.8).
- failover_s: SIGKILL the executor, then send the next cell to a survivor: kill -> that cell's
  execute_input.
- sync_1name_p50_ms[N] / encode_1name_p50_ms[N]: a cell that changes one name (``v0['n'] += 1``)
  in a namespace of N names (small dicts, a tenth of them sharing a list with another name) plus
  one --namespace-mib MiB numpy array: sync as above on a 3-replica group; encode = the executor's
  StateEncoder.encode alone, in this process. Flat in N means untouched names cost nothing.
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "kernel"))  # the replica-group harness lives with tests

from harness import ReplicaGroup, kill_group  # noqa: E402
from jupyter_client import BlockingKernelClient  # noqa: E402
from jupyter_client.connect import write_connection_file  # noqa: E402

from notebookos.testing import smoke  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def wait_reply(getter, msg_id: str, timeout: float = 60.0) -> dict[str, Any]:
    return ReplicaGroup._wait_reply(getter, msg_id, timeout)


def wait_idle(client: BlockingKernelClient, msg_id: str, timeout: float = 60.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = client.get_iopub_msg(timeout=timeout)
        if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"):
            return time.perf_counter()
    raise TimeoutError("no idle")


def plain_kernel(workdir: Path, cells: int, attempts: int = 3) -> list[float]:
    """The baseline; retried with fresh ports (a port picked free may be taken before bind)."""
    for attempt in range(attempts):
        try:
            return _plain_kernel(workdir / f"plain-{attempt}.json", cells)
        except RuntimeError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _plain_kernel(cf: Path, cells: int) -> list[float]:
    write_connection_file(str(cf), ip="127.0.0.1", key=b"plain-key")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ipykernel_launcher", "-f", str(cf),
         "--HistoryManager.enabled=False"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    client = BlockingKernelClient(connection_file=str(cf))
    client.load_connection_file()
    client.start_channels()
    try:
        deadline = time.monotonic() + 60
        while True:  # kernel_info handshake (wait_for_ready's heartbeat check is flaky under load)
            try:
                info_id = client.kernel_info()
                wait_reply(client.get_shell_msg, info_id, 1.0)
                # and its idle: IOPub is subscribed, so the first cell's idle is not lost (its
                # wait ended the whole run with queue.Empty after 60 s, 2026-11-29)
                wait_idle(client, info_id, 1.0)
                break
            except (TimeoutError, queue.Empty):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the plain ipykernel did not start") from None
        samples = []
        for i in range(cells + 10):
            t0 = time.perf_counter()
            msg_id = client.execute("1")
            wait_reply(client.get_shell_msg, msg_id)
            if i >= 10:
                samples.append(time.perf_counter() - t0)
            wait_idle(client, msg_id)
        return samples
    finally:
        client.stop_channels()
        kill_group(proc)


def distributed_roundtrip(group: ReplicaGroup, cells: int) -> tuple[list[float], list[float]]:
    """Trivial cell; returns (executor reply latencies, sync latencies) in seconds."""
    roundtrip, sync = [], []
    executor = group.replicas[1].client
    for i in range(cells + 10):
        t0 = time.perf_counter()
        msg_id = group.send_execute(f"bench_state = {i}", target=1)
        wait_reply(executor.get_shell_msg, msg_id)
        t_reply = time.perf_counter()
        for rid in (2, 3):
            wait_reply(group.replicas[rid].client.get_shell_msg, msg_id)
        t_synced = time.perf_counter()
        wait_idle(executor, msg_id)
        if i >= 10:
            roundtrip.append(t_reply - t0)
            sync.append(t_synced - t_reply)
    group.drain_iopub()
    return roundtrip, sync


def failover(group: ReplicaGroup) -> float:
    group.execute("before_failover = 1", target=1)
    survivor = group.replicas[2].client
    group.kill(1)
    t0 = time.perf_counter()
    msg_id = group.send_execute("after_failover = before_failover + 1", target=2, to=[2, 3])
    while True:
        msg = survivor.get_iopub_msg(timeout=30)
        if msg["msg_type"] == "execute_input" and msg["parent_header"].get("msg_id") == msg_id:
            elapsed = time.perf_counter() - t0
            break
    result = group.collect(msg_id, [2, 3], target=None)
    assert result.reply(2)["content"]["status"] == "ok", result.summary()
    return elapsed


def two_raw_reads(server: Any, bucket: str, key: str) -> float:
    """Seconds for two boto3 clients reading the object at once, as the two standbys do."""
    import threading

    clients = [server.client(), server.client()]
    sizes: list[int] = []
    threads = [threading.Thread(target=lambda c=c: sizes.append(
        len(c.get_object(Bucket=bucket, Key=key)["Body"].read()))) for c in clients]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    assert len(sizes) == 2
    return took


def large_objects(workdir: Path, mib: int) -> dict[str, float]:
    from notebookos.testing.seaweed import S3Server

    server = S3Server(workdir / "weed-raw").start()
    try:
        bucket = server.new_bucket()
        data = os.urandom(1 << 20) * mib
        s3 = server.client()
        t0 = time.perf_counter()
        s3.put_object(Bucket=bucket, Key="raw/blob", Body=data)
        raw_write = time.perf_counter() - t0
        # The writer keeps its bytes while the readers read, as the executor keeps the user's
        # tensor: freed first, they gave the readers a GiB of warm pages (see the docstring).
        raw_read2 = two_raw_reads(server, bucket, "raw/blob")
        t0 = time.perf_counter()
        size = len(s3.get_object(Bucket=bucket, Key="raw/blob")["Body"].read())
        raw_read = time.perf_counter() - t0
        assert size == mib << 20
        del data
    finally:
        server.stop()
    server = S3Server(workdir / "weed").start()
    try:
        bucket = server.new_bucket()
        store_url = server.store_url(bucket, credentials=True)
        group = ReplicaGroup(workdir / "large", store_url=store_url)
        try:
            group.start()
            group.execute("import torch", target=1, timeout=120)
            elements = mib * (1 << 20) // 4
            msg_id = group.send_execute(
                f"huge = torch.ones({elements}, dtype=torch.float32)", target=1
            )
            executor = group.replicas[1].client
            wait_reply(executor.get_shell_msg, msg_id, 600)
            t_reply = time.perf_counter()
            t_idle = wait_idle(executor, msg_id, 600)
            for rid in (2, 3):
                wait_reply(group.replicas[rid].client.get_shell_msg, msg_id, 600)
            t_read = time.perf_counter()
            check = group.execute("print(int(huge.sum()))", target=2, timeout=120)
            assert check.stdout().strip() == str(elements), check.summary()
        finally:
            group.stop()
        write_s, read_s = t_idle - t_reply, t_read - t_idle
        return {"large_write_s": write_s, "large_read_s": read_s,
                "raw_write_s": raw_write, "raw_read_s": raw_read, "raw_read2_s": raw_read2,
                # issue 18's figures: the kernel's throughput as a share of the raw client's
                "write_vs_raw": raw_write / write_s, "read_vs_raw2": raw_read2 / read_s,
                "large_mib": mib}
    finally:
        server.stop()


NAMESPACE_SETUP = """
import numpy as np
for i in range({n}):
    globals()[f"v{{i}}"] = {{"n": 0, "l": [i], "name": f"v{{i}}"}}
for i in range(0, {n}, 10):
    globals()[f"s{{i}}"] = globals()[f"v{{i}}"]["l"]
big = np.ones({elements})
"""
ONE_NAME_CELL = "v0['n'] += 1"


def namespace_sync(workdir: Path, sizes: list[int], mib: int, cells: int) -> dict[str, float]:
    """Sync and encode time of a one-name cell against the namespace's size (see docstring)."""
    results: dict[str, float] = {}
    elements = mib * (1 << 20) // 8
    for n in sizes:
        setup = NAMESPACE_SETUP.format(n=n, elements=elements)
        group = ReplicaGroup(workdir / f"ns-{n}", store_url=f"file://{workdir}/ns-{n}-store")
        try:
            group.start()
            done = group.execute(setup, target=1, timeout=600)
            assert done.reply(1)["content"]["status"] == "ok", done.summary()
            sync = []
            executor = group.replicas[1].client
            for i in range(cells + 3):
                msg_id = group.send_execute(ONE_NAME_CELL, target=1)
                wait_reply(executor.get_shell_msg, msg_id)
                t_reply = time.perf_counter()
                for rid in (2, 3):
                    wait_reply(group.replicas[rid].client.get_shell_msg, msg_id)
                if i >= 3:
                    sync.append(time.perf_counter() - t_reply)
                wait_idle(executor, msg_id)
            check = group.execute("print(v0['n'])", target=1, timeout=600)
            assert check.stdout().strip() == str(cells + 3), (check.summary(), check.stderr())
        finally:
            group.stop()
        results[f"sync_1name_p50_ms[{n}]"] = percentile(sync, 50) * 1e3
        results[f"encode_1name_p50_ms[{n}]"] = encode_one_name(workdir, setup, cells) * 1e3
    return results


def encode_one_name(workdir: Path, setup: str, cells: int) -> float:
    """p50 seconds of the executor's encode of ONE_NAME_CELL, after the setup is synced."""
    from notebookos.kernel.ast_effects import analyze_cell
    from notebookos.kernel.sync_codec import StateEncoder
    from notebookos.store import open_store

    store = open_store(f"file://{workdir}/encode-store", b"0123456789abcdef0123456789abcdef")
    encoder = StateEncoder(store, "k-bench")
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(setup, namespace)
    encoder.encode(namespace, analyze_cell(setup))
    effects = analyze_cell(ONE_NAME_CELL)
    samples = []
    for _ in range(cells):
        exec(ONE_NAME_CELL, namespace)
        t0 = time.perf_counter()
        encoder.encode(namespace, effects)
        samples.append(time.perf_counter() - t0)
    store.close()
    return percentile(samples, 50)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--large-mib", type=int, default=1024)
    parser.add_argument("--skip-large", action="store_true")
    parser.add_argument("--namespace-sizes", default="100,1000,10000",
                        help="comma-separated namespace sizes for the one-name-cell sync")
    parser.add_argument("--namespace-mib", type=int, default=256,
                        help="MiB of an untouched numpy array in those namespaces")
    parser.add_argument("--namespace-cells", type=int, default=30)
    parser.add_argument("--only-namespace", action="store_true",
                        help="measure only the one-name-cell sync against namespace size")
    parser.add_argument("--only-large", action="store_true",
                        help="measure only the large-object write and read against raw S3")
    args = smoke.parse_args(parser, cells=10, skip_large=True, namespace_sizes="100",
                            namespace_mib=1, namespace_cells=3, only_large=False)
    # SIGTERM must run the finally blocks that stop the replicas and the S3 server
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="nbos-bench-") as tmp:
        workdir = Path(tmp)
        if args.only_large:
            results.update(large_objects(workdir, args.large_mib))
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                              for k, v in results.items()}))
            return 0
        sizes = [int(n) for n in args.namespace_sizes.split(",") if n]
        results.update(namespace_sync(workdir, sizes, args.namespace_mib, args.namespace_cells))
        if args.only_namespace:
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                              for k, v in results.items()}))
            return 0
        plain = plain_kernel(workdir, args.cells)
        group = ReplicaGroup(workdir / "group", store_url=f"file://{workdir}/store")
        try:
            t0 = time.perf_counter()
            group.start()
            results["group_start_s"] = time.perf_counter() - t0
            roundtrip, sync = distributed_roundtrip(group, args.cells)
            results["failover_s"] = failover(group)
        finally:
            group.stop()
        results.update({
            "roundtrip_p50_ms": percentile(roundtrip, 50) * 1e3,
            "roundtrip_p99_ms": percentile(roundtrip, 99) * 1e3,
            "plain_p50_ms": percentile(plain, 50) * 1e3,
            "plain_p99_ms": percentile(plain, 99) * 1e3,
            "sync_p50_ms": percentile(sync, 50) * 1e3,
            "sync_p99_ms": percentile(sync, 99) * 1e3,
        })
        results["overhead_p50_ms"] = results["roundtrip_p50_ms"] - results["plain_p50_ms"]
        if not args.skip_large:
            results.update(large_objects(workdir, args.large_mib))
    results["cells"] = args.cells
    results["cpus"] = os.cpu_count()
    if args.json:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                          for k, v in results.items()}))
    else:
        for key, value in results.items():
            print(f"{key:>20}: {value:.3f}" if isinstance(value, float) else f"{key:>20}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
