"""Jupyter Server's idle-kernel culler shuts a distributed kernel down: every replica stops."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid

import grpc
from nbos_cluster import Cluster
from tornado.httpclient import AsyncHTTPClient
from wsclient import run_cells, start_kernel

from notebookos.proto import common_pb2, global_scheduler_pb2, global_scheduler_pb2_grpc
from notebookos.testing.processes import free_port, kill_group, wait_for_port


def kernel_state(address: str, kernel_id: str) -> tuple[int, list[int]] | None:
    with grpc.insecure_channel(address) as channel:
        stub = global_scheduler_pb2_grpc.GlobalSchedulerStub(channel)
        try:
            status = stub.GetKernelStatus(
                global_scheduler_pb2.GetKernelStatusRequest(kernel_id=kernel_id), timeout=10)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
    return status.state, [r.pid for r in status.replicas if r.pid]


def test_culler_stops_every_replica(nbos_cluster: Cluster) -> None:
    workdir = nbos_cluster.workdir
    port, token = free_port(), uuid.uuid4().hex
    with open(workdir / "cull-server.log", "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root",
             "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}",
             f"--ServerApp.root_dir={workdir}",
             "--MappingKernelManager.cull_idle_timeout=4",
             "--MappingKernelManager.cull_interval=1"],
            stdout=log, stderr=subprocess.STDOUT, env=nbos_cluster.env,
            start_new_session=True, cwd=workdir)
    try:
        assert wait_for_port(port, 60, server)
        time.sleep(1)
        kernel = asyncio.run(start_kernel(port, token, "notebookos"))
        results = asyncio.run(run_cells(port, token, kernel["id"], ["z = 1"]))
        assert results[0]["reply"]["status"] == "ok"
        state = kernel_state(nbos_cluster.address, kernel["id"])
        assert state is not None and len(state[1]) == 3
        pids = state[1]

        async def listed() -> list[str]:
            resp = await AsyncHTTPClient().fetch(
                f"http://127.0.0.1:{port}/api/kernels?token={token}")
            return [k["id"] for k in json.loads(resp.body)]

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and kernel["id"] in asyncio.run(listed()):
            time.sleep(0.5)
        assert kernel["id"] not in asyncio.run(listed()), "the culler did not cull the kernel"
        after = kernel_state(nbos_cluster.address, kernel["id"])
        assert after is None or after[0] == common_pb2.KERNEL_STATE_STOPPED
        deadline = time.monotonic() + 20
        alive = pids
        while alive and time.monotonic() < deadline:
            alive = [p for p in pids if _alive(p)]
            time.sleep(0.2)
        assert alive == [], f"replicas {alive} outlived the culled kernel"
    finally:
        kill_group(server)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return False
