"""The provisioner against a gRPC Global Scheduler endpoint that scripts the kernel's state.

The thing under test is the provisioner as jupyter_client drives it (AsyncKernelManager with the
installed ``notebookos`` kernelspec): what it asks the Global Scheduler and how it reports
liveness. The Global Scheduler here is a real gRPC server whose answers the test sets; the whole
stack runs in the end-to-end tests.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import grpc
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

from notebookos.proto import common_pb2, global_scheduler_pb2, global_scheduler_pb2_grpc
from notebookos.provisioner.kernelspecs import kernelspec, kernelspec_name
from notebookos.provisioner.provisioner import NotebookOSProvisioner
from notebookos.security import add_secure_port
from notebookos.testing.credentials import security_config

ALIVE, DEAD = common_pb2.REPLICA_STATE_IDLE, common_pb2.REPLICA_STATE_DEAD


class ScriptedGlobalScheduler(global_scheduler_pb2_grpc.GlobalSchedulerServicer):
    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.start_peers: list[str] = []  # the client end of each StartKernel's connection
        self.replica_states = [ALIVE, ALIVE, ALIVE]
        self.kernel_state = common_pb2.KERNEL_STATE_IDLE
        self.known = True

    async def StartKernel(self, request, context):  # noqa: N802 - gRPC naming
        self.calls.append(("StartKernel", request))
        self.start_peers.append(context.peer())
        if request.resources.gpus > 4:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "no host has 8 GPUs")
        return global_scheduler_pb2.StartKernelResponse(connection=common_pb2.ConnectionInfo(
            ip="127.0.0.1", transport="tcp", shell_port=50001, iopub_port=50002,
            stdin_port=50003, control_port=50004, hb_port=50005, key=request.key,
            signature_scheme=request.signature_scheme))

    async def GetKernelStatus(self, request, context):  # noqa: N802
        self.calls.append(("GetKernelStatus", request))
        if not self.known:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown kernel {request.kernel_id}")
        return common_pb2.KernelStatus(
            kernel_id=request.kernel_id, state=self.kernel_state,
            replicas=[common_pb2.ReplicaStatus(replica_id=i + 1, state=s)
                      for i, s in enumerate(self.replica_states)])

    async def StopKernel(self, request, context):  # noqa: N802
        self.calls.append(("StopKernel", request))
        return global_scheduler_pb2.StopKernelResponse()

    async def InterruptKernel(self, request, context):  # noqa: N802
        self.calls.append(("InterruptKernel", request))
        return global_scheduler_pb2.InterruptKernelResponse(cell_was_running=True)


@pytest.fixture
def kernelspec_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    data = tmp_path / "data"
    for gpus in (1, 8):
        spec_dir = data / "kernels" / kernelspec_name(gpus)
        spec_dir.mkdir(parents=True)
        (spec_dir / "kernel.json").write_text(json.dumps(kernelspec(gpus)))
    monkeypatch.setenv("JUPYTER_PATH", str(data))
    return data


async def run_with_scheduler(body) -> ScriptedGlobalScheduler:
    scheduler = ScriptedGlobalScheduler()
    server = grpc.aio.server()
    global_scheduler_pb2_grpc.add_GlobalSchedulerServicer_to_server(scheduler, server)
    port = add_secure_port(server, security_config(), "127.0.0.1:0")  # mutual TLS
    await server.start()
    try:
        await body(scheduler, f"127.0.0.1:{port}")
    finally:
        await server.stop(None)
    return scheduler


def manager(kernel_name: str, address: str) -> AsyncKernelManager:
    km = AsyncKernelManager(kernel_name=kernel_name, kernel_spec_manager=KernelSpecManager())
    km.kernel_spec.metadata["kernel_provisioner"]["config"]["global_scheduler"] = address
    return km


def test_lifecycle_and_majority_liveness(kernelspec_dir: Path) -> None:
    async def body(gs: ScriptedGlobalScheduler, address: str) -> None:
        km = manager("notebookos", address)
        await km.start_kernel()
        assert isinstance(km.provisioner, NotebookOSProvisioner)
        (name, start), = [c for c in gs.calls if c[0] == "StartKernel"]
        assert start.kernel_id == km.kernel_id and start.resources.gpus == 1
        assert start.key == km.session.key.decode() and start.signature_scheme == "hmac-sha256"
        assert km.shell_port == 50001 and km.hb_port == 50005

        assert await km.is_alive()
        gs.replica_states = [ALIVE, DEAD, ALIVE]  # one replica lost: not a dead kernel
        assert await km.is_alive()
        gs.kernel_state = common_pb2.KERNEL_STATE_RECOVERING
        gs.replica_states = [DEAD, DEAD, ALIVE]  # being rebuilt from its checkpoint
        assert await km.is_alive()
        # Degraded: the Global Scheduler has scheduled the replacement or the rebuild; the
        # kernel is not dead (Jupyter would restart it empty), even with every replica lost.
        gs.kernel_state = common_pb2.KERNEL_STATE_DEGRADED
        assert await km.is_alive()
        gs.replica_states = []
        assert await km.is_alive()
        gs.replica_states = [DEAD, DEAD, ALIVE]
        gs.kernel_state = common_pb2.KERNEL_STATE_IDLE
        assert not await km.is_alive()  # a majority is gone and nobody rebuilds it

        gs.replica_states = [ALIVE, ALIVE, ALIVE]
        km2 = manager("notebookos", address)
        await km2.start_kernel()
        await km2.provisioner.send_signal(signal.SIGINT)
        info = await km2.provisioner.get_provisioner_info()
        assert info["global_scheduler"] == address and info["kernel_id"] == km2.kernel_id
        await km2.shutdown_kernel(now=True)
        stops = [c[1].kernel_id for c in gs.calls if c[0] == "StopKernel"]
        assert km2.kernel_id in stops
        assert any(c[0] == "InterruptKernel" for c in gs.calls)

        # A restarted Jupyter Server re-attaches from the saved provisioner info.
        fresh = NotebookOSProvisioner(kernel_id=km2.kernel_id, kernel_spec=km2.kernel_spec)
        await fresh.load_provisioner_info(dict(info, started=True))
        gs.known = True
        assert await fresh.poll() is None
        gs.known = False
        assert await fresh.poll() == 1
        await fresh.cleanup()

    asyncio.run(run_with_scheduler(body))


def test_kernels_of_one_server_share_one_connection_to_the_scheduler(
        kernelspec_dir: Path) -> None:
    """A mutual TLS handshake per kernel start was on every start's path: the kernels of one
    Jupyter Server share one channel, which outlives each kernel."""
    async def body(gs: ScriptedGlobalScheduler, address: str) -> None:
        first = manager("notebookos", address)
        await first.start_kernel()
        await first.shutdown_kernel(now=True)
        second = manager("notebookos", address)
        await second.start_kernel()
        await second.shutdown_kernel(now=True)
        assert len(gs.start_peers) == 2
        assert gs.start_peers[0] == gs.start_peers[1], gs.start_peers

    asyncio.run(run_with_scheduler(body))


def test_refused_start_gives_a_clear_error(kernelspec_dir: Path) -> None:
    async def body(gs: ScriptedGlobalScheduler, address: str) -> None:
        km = manager("notebookos-8gpu", address)
        with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED: no host has 8 GPUs"):
            await km.start_kernel()

    asyncio.run(run_with_scheduler(body))


def test_unreachable_scheduler_is_reported(kernelspec_dir: Path) -> None:
    async def body() -> None:
        km = manager("notebookos", "127.0.0.1:1")
        km.kernel_spec.metadata["kernel_provisioner"]["config"]["start_timeout_s"] = 2.0
        with pytest.raises(RuntimeError, match="could not start kernel .* 127.0.0.1:1"):
            await km.start_kernel()

    asyncio.run(body())


def test_the_start_request_says_who_runs_which_notebook(kernelspec_dir: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernel hints (notebookos/kernel_hints.py) as Jupyter starts a kernel: the user from the
    kernel's environment (NOTEBOOKOS_USER), else JupyterHub's, else the OS user; the notebook
    from JPY_SESSION_NAME; the GPU sharing SLA and workload from the kernelspec's config."""
    monkeypatch.setenv("JUPYTERHUB_USER", "hub-user")

    async def body(gs: ScriptedGlobalScheduler, address: str) -> None:
        km = manager("notebookos", address)
        km.kernel_spec.metadata["kernel_provisioner"]["config"].update(
            {"gpu_sla": 1.5, "gpu_workload": "resnet18"})
        await km.start_kernel(env={"NOTEBOOKOS_USER": "alice",
                                   "JPY_SESSION_NAME": "/home/alice/train.ipynb"})
        default = manager("notebookos", address)
        await default.start_kernel()
        starts = [c[1] for c in gs.calls if c[0] == "StartKernel"]
        assert dict(starts[0].hints.extra) == {"user": "alice", "gpu_sla": "1.5",
                                               "gpu_workload": "resnet18",
                                               "notebook": "/home/alice/train.ipynb"}
        assert dict(starts[1].hints.extra) == {"user": "hub-user"}
        for k in (km, default):
            await k.shutdown_kernel(now=True)

    asyncio.run(run_with_scheduler(body))
