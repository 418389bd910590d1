"""``NotebookOSProvisioner``: a jupyter_client KernelProvisioner for distributed kernels.

Registered as ``notebookos-provisioner`` in the ``jupyter_client.kernel_provisioners`` entry-point
group and selected by the ``notebookos`` kernelspecs. It launches nothing itself: it asks the
Global Scheduler (gRPC ``StartKernel``) to start a distributed kernel and hands Jupyter Server the
connection info of the kernel's front, which the Global Scheduler binds.

What Jupyter Server sees as "the kernel process":

- ``poll()`` reports the kernel alive while a Raft majority of its replicas is alive, so
  jupyter_client's restarter never wipes a kernel that lost one replica (the Global Scheduler
  replaces that replica behind the front).
- Interrupts go as ``interrupt_request`` messages (kernelspec ``interrupt_mode: message``);
  ``send_signal(SIGINT)`` also works and calls ``InterruptKernel``.
- ``terminate`` / ``kill`` / ``cleanup`` stop every replica (``StopKernel``). On restart the
  kernel's state is deliberately not kept, but its front is: ``launch_kernel`` asks for
  ``RestartKernel`` (fresh replicas behind the same ports), so that the clients' sockets, and
  Jupyter Server's open websockets, reach the new replicas. jupyter_client#1061 drops
  ``restart=True`` on the way to ``terminate``, so the flag is cached from
  ``shutdown_requested``.
- ``get_provisioner_info`` / ``load_provisioner_info`` persist the Global Scheduler address and
  kernel id, so a restarted Jupyter Server re-attaches to running kernels.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import signal
import weakref
from typing import TYPE_CHECKING, Any

import grpc
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from traitlets import Float, Integer, Unicode

from notebookos.kernel_hints import KernelHints
from notebookos.proto import common_pb2, global_scheduler_pb2, global_scheduler_pb2_grpc
from notebookos.proto.convert import connection_info_to_dict, resource_spec_to_proto
from notebookos.provisioner.errors import start_refused
from notebookos.resources import ResourceSpec

if TYPE_CHECKING:
    from notebookos.config import Config

LIVE_REPLICA_STATES = frozenset({
    common_pb2.REPLICA_STATE_STARTING,
    common_pb2.REPLICA_STATE_IDLE,
    common_pb2.REPLICA_STATE_EXECUTING,
    common_pb2.REPLICA_STATE_STANDBY,
    common_pb2.REPLICA_STATE_MIGRATING,
})
GS_RECOVERS_STATES = frozenset({
    common_pb2.KERNEL_STATE_DEGRADED,  # a replica lost: replacement or rebuild is scheduled
    common_pb2.KERNEL_STATE_RECOVERING,
})
# States in which a kernel runs no replica on purpose and lives on: its checkpoint holds it, and
# the next cell starts replicas from it (per-cell containers between cells, hibernation).
SLEEPING_STATES = frozenset({
    common_pb2.KERNEL_STATE_PARKED,
    common_pb2.KERNEL_STATE_HIBERNATED,
    common_pb2.KERNEL_STATE_WAKING,
})
GONE_KERNEL_STATES = frozenset({
    common_pb2.KERNEL_STATE_STOPPED,
    common_pb2.KERNEL_STATE_FAILED,
})


def default_global_scheduler_address(config: Config | None = None) -> str:
    from notebookos.config import load_config

    config = config or load_config()
    return f"{config.global_scheduler.host}:{config.global_scheduler.grpc_port}"


_shared: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, grpc.aio.Channel]] = (
    weakref.WeakKeyDictionary())


def shared_global_scheduler_channel(address: str,
                                    config: Config | None = None) -> grpc.aio.Channel:
    """The one channel to the Global Scheduler at ``address`` that every kernel of this Jupyter
    Server and the extension's handlers share (per event loop: an aio channel belongs to one;
    and per version of the credential files: a replaced certificate gets a new channel). A
    channel per kernel start, or per status request of the JupyterLab panel, cost a mutual TLS
    handshake each time; a channel reconnects by itself after a Global Scheduler restart.
    Raises RuntimeError naming the setting to check when the credentials are unusable."""
    from notebookos.config import load_config
    from notebookos.security import SecurityError, load_tls, secure_aio_channel

    config = config or load_config()
    try:
        key = (address, load_tls(config).stamp, config.security.server_name)
        channels = _shared.setdefault(asyncio.get_running_loop(), {})
        channel = channels.get(key)
        if channel is None:
            # it outlives Global Scheduler restarts: channels.RECONNECT_OPTIONS
            channel = channels[key] = secure_aio_channel(config, address)
    except SecurityError as exc:
        raise RuntimeError(f"NotebookOS: no credentials for the Global Scheduler at {address}: "
                           f"{exc}") from None
    return channel


class NotebookOSProvisioner(KernelProvisionerBase):  # type: ignore[misc]
    """Starts and stops distributed kernels through the Global Scheduler."""

    global_scheduler = Unicode(
        "", config=True,
        help="host:port of the Global Scheduler; empty reads the NotebookOS configuration",
    )
    gpus = Integer(1, config=True, help="GPUs each cell of this kernel asks for")
    millicpus = Integer(1000, config=True, help="CPU request per replica, in millicpus")
    memory_mb = Integer(2048, config=True, help="memory request per replica, in MB")
    vram_gb = Float(0.0, config=True, help="GPU memory request per GPU, in GB")
    user = Unicode("", config=True, help=(
        "who runs this kernel, for per-user fairness; empty: the kernel environment's "
        "NOTEBOOKOS_USER, else JupyterHub's user (JUPYTERHUB_USER), else the server's OS user"))
    gpu_sla = Float(1.0, config=True, help=(
        "largest slowdown this kernel's cells accept from sharing a GPU with another kernel "
        "(TensorShare's gSLA, 1 to 10); 1 never shares"))
    gpu_workload = Unicode("", config=True, help=(
        "what the notebook trains (a model name such as resnet18), for the GPU sharing "
        "slowdown predictor"))
    start_timeout_s = Float(120.0, config=True, help="seconds to wait for StartKernel")
    rpc_timeout_s = Float(10.0, config=True, help="seconds to wait for other calls")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._started = False  # the kernel is believed alive (what has_process/poll report)
        self._registered = False  # the Global Scheduler holds the kernel until StopKernel
        self._exit_code: int | None = None
        self._restarting = False

    # -- helpers ----------------------------------------------------------------------------

    @property
    def address(self) -> str:
        if not self.global_scheduler:
            self.global_scheduler = default_global_scheduler_address()
        return self.global_scheduler

    def _stub(self) -> global_scheduler_pb2_grpc.GlobalSchedulerStub:
        # one reading of the configuration for both (a reading costs ~1 ms on a kernel start)
        from notebookos.config import load_config

        config = load_config()
        if not self.global_scheduler:
            self.global_scheduler = default_global_scheduler_address(config)
        return global_scheduler_pb2_grpc.GlobalSchedulerStub(
            shared_global_scheduler_channel(self.global_scheduler, config))

    def resource_request(self) -> ResourceSpec:
        return ResourceSpec(self.millicpus, self.memory_mb, self.gpus, self.vram_gb)

    def kernel_hints(self, env: dict[str, str]) -> KernelHints:
        """Who runs the kernel and for which notebook (``env``: the kernel's environment)."""
        user = (self.user or env.get("NOTEBOOKOS_USER") or os.environ.get("JUPYTERHUB_USER")
                or getpass.getuser())
        return KernelHints(user=user, notebook=env.get("JPY_SESSION_NAME", ""),
                           gpu_sla=self.gpu_sla, gpu_workload=self.gpu_workload)

    # -- launch -----------------------------------------------------------------------------

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        kwargs = await super().pre_launch(**kwargs)
        # jupyter_client pops "cmd"; the replicas' command is the Local Schedulers' business.
        kwargs.setdefault("cmd", [])
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> dict[str, Any]:
        km = self.parent
        key = km.session.key.decode() if km is not None else ""
        scheme = km.session.signature_scheme if km is not None else "hmac-sha256"
        request = global_scheduler_pb2.StartKernelRequest(
            kernel_id=self.kernel_id,
            resources=resource_spec_to_proto(self.resource_request()),
            key=key,
            signature_scheme=scheme,
            kernel_name=getattr(self.kernel_spec, "display_name", "") or "notebookos",
            # The kernel exists once its front is bound: JupyterLab drops a cell run before
            # that, and the replicas take a second or more (the front holds requests for them).
            return_when_bound=True,
        )
        env = kwargs.get("env") or {}
        for name in ("JPY_SESSION_NAME",):
            if name in env:
                request.env[name] = env[name]
        request.hints.extra.update(self.kernel_hints(env).to_map())
        response = await self._restarted() if self._restarting and self._registered else None
        if response is None:
            try:
                response = await self._stub().StartKernel(request, timeout=self.start_timeout_s)
            except grpc.aio.AioRpcError as exc:
                # An HTTPError, so that Jupyter Server answers with the reason and JupyterLab
                # shows it.
                raise start_refused(self.kernel_id, self.address, exc.code(),
                                    exc.details()) from None
        self._restarting = False
        self._started = self._registered = True
        self._exit_code = None
        info = connection_info_to_dict(response.connection)
        info["kernel_name"] = getattr(self.kernel_spec, "name", "") or "notebookos"
        if key:
            info["key"] = key.encode()
        self.connection_info = info
        return info

    async def _restarted(self) -> Any:
        """Jupyter's restart: fresh replicas behind the same front (``RestartKernel``), so that
        the ports stay the same and every client's sockets with them. Jupyter Server's open
        websockets keep the streams they have (only a new connection looks at new ports): with
        a new front on new ports the notebook's next cell went nowhere, and waited for good.
        None when the Global Scheduler cannot restart it (it stopped the kernel meanwhile): then
        it is stopped for good and started anew."""
        try:
            return await self._stub().RestartKernel(
                global_scheduler_pb2.RestartKernelRequest(kernel_id=self.kernel_id),
                timeout=self.start_timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (grpc.StatusCode.NOT_FOUND,
                                  grpc.StatusCode.FAILED_PRECONDITION):
                raise start_refused(self.kernel_id, self.address, exc.code(),
                                    exc.details()) from None
            self.log.warning("NotebookOS: kernel %s could not be restarted in place (%s: %s); "
                             "starting it anew, on new ports", self.kernel_id, exc.code().name,
                             exc.details())
        self._restarting = False
        await self._stop()
        return None

    @property
    def has_process(self) -> bool:
        return self._started

    # -- liveness ---------------------------------------------------------------------------

    async def poll(self) -> int | None:
        """None while a majority of replicas is alive (or the scheduler cannot be asked now)."""
        if not self._started:
            return self._exit_code if self._exit_code is not None else 0
        try:
            status = await self._stub().GetKernelStatus(
                global_scheduler_pb2.GetKernelStatusRequest(kernel_id=self.kernel_id),
                timeout=self.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                self._mark_gone(1)
                return 1
            # The Global Scheduler restarting is not the kernel dying: replicas keep running.
            self.log.warning("NotebookOS: cannot reach the Global Scheduler (%s)", exc.code().name)
            return None
        if status.state in GONE_KERNEL_STATES:
            self._mark_gone(1 if status.state == common_pb2.KERNEL_STATE_FAILED else 0)
            return self._exit_code
        if status.state in SLEEPING_STATES:
            return None  # alive: a cell wakes it (Jupyter's restarter must not start anew)
        if status.state in GS_RECOVERS_STATES:
            # The Global Scheduler is replacing lost replicas or rebuilding the kernel from its
            # checkpoint behind the same front (it says FAILED if it gives up). Reporting the
            # kernel dead here made Jupyter's restarter start a fresh, empty kernel while the
            # rebuild was on its way: the notebook's state lost (fault campaign, double fault).
            return None
        wanted = max(len(status.replicas), 1)
        alive = sum(1 for r in status.replicas if r.state in LIVE_REPLICA_STATES)
        if alive * 2 > wanted or status.state == common_pb2.KERNEL_STATE_STARTING:
            return None
        self._mark_gone(1)
        return 1

    def _mark_gone(self, code: int) -> None:
        self._started = False
        self._exit_code = code

    async def wait(self) -> int | None:
        for _ in range(int(max(self.rpc_timeout_s, 1) * 10)):
            code = await self.poll()
            if code is not None:
                return code
            await asyncio.sleep(0.1)
        return await self.poll()

    # -- signals and shutdown ---------------------------------------------------------------

    async def send_signal(self, signum: int) -> None:
        if signum == signal.SIGINT:
            await self._call("InterruptKernel",
                             global_scheduler_pb2.InterruptKernelRequest(kernel_id=self.kernel_id))
        elif signum in (signal.SIGTERM, signal.SIGKILL):
            await self._stop()
        elif signum == 0:
            return
        else:
            self.log.warning("NotebookOS: signal %s is not forwarded to distributed kernels",
                             signum)

    async def shutdown_requested(self, restart: bool = False) -> None:
        self._restarting = restart  # jupyter_client#1061: terminate() may not be told

    async def kill(self, restart: bool = False) -> None:
        await self._stop()

    async def terminate(self, restart: bool = False) -> None:
        await self._stop()

    async def cleanup(self, restart: bool = False) -> None:
        # Even a kernel that exited on shutdown_request (or lost its majority) is still held by
        # the Global Scheduler, with its checkpoints, until StopKernel.
        await self._stop()

    async def _stop(self) -> None:
        if not self._registered or self._restarting:
            # a restart keeps the kernel (and its front's ports): launch_kernel restarts it
            return
        await self._call("StopKernel",
                         global_scheduler_pb2.StopKernelRequest(kernel_id=self.kernel_id),
                         missing_ok=True)
        self._registered = False
        if self._started:
            self._mark_gone(0)

    async def _call(self, method: str, request: Any, missing_ok: bool = False) -> Any:
        try:
            return await getattr(self._stub(), method)(request, timeout=self.rpc_timeout_s)
        except grpc.aio.AioRpcError as exc:
            if missing_ok and exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise RuntimeError(
                f"NotebookOS: {method} for kernel {self.kernel_id} failed at {self.address}: "
                f"{exc.code().name}: {exc.details()}"
            ) from None

    # -- re-attaching after a Jupyter Server restart ----------------------------------------

    async def get_provisioner_info(self) -> dict[str, Any]:
        info = await super().get_provisioner_info()
        info.update({"global_scheduler": self.address, "started": self._started,
                     "gpus": self.gpus})
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        await super().load_provisioner_info(provisioner_info)
        self.global_scheduler = provisioner_info.get("global_scheduler", self.global_scheduler)
        self._started = self._registered = bool(provisioner_info.get("started", True))
        self.gpus = int(provisioner_info.get("gpus", self.gpus))

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        return max(recommended, 10.0)

    def get_stable_start_time(self, recommended: float = 10.0) -> float:
        return max(recommended, 10.0)
