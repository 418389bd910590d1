"""The server extension while `notebookos up` restarts the Global Scheduler: a real Jupyter
Server whose Global Scheduler does not answer (nothing listens on its port) and whose state
directory holds the supervisor's state file. The endpoints the JupyterLab status item and panel
read say that the scheduler is restarting and when it is tried again."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from notebookos.ports import free_ports
from notebookos.testing.processes import kill_group, wait_for_port
from notebookos.testing.supervisor_state import write_state

pytestmark = pytest.mark.timeout(120)


def get(port: int, token: str, path: str) -> tuple[int, dict, dict]:
    async def fetch() -> tuple[int, dict, dict]:
        url = f"http://127.0.0.1:{port}{path}?token={token}"
        try:
            resp = await AsyncHTTPClient().fetch(url, request_timeout=60)
        except HTTPClientError as err:
            assert err.response is not None, err
            resp = err.response
        return resp.code, json.loads(resp.body), dict(resp.headers)

    return asyncio.run(fetch())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str, Path, str]]:
    workdir = tmp_path_factory.mktemp("ext-sup")
    port, gs_port = free_ports(2)
    token = uuid.uuid4().hex
    env = {**os.environ, "NOTEBOOKOS_CLUSTER_STATE_DIR": str(workdir / "state"),
           "NOTEBOOKOS_GLOBAL_SCHEDULER_HOST": "127.0.0.1",
           "NOTEBOOKOS_GLOBAL_SCHEDULER_GRPC_PORT": str(gs_port),
           "JUPYTER_CONFIG_DIR": str(workdir)}
    with open(workdir / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root",
             "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}",
             f"--ServerApp.root_dir={workdir}"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=workdir)
    try:
        assert wait_for_port(port, 60, proc), (workdir / "server.log").read_text()
        yield port, token, workdir / "state", f"127.0.0.1:{gs_port}"
    finally:
        kill_group(proc)


def test_the_cluster_endpoint_says_the_scheduler_is_restarting(
        server: tuple[int, str, Path, str]) -> None:
    port, token, state_dir, address = server
    write_state(state_dir, address, retry_in_s=8.0)
    code, body, headers = get(port, token, "/api/notebookos/cluster")
    assert code == 503, body
    assert body["message"].startswith("the NotebookOS scheduler is restarting, retry in "), body
    assert "(attempt 4; last exit: killed by SIGKILL after 3.1 s)" in body["message"]
    assert body["scheduler"]["state"] == "restarting" and body["scheduler"]["attempt"] == 4
    assert 3 <= body["scheduler"]["retry_in_s"] <= 8
    assert 3 <= int(headers["Retry-After"]) <= 8
    assert [d["name"] for d in body["supervisor"]["daemons"]] == [
        "global-scheduler", "local-scheduler-0", "jupyterlab"]

    code, body, _ = get(port, token, "/api/notebookos/kernels/some-kernel")
    assert code == 503 and "scheduler is restarting" in body["message"], body

    code, body, _ = get(port, token, "/api/notebookos/supervisor")
    assert code == 200
    gs = body["supervisor"]["daemons"][0]
    assert gs["description"].startswith("global-scheduler: restarting, attempt 4, next try in ")


def test_without_a_supervisor_the_503_is_as_before(server: tuple[int, str, Path, str]) -> None:
    port, token, state_dir, address = server
    (state_dir / "run" / "supervisor.json").unlink(missing_ok=True)
    code, body, headers = get(port, token, "/api/notebookos/cluster")
    assert code == 503
    assert body == {"message": f"the NotebookOS Global Scheduler at {address} is not "
                               "reachable: UNAVAILABLE"}
    assert "Retry-After" not in headers
    assert get(port, token, "/api/notebookos/supervisor")[:2] == (200, {"supervisor": None})
