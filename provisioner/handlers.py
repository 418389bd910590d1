"""REST endpoints of the NotebookOS server extension, under Jupyter Server's own auth.

- ``GET /api/notebookos/cluster``: the status document of ``notebookos status --json``.
- ``GET /api/notebookos/kernels/<kernel_id>``: that kernel's entry of the status document (keys
  ``id``, ``replicas`` with ``replica_id``/``host_id``/``pid``/``state``, ``executor``) plus
  ``last_cell_gpus`` (device ids bound during the last cell, with the host) and
  ``last_interactivity_delay_ms``; with the status document's ``gpu_hours_used`` (GPU-hours the
  kernel's cells held) and ``gpu_hours_reserved`` (what reserving its GPUs since it started would
  have held).

- ``POST /api/notebookos/kernels/<kernel_id>/wake``: wake a hibernated kernel (``{"waking": ...}``).
- ``GET /api/notebookos/supervisor``: what ``notebookos up`` says of its daemons (its state file,
  as ``notebookos status --json`` shows it under ``supervisor``): ``{"supervisor": {"daemons":
  [{"name", "state", "attempt", "retry_in_s", "description", ...}], ...}}``, or
  ``{"supervisor": null}`` where no ``notebookos up`` runs this cluster.

Errors are JSON ``{"message": ...}``: 404 for an unknown kernel, 503 when the Global Scheduler
cannot be reached. While ``notebookos up`` is restarting the Global Scheduler, that 503 says so
("the NotebookOS scheduler is restarting, retry in 8 s (attempt 4) ..."), carries ``scheduler``
(``state``, ``attempt``, ``retry_in_s``) and ``supervisor``, and a ``Retry-After`` header.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
from jupyter_server.base.handlers import APIHandler
from tornado import web

from notebookos.commands.status_cmd import status_document, supervisor_document
from notebookos.config import load_config
from notebookos.proto import global_scheduler_pb2, global_scheduler_pb2_grpc
from notebookos.provisioner.provisioner import shared_global_scheduler_channel

RPC_TIMEOUT_S = 5.0
SCHEDULER = "global-scheduler"  # the supervisor's name for the Global Scheduler


class SchedulerUnavailable(web.HTTPError):
    """503 with what the supervisor says about the Global Scheduler, when it says anything."""

    def __init__(self, message: str, extra: dict[str, Any] | None = None) -> None:
        super().__init__(503, message)
        self.extra = extra or {}


def global_scheduler_address() -> str:
    gs = load_config().global_scheduler
    return f"{gs.host}:{gs.grpc_port}"


class NotebookOSHandler(APIHandler):
    def initialize(self, address: str | None = None) -> None:
        self.address = address or global_scheduler_address()

    def stub(self) -> global_scheduler_pb2_grpc.GlobalSchedulerStub:
        try:
            channel = shared_global_scheduler_channel(self.address)
        except RuntimeError as exc:
            raise web.HTTPError(503, str(exc)) from None
        return global_scheduler_pb2_grpc.GlobalSchedulerStub(channel)

    async def cluster_status(self, kernel_id: str = "") -> global_scheduler_pb2.ClusterStatus:
        """The cluster's status; with ``kernel_id``, its kernels hold that kernel only (what the
        extension asks after every cell: it costs the scheduler O(hosts), not O(kernels))."""
        stub = self.stub()
        try:
            return await stub.GetClusterStatus(
                global_scheduler_pb2.GetClusterStatusRequest(kernel_id=kernel_id),
                timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise self.unreachable(exc.code().name) from None

    def unreachable(self, code: str) -> SchedulerUnavailable:
        """The 503 for a Global Scheduler that did not answer, with the supervisor's word on it
        (restarting, when it retries) where ``notebookos up`` runs this cluster."""
        message = f"the NotebookOS Global Scheduler at {self.address} is not reachable: {code}"
        supervisor = supervisor_document(load_config().state_path, self.address)
        entry = next((d for d in (supervisor or {}).get("daemons", [])
                      if d.get("name") == SCHEDULER), None)
        if supervisor is None or entry is None:
            return SchedulerUnavailable(message)
        scheduler = {"state": entry["state"], "attempt": entry.get("attempt", 0),
                     "retry_in_s": entry.get("retry_in_s"),
                     "last_exit": entry.get("last_exit", "")}
        if entry["state"] == "restarting":
            message = (f"the NotebookOS scheduler is restarting, retry in "
                       f"{entry['retry_in_s']:.0f} s (attempt {scheduler['attempt']}; last exit: "
                       f"{scheduler['last_exit'] or '?'}); {message}")
        elif entry["state"] == "starting":
            message = f"the NotebookOS scheduler is starting again; {message}"
        return SchedulerUnavailable(message, {"scheduler": scheduler, "supervisor": supervisor})

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        reason = kwargs.get("exc_info", (None, None))[1]
        message = getattr(reason, "log_message", None) or self._reason
        extra = getattr(reason, "extra", {})
        retry = extra.get("scheduler", {}).get("retry_in_s")
        if retry is not None:
            self.set_header("Retry-After", str(max(1, round(retry))))
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": message, **extra}))


class ClusterHandler(NotebookOSHandler):
    @web.authenticated
    async def get(self) -> None:
        self.finish(json.dumps(status_document(await self.cluster_status(),
                                               load_config().security.metrics_tls)))


class KernelHandler(NotebookOSHandler):
    @web.authenticated
    async def get(self, kernel_id: str) -> None:
        status = await self.cluster_status(kernel_id)
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
            answer = await self.stub().WakeKernel(
                global_scheduler_pb2.WakeKernelRequest(kernel_id=kernel_id),
                timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise web.HTTPError(404, f"NotebookOS knows no kernel {kernel_id!r}") from None
            raise self.unreachable(exc.code().name) from None
        self.finish(json.dumps({"waking": answer.waking}))


class SupervisorHandler(NotebookOSHandler):
    @web.authenticated
    async def get(self) -> None:
        self.finish(json.dumps({"supervisor": supervisor_document(load_config().state_path,
                                                                   self.address)}))


def handlers(base_url: str) -> list[tuple[str, type, dict[str, Any]]]:
    from jupyter_server.utils import url_path_join

    return [
        (url_path_join(base_url, "api", "notebookos", "cluster"), ClusterHandler, {}),
        (url_path_join(base_url, "api", "notebookos", "kernels", r"([^/]+)"), KernelHandler, {}),
        (url_path_join(base_url, "api", "notebookos", "kernels", r"([^/]+)", "wake"),
         WakeHandler, {}),
        (url_path_join(base_url, "api", "notebookos", "supervisor"), SupervisorHandler, {}),
    ]
