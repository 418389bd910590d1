"""Jupyter Server's idle-kernel culler shuts a distributed kernel down: every replica stops."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid

from nbos_cluster import Cluster, replica_pids, wait_gone
from tornado.httpclient import AsyncHTTPClient
from wsclient import run_cells, start_kernel

from notebookos.testing.processes import free_port, kill_group, wait_for_port


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
        pids = replica_pids(nbos_cluster.address, kernel["id"])
        assert pids is not None and len(pids) == 3

        async def listed() -> list[str]:
            resp = await AsyncHTTPClient().fetch(
                f"http://127.0.0.1:{port}/api/kernels?token={token}")
            return [k["id"] for k in json.loads(resp.body)]

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and kernel["id"] in asyncio.run(listed()):
            time.sleep(0.5)
        assert kernel["id"] not in asyncio.run(listed()), "the culler did not cull the kernel"
        assert replica_pids(nbos_cluster.address, kernel["id"]) is None
        alive = wait_gone(pids)
        assert alive == [], f"replicas {alive} outlived the culled kernel"
    finally:
        kill_group(server)

