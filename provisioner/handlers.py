"""REST endpoints of the NotebookOS server extension, under Jupyter Server's own auth.

- ``GET /api/notebookos/cluster``: the status document of ``notebookos status --json``.
- ``GET /api/notebookos/kernels/<kernel_id>``: that kernel's entry of the status document (keys
  ``id``, ``replicas`` with ``replica_id``/``host_id``/``pid``/``state``, ``executor``) plus
  ``last_cell_gpus`` (device ids bound during the last cell, with the host) and
  ``last_interactivity_delay_ms``.

- ``POST /api/notebookos/kernels/<kernel_id>/wake``: wake a hibernated kernel (``{"waking": ...}``).

Errors are JSON ``{"message": ...}``: 404 for an unknown kernel, 503 when the Global Scheduler
cannot be reached.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
from jupyter_server.base.handlers import APIHandler
from tornado import web

from notebookos.commands.status_cmd import status_document
from notebookos.config import load_config
from notebookos.proto import global_scheduler_pb2, global_scheduler_pb2_grpc
from notebookos.provisioner.provisioner import shared_global_scheduler_channel

RPC_TIMEOUT_S = 5.0


def global_scheduler_address() -> str:
    gs = load_config().global_scheduler
    return f"{gs.host}:{gs.grpc_port}"


class NotebookOSHandler(APIHandler):
    def initialize(self, address: str | None = None) -> None:
        self.address = address or global_scheduler_address()

    async def cluster_status(self) -> global_scheduler_pb2.ClusterStatus:
        try:
            channel = shared_global_scheduler_channel(self.address)
        except RuntimeError as exc:
            raise web.HTTPError(503, str(exc)) from None
        stub = global_scheduler_pb2_grpc.GlobalSchedulerStub(channel)
        try:
            return await stub.GetClusterStatus(
                global_scheduler_pb2.GetClusterStatusRequest(), timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise web.HTTPError(
                503, f"the NotebookOS Global Scheduler at {self.address} is not reachable: "
                     f"{exc.code().name}") from None

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        reason = kwargs.get("exc_info", (None, None))[1]
        message = getattr(reason, "log_message", None) or self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": message}))


class ClusterHandler(NotebookOSHandler):
    @web.authenticated
    async def get(self) -> None:
        self.finish(json.dumps(status_document(await self.cluster_status(),
                                               load_config().security.metrics_tls)))


class KernelHandler(NotebookOSHandler):
    @web.authenticated
    async def get(self, kernel_id: str) -> None:
        status = await self.cluster_status()
        doc = status_document(status)
        entry = next((k for k in doc["kernels"] if k["id"] == kernel_id), None)
        raw = next((k for k in status.kernels if k.kernel_id == kernel_id), None)
        if entry is None or raw is None:
            raise web.HTTPError(404, f"NotebookOS knows no kernel {kernel_id!r}")
        last = next((r for r in raw.replicas if r.executor), None)
        entry["last_cell_gpus"] = (
            {"host_id": last.host_id, "device_ids": list(last.last_cell_gpu_device_ids)}
            if last is not None else None
        )
        entry["last_interactivity_delay_ms"] = (
            round(last.last_interactivity_delay_ms, 3) if last is not None else None
        )
        # GPU sharing: the devices a replica of this kernel shares with another kernel now
        entry["shared_gpus"] = [
            {"host_id": h["id"], "device_id": g["device_id"], "replicas": g["replicas"]}
            for h in doc["hosts"] for g in h.get("shared_gpus", [])
            if any(r.rpartition("/")[0] == kernel_id for r in g["replicas"])]
        self.finish(json.dumps(entry))


class WakeHandler(NotebookOSHandler):
    """``POST /api/notebookos/kernels/<kernel_id>/wake``: wake a hibernated kernel ahead of its
    next cell (a user coming back; the JupyterLab panel's button). ``{"waking": bool}``: false
    when it was not hibernated."""

    @web.authenticated
    async def post(self, kernel_id: str) -> None:
        try:
            channel = shared_global_scheduler_channel(self.address)
        except RuntimeError as exc:
            raise web.HTTPError(503, str(exc)) from None
        stub = global_scheduler_pb2_grpc.GlobalSchedulerStub(channel)
        try:
            answer = await stub.WakeKernel(
                global_scheduler_pb2.WakeKernelRequest(kernel_id=kernel_id),
                timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise web.HTTPError(404, f"NotebookOS knows no kernel {kernel_id!r}") from None
            raise web.HTTPError(
                503, f"the NotebookOS Global Scheduler at {self.address} is not reachable: "
                     f"{exc.code().name}") from None
        self.finish(json.dumps({"waking": answer.waking}))


def handlers(base_url: str) -> list[tuple[str, type, dict[str, Any]]]:
    from jupyter_server.utils import url_path_join

    return [
        (url_path_join(base_url, "api", "notebookos", "cluster"), ClusterHandler, {}),
        (url_path_join(base_url, "api", "notebookos", "kernels", r"([^/]+)"), KernelHandler, {}),
        (url_path_join(base_url, "api", "notebookos", "kernels", r"([^/]+)", "wake"),
         WakeHandler, {}),
    ]
