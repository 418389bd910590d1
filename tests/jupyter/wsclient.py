"""A minimal Jupyter Server client for the tests: REST kernel start and cells over the websocket."""

from __future__ import annotations

import asyncio
import json
import uuid

from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect


def execute_request(code: str, session: str) -> tuple[str, str]:
    msg_id = uuid.uuid4().hex
    return msg_id, json.dumps({
        "header": {"msg_id": msg_id, "username": "test", "session": session,
                   "msg_type": "execute_request", "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": True,
                    "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
    })


async def start_kernel(port: int, token: str, name: str | None = None) -> dict:
    body = {} if name is None else {"name": name}
    resp = await AsyncHTTPClient().fetch(HTTPRequest(
        f"http://127.0.0.1:{port}/api/kernels?token={token}", method="POST",
        body=json.dumps(body), request_timeout=180))
    return json.loads(resp.body)


async def run_cells(port: int, token: str, kernel_id: str, cells: list[str]) -> list[dict]:
    """Run cells one after another; each result has reply, outputs and the status sequence."""
    ws = await websocket_connect(
        f"ws://127.0.0.1:{port}/api/kernels/{kernel_id}/channels?session_id=t&token={token}")
    results = []
    try:
        for code in cells:
            msg_id, payload = execute_request(code, "t")
            await ws.write_message(payload)
            outputs, reply, states = [], None, []
            while not (reply and states and states[-1] == "idle"):
                msg = json.loads(await asyncio.wait_for(ws.read_message(), 120))
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind = msg["header"]["msg_type"]
                if kind == "status":
                    states.append(msg["content"]["execution_state"])
                elif kind in ("stream", "execute_result", "error"):
                    outputs.append(msg["content"])
                elif kind == "execute_reply":
                    reply = msg["content"]
            results.append({"reply": reply, "outputs": outputs, "states": states})
    finally:
        ws.close()
    return results
