"""An asyncio client of Jupyter Server, as JupyterLab uses it: REST for kernelspecs and sessions,
one kernel websocket per session (Jupyter's JSON websocket protocol), and the NotebookOS server
extension's endpoints. Built on tornado (Jupyter Server's own HTTP stack), so every session of a
replay shares one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from notebookos.replay.cells import parse_marker
from notebookos.replay.plan import kernelspec_request
from notebookos.resources import ResourceSpec

REST_TIMEOUT_S = 30.0
SESSION_START_TIMEOUT_S = 300.0


class ServerError(Exception):
    """Jupyter Server refused or failed a request; the message says which and why."""


@dataclass
class Execution:
    """What the client saw of one execute_request (times are ``time.time()`` on this machine)."""

    msg_id: str
    submitted: float
    execute_input: float | None = None
    busy: float | None = None
    reply_at: float | None = None
    idle: float | None = None
    reply: dict[str, Any] | None = None
    reply_metadata: dict[str, Any] = field(default_factory=dict)
    marker: dict[str, Any] | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    stderr: str = ""
    lost: str = ""  # set when the channel closed before the reply
    # execute_input messages seen: more than one means the cell's code started more than once
    # (e.g. resubmitted after its kernel was rebuilt), which at-most-once forbids.
    starts: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # reply, idle and marker in

    def _check(self) -> None:
        if self.reply is not None or self.lost:
            self.done.set()
        if self.lost or (self.reply is not None and self.idle is not None):
            self.settled.set()


class KernelChannel:
    """One websocket to one kernel; a reader task files every message under its request."""

    def __init__(self, conn: WebSocketClientConnection, kernel_id: str, session: str) -> None:
        self.conn = conn
        self.kernel_id = kernel_id
        self.session = session
        self.pending: dict[str, Execution] = {}
        self.closed_reason = ""
        self.statuses: list[tuple[float, str]] = []  # kernel-level status without a parent
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        reason = "the kernel websocket closed"
        try:
            while True:
                raw = await self.conn.read_message()
                if raw is None:
                    reason = f"the kernel websocket closed (code {self.conn.close_code})"
                    break
                if isinstance(raw, bytes):
                    continue  # binary frames carry buffers; cells here send none
                self._dispatch(json.loads(raw), time.time())
        except asyncio.CancelledError:
            reason = "the replay closed the kernel websocket"
            raise
        except Exception as exc:  # noqa: BLE001 - any failure ends the channel with its reason
            reason = f"the kernel websocket failed: {exc!r}"
        finally:
            self.closed_reason = self.closed_reason or reason
            for execution in self.pending.values():
                if execution.reply is None and not execution.lost:
                    execution.lost = self.closed_reason
                execution.settled.set()
                execution._check()

    def _dispatch(self, msg: dict[str, Any], now: float) -> None:
        kind = msg.get("header", {}).get("msg_type", "")
        parent = (msg.get("parent_header") or {}).get("msg_id", "")
        content = msg.get("content") or {}
        execution = self.pending.get(parent)
        if execution is None:
            if kind == "status":
                state = content.get("execution_state", "")
                self.statuses.append((now, state))
                if state in ("dead", "restarting"):
                    self._lose_pending(f"the kernel is {state} (Jupyter Server said so)")
            return
        if kind == "execute_input":
            execution.execute_input = execution.execute_input or now
            execution.starts += 1
        elif kind == "status":
            state = content.get("execution_state")
            if state == "busy":
                execution.busy = execution.busy or now
            elif state == "idle" and execution.reply is not None:
                execution.idle = now
        elif kind == "stream":
            text = content.get("text", "")
            marker = parse_marker(text)
            if marker is not None:
                execution.marker = marker
            elif content.get("name") == "stderr":
                execution.stderr = (execution.stderr + text)[-4000:]
        elif kind == "error":
            execution.errors.append(content)
        elif kind == "execute_reply" and msg.get("channel", "shell") == "shell":
            execution.reply = content
            execution.reply_at = now
            execution.reply_metadata = msg.get("metadata") or {}
        execution._check()

    def _lose_pending(self, reason: str) -> None:
        for execution in self.pending.values():
            if execution.reply is None and not execution.lost:
                execution.lost = reason
                execution.settled.set()
                execution._check()

    async def execute(self, code: str) -> Execution:
        msg_id = uuid.uuid4().hex
        message = {
            "header": {"msg_id": msg_id, "username": "replay", "session": self.session,
                       "msg_type": "execute_request", "version": "5.3",
                       "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": False},
        }
        execution = Execution(msg_id, time.time())
        self.pending[msg_id] = execution
        if self.closed_reason:
            execution.lost = self.closed_reason
            execution._check()
            return execution
        try:
            await self.conn.write_message(json.dumps(message))
        except Exception as exc:  # noqa: BLE001 - a closed socket fails the request, with why
            execution.lost = f"sending the cell failed: {exc!r}"
            execution._check()
        return execution

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()
        self._reader.cancel()
        with contextlib.suppress(BaseException):
            await self._reader


class JupyterServer:
    def __init__(self, url: str, token: str = "") -> None:
        parts = urlsplit(url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"--url {url!r}: expected http(s)://host:port[/base]")
        self.base = f"{parts.scheme}://{parts.netloc}{parts.path}"
        self.ws_base = ("wss" if parts.scheme == "https" else "ws") + self.base[len(parts.scheme):]
        self.token = token
        self.http = AsyncHTTPClient()

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"} if self.token else {}

    async def request(self, method: str, path: str, body: Any = None,
                      timeout: float = REST_TIMEOUT_S) -> Any:
        request = HTTPRequest(
            f"{self.base}{path}", method=method, headers=self._headers(),
            body=None if body is None and method in ("GET", "DELETE") else json.dumps(body or {}),
            request_timeout=timeout, connect_timeout=min(timeout, 10.0))
        try:
            response = await self.http.fetch(request)
        except HTTPClientError as exc:
            detail = ""
            if exc.response is not None and exc.response.body:
                try:
                    doc = json.loads(exc.response.body)
                    detail = doc.get("message") or doc.get("reason") or ""
                except (ValueError, AttributeError):
                    detail = exc.response.body[:300].decode(errors="replace")
            raise ServerError(f"{method} {path}: HTTP {exc.code}"
                              + (f": {detail}" if detail else "")) from None
        except (TimeoutError, OSError) as exc:
            raise ServerError(f"{method} {path}: {exc!r}") from None
        return json.loads(response.body) if response.body else None

    async def notebookos_kernelspecs(self) -> dict[str, ResourceSpec]:
        """The server's NotebookOS kernelspecs: name -> what each asks for (GPUs per cell)."""
        doc = await self.request("GET", "/api/kernelspecs")
        found = {}
        for name, spec in (doc.get("kernelspecs") or {}).items():
            meta = ((spec.get("spec") or {}).get("metadata") or {}).get("kernel_provisioner") or {}
            if meta.get("provisioner_name") == "notebookos-provisioner":
                config = meta.get("config") or {}
                found[name] = kernelspec_request(int(config.get("gpus", 1)), config)
        return found

    async def start_session(self, path: str, kernel_name: str) -> tuple[str, str]:
        """POST /api/sessions as JupyterLab does when a notebook opens: (session id, kernel id)."""
        doc = await self.request("POST", "/api/sessions", {
            "path": path, "name": path.rsplit("/", 1)[-1], "type": "notebook",
            "kernel": {"name": kernel_name}}, timeout=SESSION_START_TIMEOUT_S)
        return doc["id"], doc["kernel"]["id"]

    async def stop_session(self, session_id: str) -> None:
        await self.request("DELETE", f"/api/sessions/{quote(session_id)}")

    async def kernel_alive(self, kernel_id: str) -> bool:
        try:
            doc = await self.request("GET", f"/api/kernels/{quote(kernel_id)}")
        except ServerError:
            return False
        return doc.get("execution_state") not in ("dead",)

    async def notebookos_kernel(self, kernel_id: str) -> dict[str, Any] | None:
        """The extension's view of the kernel (replicas, hosts, executor, last cell's GPUs)."""
        try:
            return await self.request("GET", f"/api/notebookos/kernels/{quote(kernel_id)}",
                                      timeout=10.0)
        except ServerError:
            return None

    async def notebookos_cluster(self) -> dict[str, Any] | None:
        try:
            return await self.request("GET", "/api/notebookos/cluster", timeout=10.0)
        except ServerError:
            return None

    async def connect(self, kernel_id: str) -> KernelChannel:
        session = uuid.uuid4().hex
        query = {"session_id": session}
        if self.token:
            query["token"] = self.token
        url = f"{self.ws_base}/api/kernels/{quote(kernel_id)}/channels?{urlencode(query)}"
        try:
            conn = await websocket_connect(HTTPRequest(url, headers=self._headers(),
                                                       connect_timeout=30.0, request_timeout=30.0),
                                           max_message_size=64 << 20)
        except (TimeoutError, HTTPClientError, OSError) as exc:
            raise ServerError(f"kernel {kernel_id}: websocket: {exc!r}") from None
        return KernelChannel(conn, kernel_id, session)
