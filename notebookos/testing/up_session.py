"""A local cluster as ``notebookos up`` runs it, and a notebook driven over Jupyter Server's
kernel websocket the way JupyterLab drives it: shared by the fault campaign
(benchmarks/chaos.py) and the tests that kill daemons under a notebook."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
from jupyter_server.services.kernels.connection.base import (
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect

from notebookos.ports import free_ports
from notebookos.proto import common_pb2, global_scheduler_pb2
from notebookos.proto import global_scheduler_pb2_grpc as gs_grpc
from notebookos.security import child_environment, secure_channel
from notebookos.supervisor import MARKER_VAR, marked_processes
from notebookos.testing.credentials import state_dir_config

CELL_TIMEOUT_S = 300.0
WS_PROTOCOL = "v1.kernel.websocket.jupyter.org"

# -- the cluster, as `notebookos up` runs it ---------------------------------------------------

class UpCluster:
    """``notebookos up`` in a new session; its output is kept in ``up.log``."""

    def __init__(self, workdir: Path, hosts: int, gpus_per_host: int = 2) -> None:
        self.workdir = workdir
        self.hosts = hosts
        self.port, self.gs_port = free_ports(2)
        self.lines: list[str] = []
        self.token = ""
        self._log = open(workdir / "up.log", "w")  # noqa: SIM115 - closed in stop()
        self.security = state_dir_config(workdir / "state")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "notebookos.cli", "up", "--no-browser", "--hosts", str(hosts),
             "--gpus-per-host", str(gpus_per_host), "--port", str(self.port),
             "--scheduler-port", str(self.gs_port), "--state-dir", str(workdir / "state")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            cwd=workdir, env={**os.environ, **child_environment(self.security)})
        threading.Thread(target=self._read, daemon=True).start()
        # the credentials `notebookos up` finds in its state directory (made here, first)
        self.channel = secure_channel(self.security, f"127.0.0.1:{self.gs_port}")
        self.stub = gs_grpc.GlobalSchedulerStub(self.channel)
        self.stopped_pids: list[int] = []
        self._stopped = False

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, ""):
            self.lines.append(line)
            self._log.write(line)
            self._log.flush()

    def wait_up(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(r"NotebookOS is up: \S+token=(\w+)", "".join(self.lines))
            if match:
                self.token = match.group(1)
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError("notebookos up did not come up:\n" + "".join(self.lines[-40:]))

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def restarts(self) -> int:
        return sum("notebookos up: restarted" in line for line in self.lines)

    # -- processes ----------------------------------------------------------------------------

    def _child(self, *words: str, wait_s: float = 30.0, recursive: bool = False) -> psutil.Process:
        """The child of ``notebookos up`` whose command line has ``words``; one that is being
        restarted (up's backoff after a kill) is waited for up to ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while True:
            for child in psutil.Process(self.proc.pid).children(recursive=recursive):
                with contextlib.suppress(psutil.Error):
                    argv = child.cmdline()
                    if all(w in argv for w in words):
                        return child
            if time.monotonic() >= deadline:
                raise LookupError(f"no child of notebookos up runs with {words}")
            time.sleep(0.1)

    def global_scheduler(self) -> psutil.Process:
        return self._child("global-scheduler")

    def local_scheduler(self, host_id: str) -> psutil.Process:
        """The host's Local Scheduler: a child of ``notebookos up``, or one the Global
        Scheduler's autoscaler started (``auto-...``, the scheduler's child)."""
        return self._child("local-scheduler", "--host-id", host_id,
                           recursive=host_id.startswith("auto-"))

    def host_processes(self, host_id: str) -> list[psutil.Process]:
        ls = self.local_scheduler(host_id)
        return [ls, *ls.children(recursive=True)]

    # -- the Global Scheduler's view ----------------------------------------------------------

    def kernel(self, kernel_id: str) -> common_pb2.KernelStatus | None:
        try:
            return self.stub.GetKernelStatus(
                global_scheduler_pb2.GetKernelStatusRequest(kernel_id=kernel_id), timeout=3)
        except grpc.RpcError:
            return None

    def host_count(self) -> int:
        hosts = self.host_ids()
        return -1 if hosts is None else len(hosts)

    def host_ids(self) -> set[str] | None:
        """The hosts registered with the Global Scheduler (None: it does not answer)."""
        try:
            status = self.stub.GetClusterStatus(global_scheduler_pb2.GetClusterStatusRequest(),
                                                timeout=3)
        except grpc.RpcError:
            return None
        return {h.host_id for h in status.hosts}

    def whole(self, kernel_id: str) -> bool:
        """Full redundancy: three live replicas on distinct hosts, the kernel idle, every host of
        ``notebookos up`` registered (and any the autoscaler added while one was lost)."""
        status = self.kernel(kernel_id)
        if status is None or status.state != common_pb2.KERNEL_STATE_IDLE:
            return False
        pids = [r.pid for r in status.replicas]
        if len(pids) != 3 or len({r.host_id for r in status.replicas}) != 3:
            return False
        if not all(p > 0 and psutil.pid_exists(p) and _running(p) for p in pids):
            return False
        registered = self.host_ids()
        return registered is not None and {f"host-{i}" for i in range(self.hosts)} <= registered

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        marker = _marker_of(self.proc.pid)
        for pid in self.stopped_pids:  # a hung host must not outlive the campaign
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if marker:
            for pid in marked_processes(marker):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.channel.close()
        self._log.close()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _marker_of(pid: int) -> str | None:
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(pid).children():
            with contextlib.suppress(psutil.Error):
                value = child.environ().get(MARKER_VAR)
                if value:
                    return value
    return None


# -- the notebook, as JupyterLab drives it -----------------------------------------------------

@dataclass
class CellResult:
    status: str  # ok, error, timeout
    execution_count: int | None
    stdout: str
    stderr: str
    error: str
    seconds: float


class Notebook:
    """A notebook session over Jupyter Server's REST API and kernel websocket (v1 protocol)."""

    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.token = token
        self.kernel_id = ""
        self.client_id = uuid.uuid4().hex
        self.ws = None
        self.reconnects = 0

    async def open(self) -> None:
        body = {"path": "chaos.ipynb", "type": "notebook", "name": "chaos.ipynb",
                "kernel": {"name": "notebookos"}}
        resp = await AsyncHTTPClient().fetch(HTTPRequest(
            f"{self.base}/api/sessions", method="POST", body=json.dumps(body),
            headers={"Authorization": f"token {self.token}"}, request_timeout=300))
        self.kernel_id = json.loads(resp.body)["kernel"]["id"]
        await self._connect()

    async def _connect(self) -> None:
        url = self.base.replace("http", "ws", 1)
        self.ws = await websocket_connect(HTTPRequest(
            f"{url}/api/kernels/{self.kernel_id}/channels?session_id={self.client_id}",
            headers={"Authorization": f"token {self.token}"}), subprotocols=[WS_PROTOCOL])
        await self._request("kernel_info_request", {}, timeout=120)

    def _send(self, msg_type: str, content: dict, channel: str = "shell") -> str:
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "username": "chaos", "session": self.client_id,
                  "msg_type": msg_type, "version": "5.3",
                  "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        parts = [json.dumps(p).encode() for p in (header, {}, {}, content)]
        self.ws.write_message(serialize_msg_to_ws_v1(parts, channel), binary=True)
        return msg_id

    async def _messages(self, deadline: float):  # noqa: ANN202 - an async iterator of dicts
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            raw = await asyncio.wait_for(self.ws.read_message(), left)
            if raw is None:
                raise ConnectionError("the kernel websocket closed")
            channel, parts = deserialize_msg_from_ws_v1(raw)
            yield channel, {"header": json.loads(parts[0]), "parent_header": json.loads(parts[1]),
                            "content": json.loads(parts[3])}

    async def _request(self, msg_type: str, content: dict, timeout: float) -> dict:
        msg_id = self._send(msg_type, content)
        async for _, msg in self._messages(time.monotonic() + timeout):
            if msg["parent_header"].get("msg_id") == msg_id \
                    and msg["header"]["msg_type"] == msg_type.replace("_request", "_reply"):
                return msg["content"]
        raise AssertionError("unreachable")

    async def execute(self, code: str, timeout: float = CELL_TIMEOUT_S) -> CellResult:
        t0 = time.monotonic()
        deadline = t0 + timeout
        for attempt in range(2):
            try:
                return await self._execute(code, t0, deadline)
            except ConnectionError:  # JupyterLab reconnects its websocket too
                if attempt:
                    raise
                self.reconnects += 1
                await self._connect()
        raise AssertionError("unreachable")

    async def _execute(self, code: str, t0: float, deadline: float) -> CellResult:
        return await self.result(self.send_execute(code), t0, deadline)

    def send_execute(self, code: str) -> str:
        """Send a cell without waiting for it; its msg_id."""
        return self._send("execute_request", {
            "code": code, "silent": False, "store_history": True, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": True})

    async def result(self, msg_id: str, t0: float, deadline: float) -> CellResult:
        """What the cell sent as ``msg_id`` printed and replied (its reply and idle seen)."""
        out, err, reply, idle = [], [], None, False
        try:
            async for channel, msg in self._messages(deadline):
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["header"]["msg_type"], msg["content"]
                if kind == "stream":
                    (out if content["name"] == "stdout" else err).append(content["text"])
                elif kind == "error":
                    err.append(f"{content['ename']}: {content['evalue']}")
                elif kind == "status" and content["execution_state"] == "idle":
                    idle = True
                elif channel == "shell" and kind == "execute_reply":
                    reply = content
                if reply is not None and idle:
                    break
        except TimeoutError:
            return CellResult("timeout", None, "".join(out), "".join(err),
                              f"no reply within {deadline - t0:.0f} s", time.monotonic() - t0)
        error = "" if reply["status"] == "ok" else \
            f"{reply.get('ename', '?')}: {reply.get('evalue', '')}"
        return CellResult(reply["status"], reply.get("execution_count"), "".join(out),
                          "".join(err), error, time.monotonic() - t0)

    async def replies_to(self, msg_id: str, seconds: float) -> int:
        """How many execute_replies to ``msg_id`` come in the next ``seconds``."""
        count = 0
        with contextlib.suppress(TimeoutError):
            async for channel, msg in self._messages(time.monotonic() + seconds):
                count += (channel == "shell" and msg["header"]["msg_type"] == "execute_reply"
                          and msg["parent_header"].get("msg_id") == msg_id)
        return count

    async def close(self) -> None:
        if self.ws is not None:
            self.ws.close()
        with contextlib.suppress(Exception):
            await AsyncHTTPClient().fetch(HTTPRequest(
                f"{self.base}/api/kernels/{self.kernel_id}", method="DELETE",
                headers={"Authorization": f"token {self.token}"}, request_timeout=60))
