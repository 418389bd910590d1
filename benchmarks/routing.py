"""Trivial-cell round trip through the schedulers vs straight to the replica group, same run.

Starts a Global Scheduler and three Local Schedulers (virtual GPUs) on loopback and one
distributed kernel (three real replicas, ``python -m notebookos.kernel``). Then, alternating:

- routed: ``execute_request`` to the kernel's front on the Global Scheduler, which picks the
  executor, has its Local Scheduler commit a GPU, sends execute/yield to the replicas, merges the
  replies and releases the GPU; timed until the client has the ``execute_reply``;
- direct: the same cell sent by the client itself straight to the replicas (execute_request to
  one, yield_request to the others, signed with the kernel key, ``gpu_device_ids`` set), timed
  until the executor's ``execute_reply``.

Keys: ``routed_p50_ms``, ``routed_p99_ms``, ``direct_p50_ms``, ``direct_p99_ms``,
``overhead_p50_ms``. Target: overhead at most 3 ms at p50.
Usage: ``python benchmarks/routing.py [--json] [--cells N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc
import zmq
from jupyter_client import BlockingKernelClient
from jupyter_client.session import Session

from notebookos.config import load_config
from notebookos.global_scheduler.registry_store import read_file_registry
from notebookos.ports import free_ports
from notebookos.proto import common_pb2, global_scheduler_pb2
from notebookos.proto import global_scheduler_pb2_grpc as gs_grpc
from notebookos.proto.convert import connection_info_to_dict
from notebookos.security import secure_channel
from notebookos.testing import smoke  # noqa: E402
from notebookos.testing.credentials import make_credentials


def free_port() -> int:
    return free_ports(1)[0]  # below the ephemeral range: no outgoing connection takes it


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Daemons:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.procs: list[subprocess.Popen] = []
        # the daemons and this client share one CA, certificate and join token (mutual TLS)
        self.security = make_credentials(workdir / "tls")
        self.env = {**os.environ, "NOTEBOOKOS_LOCAL_SCHEDULER_HEARTBEAT_INTERVAL_S": "0.5",
                    **self.security}

    def spawn(self, name: str, *args: str) -> None:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - lives with the process
        self.procs.append(subprocess.Popen(
            [sys.executable, "-m", "notebookos.cli", *args], stdout=log,
            stderr=subprocess.STDOUT, env=self.env, start_new_session=True))

    def start(self, hosts: int = 3) -> gs_grpc.GlobalSchedulerStub:
        state = str(self.workdir / "state")
        self.spawn("gs", "global-scheduler", "--port", str(self.port), "--state-dir", state)
        for i in range(hosts):
            self.spawn(f"ls{i}", "local-scheduler", "--host-id", f"bench-{i}", "--port", "0",
                       "--global-scheduler", f"127.0.0.1:{self.port}", "--virtual-gpus", "2",
                       "--prewarm", "0", "--state-dir", state)
        stub = gs_grpc.GlobalSchedulerStub(secure_channel(
            load_config(env=self.security), f"127.0.0.1:{self.port}"))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if len(stub.GetClusterStatus(global_scheduler_pb2.GetClusterStatusRequest(),
                                             timeout=2).hosts) == hosts:
                    return stub
            except grpc.RpcError:
                pass
            time.sleep(0.2)
        raise RuntimeError("the daemons did not come up; see " + str(self.workdir))

    def stop(self) -> None:
        for proc in reversed(self.procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


class DirectGroup:
    """The client side of the replica group without the schedulers."""

    def __init__(self, replicas: list[dict], key: str) -> None:
        self.session = Session(key=key.encode(), signature_scheme="hmac-sha256")
        ctx = zmq.Context.instance()
        self.shells = []
        for r in replicas:
            s = ctx.socket(zmq.DEALER)
            s.linger = 0
            s.connect(f"tcp://{r['ip']}:{r['shell_port']}")
            self.shells.append((r["replica_id"], s))

    def run(self, code: str, executor: int) -> float:
        msg = self.session.msg("execute_request", {"code": code, "silent": False,
                                                    "store_history": True,
                                                    "user_expressions": {},
                                                    "allow_stdin": False,
                                                    "stop_on_error": True})
        t0 = time.perf_counter()
        for rid, sock in self.shells:
            copy = {**msg, "header": dict(msg["header"]), "metadata": {}}
            if rid == executor:
                copy["metadata"] = {"gpu_device_ids": [0]}
            else:
                copy["header"]["msg_type"] = "yield_request"
            self.session.send(sock, copy)
        sock = dict(self.shells)[executor]
        while True:
            _, parts = self.session.feed_identities(sock.recv_multipart())
            reply = self.session.deserialize(parts)
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                elapsed = time.perf_counter() - t0
                break
        for rid, other in self.shells:  # drain the standbys' replies
            if rid != executor:
                other.recv_multipart()
        return elapsed * 1000

    def close(self) -> None:
        for _, s in self.shells:
            s.close(linger=0)


def routed(kc: BlockingKernelClient, code: str) -> float:
    t0 = time.perf_counter()
    msg_id = kc.execute(code)
    while True:
        reply = kc.get_shell_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg_id:
            return (time.perf_counter() - t0) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--cells", type=int, default=200, help="cells per path")
    args = smoke.parse_args(parser, cells=10)
    with tempfile.TemporaryDirectory(prefix="nbos-routing-") as tmp:
        daemons = Daemons(Path(tmp))
        try:
            stub = daemons.start()
            key = uuid.uuid4().hex
            kernel_id = f"bench-{uuid.uuid4().hex[:6]}"
            started = stub.StartKernel(global_scheduler_pb2.StartKernelRequest(
                kernel_id=kernel_id, key=key,
                resources=common_pb2.ResourceSpec(millicpus=100, memory_mb=128, gpus=1)),
                timeout=120)
            kc = BlockingKernelClient()
            kc.load_connection_info(connection_info_to_dict(started.connection))
            kc.start_channels()
            kc.wait_for_ready(timeout=60)
            _hosts, kernels = read_file_registry(Path(tmp) / "state" / "global_scheduler" /
                                                 "registry.json")
            replicas = kernels[kernel_id]["replicas"]
            for _ in range(10):  # warm up the path and the executor's caches
                routed(kc, "pass")
            executor = stub.GetKernelStatus(global_scheduler_pb2.GetKernelStatusRequest(
                kernel_id=kernel_id)).executor_replica_id
            direct = DirectGroup(replicas, key)
            routed_ms, direct_ms = [], []
            for _ in range(args.cells):
                routed_ms.append(routed(kc, "pass"))
                direct_ms.append(direct.run("pass", executor))
            direct.close()
            kc.stop_channels()
        finally:
            daemons.stop()
    result = {
        "cells": args.cells,
        "routed_p50_ms": round(statistics.median(routed_ms), 3),
        "routed_p99_ms": round(percentile(routed_ms, 0.99), 3),
        "direct_p50_ms": round(statistics.median(direct_ms), 3),
        "direct_p99_ms": round(percentile(direct_ms, 0.99), 3),
    }
    result["overhead_p50_ms"] = round(result["routed_p50_ms"] - result["direct_p50_ms"], 3)
    result["target_met"] = result["overhead_p50_ms"] <= 3.0
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>16}: {v}")


if __name__ == "__main__":
    main()
