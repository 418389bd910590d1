"""The server extension's REST endpoints, on a real Jupyter Server in front of a real cluster."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from nbos_cluster import Cluster
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from wsclient import run_cells, start_kernel

from notebookos.testing.processes import free_port, kill_group, wait_for_port


class Stack:
    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token

    def get(self, path: str, token: str | None = None) -> tuple[int, dict]:
        return self.fetch(path, token)

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        return self.fetch(path, None, method="POST", body=json.dumps(body))

    def fetch(self, path: str, token: str | None = None, **kwargs: str) -> tuple[int, dict]:
        query = "" if token == "" else f"?token={token or self.token}"

        async def fetch() -> tuple[int, dict]:
            try:
                resp = await AsyncHTTPClient().fetch(f"http://127.0.0.1:{self.port}{path}{query}",
                                                     request_timeout=120, **kwargs)
                return resp.code, json.loads(resp.body)
            except HTTPClientError as err:
                body = err.response.body if err.response is not None else b"{}"
                try:
                    return err.code, json.loads(body)
                except ValueError:
                    return err.code, {}

        return asyncio.run(fetch())


@pytest.fixture(scope="module")
def stack(nbos_cluster: Cluster) -> Iterator[Stack]:
    workdir, env = nbos_cluster.workdir, nbos_cluster.env
    server = None
    try:
        port, token = free_port(), uuid.uuid4().hex
        log = open(workdir / "server.log", "wb")  # noqa: SIM115 - closed below
        server = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root",
             "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}",
             f"--ServerApp.root_dir={workdir}"],
            stdout=log, stderr=subprocess.STDOUT, env=dict(env, JUPYTER_CONFIG_DIR=str(workdir)),
            start_new_session=True, cwd=workdir)
        assert wait_for_port(port, 60, server), (workdir / "server.log").read_text()
        stack = Stack(port, token)
        for _ in range(50):  # handlers come up just after the port
            if stack.get("/api/status")[0] == 200:
                break
        yield stack
    finally:
        if server is not None:
            kill_group(server)


def test_cluster_endpoint_serves_the_status_document(stack: Stack) -> None:
    code, doc = stack.get("/api/notebookos/cluster")
    assert code == 200
    assert len(doc["hosts"]) == 4
    for host in doc["hosts"]:
        assert {"id", "address", "gpus", "subscription_ratio"} <= set(host)
        assert {"total", "committed", "pending"} <= set(host["gpus"])
        assert host["gpus"]["total"] == 2
        assert host["shared_gpus"] == []  # GPU sharing is off


@pytest.mark.parametrize("path", ["/api/notebookos/cluster", "/api/notebookos/kernels/x"])
def test_endpoints_need_jupyter_auth(stack: Stack, path: str) -> None:
    assert stack.get(path, token="")[0] == 403
    assert stack.get(path, token="wrong-token")[0] == 403


def test_kernel_endpoint_after_a_cell(stack: Stack) -> None:
    kernel = asyncio.run(start_kernel(stack.port, stack.token, "notebookos-2gpu"))
    results = asyncio.run(run_cells(stack.port, stack.token, kernel["id"], ["y = 6 * 7", "y"]))
    assert results[1]["outputs"][0]["data"]["text/plain"] == "42"

    code, entry = stack.get(f"/api/notebookos/kernels/{kernel['id']}")
    assert code == 200, entry
    assert entry["id"] == kernel["id"]
    assert len(entry["replicas"]) == 3
    for replica in entry["replicas"]:
        assert {"replica_id", "host_id", "pid", "state"} <= set(replica)
    assert len({r["host_id"] for r in entry["replicas"]}) == 3
    executor = next(r for r in entry["replicas"] if r["replica_id"] == entry["executor"])
    assert entry["last_cell_gpus"]["host_id"] == executor["host_id"]
    assert len(entry["last_cell_gpus"]["device_ids"]) == 2  # the 2-GPU kernelspec's request
    assert entry["last_interactivity_delay_ms"] is not None
    assert entry["shared_gpus"] == []

    code, err = stack.get("/api/notebookos/kernels/no-such-kernel")
    assert code == 404 and "no-such-kernel" in err["message"]


def test_a_refused_kernel_start_reaches_the_rest_client_with_its_reason(stack: Stack) -> None:
    # No host has 4 GPUs: the Global Scheduler refuses (RESOURCE_EXHAUSTED) and says why; Jupyter
    # Server passes that on, with what the user can do, instead of "Unhandled error".
    code, err = stack.post("/api/kernels", {"name": "notebookos-4gpu"})
    assert code == 503, err
    assert err["reason"] == "NotebookOS cluster has no room for this kernel"
    assert "RESOURCE_EXHAUSTED" in err["message"]
    assert "no host can hold the request" in err["message"]
    assert "What you can do: Shut down notebooks you no longer use" in err["message"]
    assert "traceback" not in err

    # What JupyterLab calls when it opens a notebook: the same message (Jupyter Server's sessions
    # handler answers any start failure with 500 and the exception's text).
    code, err = stack.post("/api/sessions", {"path": "refused.ipynb", "type": "notebook",
                                             "kernel": {"name": "notebookos-4gpu"}})
    assert code == 500, err
    assert "no host can hold the request" in err["message"]
    assert "What you can do" in err["message"]

    # Nothing is left behind: the refused kernels are not listed.
    code, kernels = stack.get("/api/kernels")
    assert code == 200
    assert not any(k["name"] == "notebookos-4gpu" for k in kernels)
