"""The server extension turns Nagle's algorithm off on kernel websockets (issue 5).

A real Jupyter Server runs in a subprocess with the environment's jupyter_server_config.d (which
enables ``notebookos.provisioner``). A probe extension, loaded next to it, reports TCP_NODELAY as
read from the server side of each open kernel websocket.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect

from notebookos.testing.processes import free_port, kill_group, wait_for_port

PROBE = textwrap.dedent('''
    import gc, json, socket
    from jupyter_server.base.handlers import JupyterHandler
    from jupyter_server.services.kernels.connection.base import BaseKernelWebsocketConnection

    class Probe(JupyterHandler):
        def get(self):
            found = []
            for obj in gc.get_objects():
                if isinstance(obj, BaseKernelWebsocketConnection) and obj.websocket_handler:
                    ws = obj.websocket_handler.ws_connection
                    if ws is None or ws.stream is None or ws.stream.closed():
                        continue
                    sock = ws.stream.socket
                    found.append({"class": type(obj).__name__,
                                  "nodelay": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)})
            self.finish(json.dumps(found))

    def _jupyter_server_extension_points():
        return [{"module": "nodelay_probe"}]

    def _load_jupyter_server_extension(app):
        app.web_app.add_handlers(".*$", [("/nodelay-probe", Probe)])
''')


def start_server(tmp_path: Path, extra: list[str]) -> tuple[subprocess.Popen, int, str]:
    (tmp_path / "nodelay_probe.py").write_text(PROBE)
    port, token = free_port(), uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               JUPYTER_CONFIG_DIR=str(tmp_path / "user-config"))
    cmd = [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root",
           "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={tmp_path}",
           "--ServerApp.jpserver_extensions=nodelay_probe=True", *extra]
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, cwd=tmp_path)
    if not wait_for_port(port, 60, proc):
        kill_group(proc)
        pytest.fail("jupyter server did not start:\n" + (tmp_path / "server.log").read_text())
    return proc, port, token


async def probe_open_websocket(port: int, token: str) -> list[dict]:
    http = AsyncHTTPClient()
    base = f"http://127.0.0.1:{port}"
    for _ in range(100):  # the port opens before the handlers are ready
        try:
            await http.fetch(f"{base}/api/status?token={token}")
            break
        except Exception:  # noqa: BLE001
            await asyncio.sleep(0.2)
    resp = await http.fetch(HTTPRequest(f"{base}/api/kernels?token={token}", method="POST",
                                        body=json.dumps({"name": "python3"}), request_timeout=60))
    kernel_id = json.loads(resp.body)["id"]
    ws = await websocket_connect(
        f"ws://127.0.0.1:{port}/api/kernels/{kernel_id}/channels?session_id=s&token={token}"
    )
    try:
        await asyncio.sleep(0.5)
        probe = await http.fetch(f"{base}/nodelay-probe?token={token}")
        return json.loads(probe.body)
    finally:
        ws.close()
        await http.fetch(HTTPRequest(f"{base}/api/kernels/{kernel_id}?token={token}",
                                     method="DELETE"), raise_error=False)


@pytest.mark.parametrize("stock", [False, True], ids=["notebookos", "user-configured-stock"])
def test_kernel_websocket_nodelay(tmp_path: Path, stock: bool) -> None:
    extra = []
    if stock:  # a class the user configured explicitly is left alone
        extra = ["--ServerApp.kernel_websocket_connection_class=jupyter_server.services.kernels."
                 "connection.channels.ZMQChannelsWebsocketConnection"]
    proc, port, token = start_server(tmp_path, extra)
    try:
        found = asyncio.run(probe_open_websocket(port, token))
    finally:
        kill_group(proc)
    log = (tmp_path / "server.log").read_text()
    assert "notebookos.provisioner | extension was successfully loaded" in log, log[-3000:]
    assert len(found) == 1, found
    if stock:
        assert found[0] == {"class": "ZMQChannelsWebsocketConnection", "nodelay": 0}
    else:
        assert found[0]["class"] == "NoDelayWebsocketConnection"
        assert found[0]["nodelay"] == 1
