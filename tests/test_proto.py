"""The gRPC protocol: committed generated code matches the .proto files, it imports and works
over a real gRPC channel, and the ResourceSpec / connection-info conversions validate."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from notebookos.proto import (
    common_pb2,
    generate,
    global_scheduler_pb2,
    global_scheduler_pb2_grpc,
    local_scheduler_pb2,
    local_scheduler_pb2_grpc,
)
from notebookos.proto.convert import (
    connection_info_from_dict,
    connection_info_to_dict,
    resource_spec_from_proto,
    resource_spec_to_proto,
)
from notebookos.resources import InvalidResourceSpec, ResourceSpec
from notebookos.security import add_secure_port
from notebookos.testing.credentials import connect, security_config

PROTO_DIR = Path(generate.__file__).resolve().parent

# ---- generated code is current ------------------------------------------------------------


def test_committed_generated_code_matches_the_proto_files() -> None:
    stale = generate.stale_files()
    if stale:
        diffs = "\n".join(generate.diff_of(name) for name in stale)
        pytest.fail(
            f"stale generated code {stale}; run `python -m notebookos.proto.generate`\n{diffs}"
        )


def test_check_reports_a_changed_and_a_missing_generated_file(tmp_path: Path) -> None:
    for name in generate.generated_names():
        shutil.copy(PROTO_DIR / name, tmp_path / name)
    assert generate.stale_files(tmp_path) == []
    edited = tmp_path / "common_pb2.py"
    edited.write_text(edited.read_text() + "\n# hand edit\n")
    (tmp_path / "local_scheduler_pb2_grpc.py").unlink()
    assert generate.stale_files(tmp_path) == ["common_pb2.py", "local_scheduler_pb2_grpc.py"]
    assert "+# hand edit" not in generate.diff_of("common_pb2.py", tmp_path)
    assert "-# hand edit" in generate.diff_of("common_pb2.py", tmp_path)


def test_write_generated_repairs_a_stale_copy(tmp_path: Path) -> None:
    for name in generate.generated_names():
        shutil.copy(PROTO_DIR / name, tmp_path / name)
    (tmp_path / "global_scheduler_pb2.pyi").write_text("stale\n")
    assert generate.write_generated(tmp_path) == ["global_scheduler_pb2.pyi"]
    assert generate.stale_files(tmp_path) == []


def test_check_command_exits_zero_on_the_committed_code() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "notebookos.proto.generate", "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "up to date" in result.stdout


def test_generated_modules_import_each_other_through_the_package() -> None:
    for name in generate.generated_names():
        text = (PROTO_DIR / name).read_text()
        assert not re.search(r"^import \w+_pb2", text, re.MULTILINE), name
    grpc_text = (PROTO_DIR / "global_scheduler_pb2_grpc.py").read_text()
    assert "from notebookos.proto import global_scheduler_pb2" in grpc_text
    assert "from notebookos.proto import common_pb2" in grpc_text


# ---- the protocol covers the life cycle the components need ---------------------------------

GS_RPCS = {
    "RegisterHost", "Heartbeat", "DeregisterHost", "DrainHost", "ReportReplicaEvent",
    "StartKernel", "StopKernel", "InterruptKernel", "RestartKernel", "GetKernelStatus", "WakeKernel",
    "ListKernels", "GetClusterStatus", "MigrateReplica",
}
LS_RPCS = {
    "StartReplica", "StopReplica", "InterruptReplica", "PrepareReplicaToMigrate",
    "CommitGpus", "ReleaseGpus", "SetPrewarmPool", "GetHostStatus", "Shutdown", "WatchHost",
}


def test_services_live_in_the_versioned_package_with_the_expected_rpcs() -> None:
    gs = global_scheduler_pb2.DESCRIPTOR.services_by_name["GlobalScheduler"]
    ls = local_scheduler_pb2.DESCRIPTOR.services_by_name["LocalScheduler"]
    assert gs.full_name == "notebookos.v1.GlobalScheduler"
    assert ls.full_name == "notebookos.v1.LocalScheduler"
    assert {m.name for m in gs.methods} == GS_RPCS
    assert {m.name for m in ls.methods} == LS_RPCS
    assert common_pb2.DESCRIPTOR.package == "notebookos.v1"


@pytest.mark.parametrize("proto", ["global_scheduler.proto", "local_scheduler.proto"])
def test_every_rpc_is_documented_in_the_proto(proto: str) -> None:
    lines = (PROTO_DIR / proto).read_text().splitlines()
    for index, line in enumerate(lines):
        if line.strip().startswith("rpc "):
            assert lines[index - 1].strip().startswith("//"), f"{proto}: undocumented {line}"


# ---- a real gRPC round trip through the generated classes --------------------------------------


class RecordingGlobalScheduler(global_scheduler_pb2_grpc.GlobalSchedulerServicer):
    """A trivial servicer: keeps registered hosts, answers StartKernel with a fixed front."""

    def __init__(self) -> None:
        self.hosts: dict[str, global_scheduler_pb2.RegisterHostRequest] = {}

    def RegisterHost(self, request, context):  # noqa: N802 - gRPC method name
        self.hosts[request.host_id] = request
        return global_scheduler_pb2.RegisterHostResponse(
            scheduler_instance_id="gs-1", heartbeat_interval_s=2.5, prewarm_pool_target=1
        )

    def StartKernel(self, request, context):  # noqa: N802 - gRPC method name
        try:
            spec = resource_spec_from_proto(request.resources, "StartKernelRequest.resources")
        except InvalidResourceSpec as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        connection = connection_info_from_dict(
            {
                "ip": "127.0.0.1", "transport": "tcp", "key": request.key,
                "signature_scheme": request.signature_scheme,
                "shell_port": 9001, "iopub_port": 9002, "stdin_port": 9003,
                "control_port": 9004, "hb_port": 9005,
            }
        )
        status = common_pb2.KernelStatus(
            kernel_id=request.kernel_id,
            state=common_pb2.KERNEL_STATE_STARTING,
            resources=resource_spec_to_proto(spec),
        )
        return global_scheduler_pb2.StartKernelResponse(connection=connection, status=status)


class GpuCommittingLocalScheduler(local_scheduler_pb2_grpc.LocalSchedulerServicer):
    def CommitGpus(self, request, context):  # noqa: N802 - gRPC method name
        if request.gpus > 2:
            return local_scheduler_pb2.CommitGpusResponse(
                committed=False, reason="only 2 GPUs idle", gpus_idle=2
            )
        return local_scheduler_pb2.CommitGpusResponse(
            committed=True, device_ids=list(range(request.gpus)), gpus_idle=2 - request.gpus
        )


@pytest.fixture
def channel() -> Iterator[tuple[grpc.Channel, RecordingGlobalScheduler]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    gs = RecordingGlobalScheduler()
    global_scheduler_pb2_grpc.add_GlobalSchedulerServicer_to_server(gs, server)
    local_scheduler_pb2_grpc.add_LocalSchedulerServicer_to_server(
        GpuCommittingLocalScheduler(), server
    )
    port = add_secure_port(server, security_config(), "127.0.0.1:0")
    assert port > 0
    server.start()
    client = connect(f"127.0.0.1:{port}")
    try:
        grpc.channel_ready_future(client).result(timeout=10)
        yield client, gs
    finally:
        client.close()
        server.stop(grace=None).wait(5)


def test_register_and_start_kernel_round_trip(channel) -> None:
    client, gs = channel
    stub = global_scheduler_pb2_grpc.GlobalSchedulerStub(client)
    registered = stub.RegisterHost(
        global_scheduler_pb2.RegisterHostRequest(
            host_id="host-a",
            address="10.0.0.7:7070",
            instance_id="ls-42",
            capacity=resource_spec_to_proto(ResourceSpec(64000, 262144, 2, 80.0)),
            gpus=[
                common_pb2.GpuDevice(device_id=0, name="virtual", vram_gb=80.0),
                common_pb2.GpuDevice(device_id=1, name="virtual", vram_gb=80.0),
            ],
            virtual_gpus=True,
            replicas=[
                common_pb2.ReplicaStatus(
                    kernel_id="k1", replica_id=2, pid=1234,
                    state=common_pb2.REPLICA_STATE_IDLE, last_cell_gpu_device_ids=[1],
                )
            ],
        ),
        timeout=10,
    )
    assert registered.heartbeat_interval_s == 2.5
    assert registered.scheduler_instance_id == "gs-1"
    seen = gs.hosts["host-a"]
    assert resource_spec_from_proto(seen.capacity) == ResourceSpec(64000, 262144, 2, 80.0)
    assert [g.device_id for g in seen.gpus] == [0, 1] and seen.virtual_gpus
    assert seen.replicas[0].state == common_pb2.REPLICA_STATE_IDLE
    assert list(seen.replicas[0].last_cell_gpu_device_ids) == [1]

    started = stub.StartKernel(
        global_scheduler_pb2.StartKernelRequest(
            kernel_id="k1",
            resources=resource_spec_to_proto(ResourceSpec(4000, 16384, 1, 40.0)),
            hints=common_pb2.PolicyHints(replicas=3, extra={"priority": "high"}),
            key="secret-key",
            signature_scheme="hmac-sha256",
            env={"JPY_SESSION_NAME": "nb.ipynb"},
        ),
        timeout=10,
    )
    info = connection_info_to_dict(started.connection)
    assert info["key"] == b"secret-key" and info["signature_scheme"] == "hmac-sha256"
    assert [info[p] for p in ("shell_port", "iopub_port", "stdin_port")] == [9001, 9002, 9003]
    assert started.status.kernel_id == "k1"
    assert started.status.state == common_pb2.KERNEL_STATE_STARTING
    assert resource_spec_from_proto(started.status.resources) == ResourceSpec(4000, 16384, 1, 40.0)


def test_invalid_resources_come_back_as_invalid_argument(channel) -> None:
    client, _ = channel
    stub = global_scheduler_pb2_grpc.GlobalSchedulerStub(client)
    with pytest.raises(grpc.RpcError) as raised:
        stub.StartKernel(
            global_scheduler_pb2.StartKernelRequest(
                kernel_id="k2", resources=common_pb2.ResourceSpec(gpus=-1), key="k"
            ),
            timeout=10,
        )
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "StartKernelRequest.resources" in raised.value.details()
    assert "gpus=-1" in raised.value.details()


def test_unimplemented_rpc_is_reported_as_such(channel) -> None:
    client, _ = channel
    stub = global_scheduler_pb2_grpc.GlobalSchedulerStub(client)
    with pytest.raises(grpc.RpcError) as raised:
        stub.Heartbeat(global_scheduler_pb2.HeartbeatRequest(host_id="host-a"), timeout=10)
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_commit_gpus_answers_devices_or_a_refusal(channel) -> None:
    client, _ = channel
    stub = local_scheduler_pb2_grpc.LocalSchedulerStub(client)
    granted = stub.CommitGpus(
        local_scheduler_pb2.CommitGpusRequest(kernel_id="k1", replica_id=1, request_id="m1", gpus=2),
        timeout=10,
    )
    assert granted.committed and list(granted.device_ids) == [0, 1]
    refused = stub.CommitGpus(
        local_scheduler_pb2.CommitGpusRequest(kernel_id="k1", replica_id=1, request_id="m2", gpus=4),
        timeout=10,
    )
    assert not refused.committed and refused.reason == "only 2 GPUs idle"
    assert list(refused.device_ids) == []


# ---- conversions --------------------------------------------------------------------------------

specs = st.builds(
    ResourceSpec,
    millicpus=st.integers(0, 2**63 - 1),
    memory_mb=st.integers(0, 2**63 - 1),
    gpus=st.integers(0, 2**31 - 1),
    vram_gb=st.floats(0, 1e12, allow_nan=False, allow_infinity=False),
)


@given(specs)
def test_resource_spec_survives_the_wire(spec: ResourceSpec) -> None:
    wire = resource_spec_to_proto(spec).SerializeToString()
    assert resource_spec_from_proto(common_pb2.ResourceSpec.FromString(wire)) == spec


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"millicpus": -1}, "millicpus=-1"),
        ({"memory_mb": -5}, "memory_mb=-5"),
        ({"gpus": -2}, "gpus=-2"),
        ({"vram_gb": -0.5}, "vram_gb=-0.5"),
        ({"vram_gb": math.nan}, "vram_gb=nan"),
        ({"vram_gb": math.inf}, "vram_gb=inf"),
    ],
)
def test_bad_wire_values_raise_the_resource_validation_error(fields: dict, needle: str) -> None:
    with pytest.raises(InvalidResourceSpec, match=needle):
        resource_spec_from_proto(common_pb2.ResourceSpec(**fields))
    with pytest.raises(InvalidResourceSpec, match=rf"^Req\.resources: .*{re.escape(needle)}"):
        resource_spec_from_proto(common_pb2.ResourceSpec(**fields), "Req.resources")


def test_unset_resources_read_as_an_empty_request() -> None:
    request = global_scheduler_pb2.StartKernelRequest(kernel_id="k")
    assert resource_spec_from_proto(request.resources) == ResourceSpec()


def test_values_beyond_the_wire_types_are_refused() -> None:
    with pytest.raises(InvalidResourceSpec, match="gpus=2147483648"):
        resource_spec_to_proto(ResourceSpec(gpus=2**31))
    with pytest.raises(InvalidResourceSpec, match="memory_mb"):
        resource_spec_to_proto(ResourceSpec(memory_mb=2**63))


def test_conversions_refuse_the_wrong_type() -> None:
    with pytest.raises(TypeError, match="ResourceSpec"):
        resource_spec_to_proto({"gpus": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="notebookos.v1.ResourceSpec"):
        resource_spec_from_proto(common_pb2.GpuDevice())  # type: ignore[arg-type]


def test_connection_info_round_trip_and_bad_port() -> None:
    info = {
        "ip": "10.0.0.1", "transport": "tcp", "key": b"abc", "signature_scheme": "hmac-sha256",
        "shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 65535,
    }
    assert connection_info_to_dict(connection_info_from_dict(info)) == info
    with pytest.raises(ValueError, match="hb_port=0"):
        connection_info_from_dict({**info, "hb_port": 0})
    with pytest.raises(ValueError, match="iopub_port=None"):
        connection_info_from_dict({k: v for k, v in info.items() if k != "iopub_port"})
