"""A kernel started behind its front (what Jupyter's provisioner asks for) starts its replicas
once a client attaches (an IOPub subscription, a request) or, with none, after
``global_scheduler.replicas_wait_for_client_s``: Jupyter Server attaches as the last step of its
REST create, and replicas starting on its machine before that took its CPU (issue 18)."""

from __future__ import annotations

import time
import uuid

import pytest
from sched_cluster import make_cluster_fixture, run_cell  # noqa: F401 - fixture

from notebookos.proto import common_pb2, global_scheduler_pb2, local_scheduler_pb2
from notebookos.proto import local_scheduler_pb2_grpc as ls_grpc
from notebookos.testing.credentials import connect

pytestmark = pytest.mark.timeout(240)

WAIT_S = 10.0


def _three_hosts(make_cluster):  # noqa: ANN001, ANN202
    cluster = make_cluster({"NOTEBOOKOS_GLOBAL_SCHEDULER_REPLICAS_WAIT_FOR_CLIENT_S": str(WAIT_S)})
    cluster.start_gs()
    for i in range(3):
        cluster.start_ls(f"host-{i}")
    cluster.wait_hosts(3)
    return cluster


def _start_behind_front(cluster, kernel_id: str) -> common_pb2.ConnectionInfo:  # noqa: ANN001
    return cluster.stub.StartKernel(global_scheduler_pb2.StartKernelRequest(
        kernel_id=kernel_id, key=uuid.uuid4().hex, return_when_bound=True,
        resources=common_pb2.ResourceSpec(millicpus=100, memory_mb=128)), timeout=30).connection


def _started_replicas(cluster, kernel_id: str) -> int:  # noqa: ANN001
    return sum(1 for r in cluster.kernel(kernel_id).replicas if r.pid)


def test_replicas_start_for_a_client_at_once_and_without_one_after_the_wait(make_cluster) -> None:  # noqa: ANN001
    cluster = _three_hosts(make_cluster)

    alone = _start_behind_front(cluster, "k-alone")
    started = time.monotonic()
    kc = cluster.client(_start_behind_front(cluster, "k-attached"))
    assert run_cell(kc, "print(6 * 7)")["reply"]["content"]["status"] == "ok"
    assert time.monotonic() - started < WAIT_S, "the attached kernel waited out the wait"
    assert cluster.kernel("k-alone").state == common_pb2.KERNEL_STATE_STARTING
    assert _started_replicas(cluster, "k-alone") == 0

    # Nobody attaches to k-alone: its replicas start once the wait is over.
    cluster.wait(lambda: cluster.kernel("k-alone").state == common_pb2.KERNEL_STATE_IDLE,
                 90, "k-alone's replicas")
    assert time.monotonic() - started >= WAIT_S - 1.0
    assert _started_replicas(cluster, "k-alone") == 3
    late = cluster.client(alone)
    assert run_cell(late, "1 + 1")["reply"]["content"]["status"] == "ok"


def test_a_kernel_stopped_while_it_waits_for_a_client_starts_no_replica(make_cluster) -> None:  # noqa: ANN001
    cluster = _three_hosts(make_cluster)
    _start_behind_front(cluster, "k-stopped")
    cluster.stub.StopKernel(global_scheduler_pb2.StopKernelRequest(kernel_id="k-stopped"),
                            timeout=30)
    time.sleep(2.0)
    for host in cluster.status().hosts:
        with connect(host.address) as channel:
            replicas = ls_grpc.LocalSchedulerStub(channel).GetHostStatus(
                local_scheduler_pb2.GetHostStatusRequest(), timeout=10).replicas
        assert not [r for r in replicas if r.kernel_id == "k-stopped"], host.host_id
    gs_log = cluster.log("gs")
    assert "failed to start" not in gs_log and "did not start" not in gs_log, gs_log
