"""The Global Scheduler's own room for kernels (issue 32: thousands of notebooks in one
scheduler). Each open kernel holds about 27 open files in the scheduler (its bound ports, its
replica links, Jupyter's connections); a scheduler out of open files cannot bind the next
kernel's ports. A start beyond its room is refused with why and what the operator does
(RESOURCE_EXHAUSTED, which Jupyter shows as "no room"), and the kernels already open go on:
cells, interrupts, their status."""

from __future__ import annotations

import grpc
import pytest
from sched_cluster import make_cluster_fixture, run_cell

from notebookos.global_scheduler.limits import FDS_PER_OPEN_KERNEL, kernels_room
from notebookos.proto import global_scheduler_pb2

make_cluster = make_cluster_fixture

pytestmark = pytest.mark.timeout(180)


def _refused(cluster) -> grpc.RpcError:  # noqa: ANN001
    with pytest.raises(grpc.RpcError) as refused:
        cluster.start_kernel(gpus=0, timeout=60)
    return refused.value


def _answers(cluster, kc, value: int) -> None:  # noqa: ANN001
    run = run_cell(kc, f"x = {value}\nprint(x * 2)")
    assert run["reply"]["content"]["status"] == "ok", (run, cluster.log("gs"))
    assert str(value * 2) in "".join(m["content"].get("text", "") for m in run["outputs"]), run


def test_room_follows_the_open_file_limit_and_keeps_a_reserve() -> None:
    assert kernels_room(0) == 0  # no limit
    assert kernels_room(20_000) == (20_000 - 1_000) // FDS_PER_OPEN_KERNEL
    assert kernels_room(1_048_576) > 35_000
    assert kernels_room(300) == 1  # a tiny limit still lets one kernel try


def test_a_start_past_max_kernels_is_refused_with_why_and_the_open_kernels_go_on(
        make_cluster) -> None:  # noqa: ANN001
    cluster = make_cluster({"NOTEBOOKOS_GLOBAL_SCHEDULER_MAX_KERNELS": "2"})
    cluster.start(hosts=3)
    first, kc1 = cluster.start_kernel(gpus=0)
    _, kc2 = cluster.start_kernel(gpus=0)
    error = _refused(cluster)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
    assert "cannot hold another kernel" in error.details(), error.details()
    assert "holds 2 open kernels (global_scheduler.max_kernels 2)" in error.details()
    _answers(cluster, kc1, 21)
    _answers(cluster, kc2, 4)
    assert len(cluster.status().kernels) == 2
    cluster.stub.StopKernel(global_scheduler_pb2.StopKernelRequest(kernel_id=first), timeout=60)
    _, kc3 = cluster.start_kernel(gpus=0)  # room again
    _answers(cluster, kc3, 5)


def test_a_scheduler_with_few_open_files_holds_what_they_leave_room_for_and_no_more(
        make_cluster) -> None:  # noqa: ANN001
    """Room from the open-file limit: every kernel it admits runs cells with a client attached,
    and the next start is refused with why (without the limit it was admitted and the
    scheduler, out of files, could no longer answer its gRPC calls)."""
    open_files = 256 + 3 * FDS_PER_OPEN_KERNEL + 20
    room = kernels_room(open_files)
    assert room == 3
    cluster = make_cluster()
    cluster.start_gs(open_files=open_files)
    for i in range(3):
        cluster.start_ls(f"host-{i}")
    cluster.wait_hosts(3)
    clients = [cluster.start_kernel(gpus=0)[1] for _ in range(room)]
    error = _refused(cluster)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (error, cluster.log("gs"))
    assert f"what its open-file limit of {open_files} leaves room for" in error.details(), \
        error.details()
    for value, kc in enumerate(clients, start=3):
        _answers(cluster, kc, value)
        kc.control_channel.send(kc.session.msg("interrupt_request", {}))  # a control link
    assert len(cluster.status().kernels) == room
    assert cluster.gs.poll() is None, cluster.log("gs")
