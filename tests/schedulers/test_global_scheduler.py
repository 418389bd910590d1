"""A Global Scheduler and four Local Schedulers (2 virtual GPUs each) on loopback, real replicas:
placement, routing through the kernel's front, per-cell GPU binding, status, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import grpc
import pytest
from sched_cluster import (  # noqa: F401 - fixture
    bad_messages_sent,
    ls_gpus_committed,
    make_cluster_fixture,
    result_text,
    run_cell,
)

from notebookos.proto import common_pb2, global_scheduler_pb2
from notebookos.testing.credentials import join_token_metadata

pytestmark = pytest.mark.timeout(120)


def _hosts_of(cluster, kernel_id: str) -> list[str]:  # noqa: ANN001
    return [r.host_id for r in cluster.kernel(kernel_id).replicas]


def test_cells_run_through_the_front_on_distinct_hosts_with_gpus_bound_per_cell(make_cluster):
    cluster = make_cluster()
    cluster.start_gs()
    for i in range(4):
        cluster.start_ls(f"host-{i}")
    cluster.wait_hosts(4)
    kernel_id, kc = cluster.start_kernel(gpus=1)
    hosts = _hosts_of(cluster, kernel_id)
    assert len(hosts) == 3 and len(set(hosts)) == 3, hosts

    first = run_cell(kc, "x = 41")
    assert first["reply"]["content"]["status"] == "ok"
    assert first["statuses"] == ["busy", "idle"]
    second = run_cell(kc, "x + 1")
    assert result_text(second) == "42"
    assert second["statuses"] == ["busy", "idle"]
    assert len([m for m in second["outputs"] if m["msg_type"] == "execute_result"]) == 1

    gpus = run_cell(kc, "from notebookos.kernel.gpu_binding import assigned_gpus\n"
                        "assigned_gpus()")
    ids = json.loads(result_text(gpus).replace("(", "[").replace(")", "]").replace(",]", "]"))
    assert len(ids) == 1 and ids[0] in (0, 1)

    # GPUs were released on the reply; the executor is reported.
    status = cluster.status()
    assert status.gpus_committed == 0
    assert all(h.gpus_committed == 0 for h in status.hosts)
    assert cluster.kernel(kernel_id).executor_replica_id in (1, 2, 3)
    # ...and so do the hosts themselves: the release waits briefly for a next commit to ride
    # on, then goes out on its own
    for h in status.hosts:
        cluster.wait(lambda h=h: ls_gpus_committed(h.address) == 0, 5,
                     f"{h.host_id} to see the release")

    out = subprocess.run([sys.executable, "-m", "notebookos.cli", "status", "--json",
                          "--global-scheduler", cluster.gs_address],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    doc = json.loads(out)
    host = doc["hosts"][0]
    assert {"id", "address", "gpus", "subscription_ratio"} <= set(host)
    assert {"total", "committed", "pending"} <= set(host["gpus"])
    assert host["gpus"]["total"] == 2
    assert sum(h["subscription_ratio"] for h in doc["hosts"]) == pytest.approx(3 * 1 / 6, 1e-3)
    kernel = next(k for k in doc["kernels"] if k["id"] == kernel_id)
    assert {"id", "replicas", "executor"} <= set(kernel)
    assert {"replica_id", "host_id", "pid", "state"} <= set(kernel["replicas"][0])
    assert all(r["pid"] > 0 for r in kernel["replicas"])


def test_a_cell_lands_on_a_replica_whose_host_has_free_gpus(make_cluster):
    cluster = make_cluster()
    cluster.start_gs()
    for i in range(4):
        cluster.start_ls(f"host-{i}")
    cluster.wait_hosts(4)
    a, kc_a = cluster.start_kernel(gpus=2)
    b, kc_b = cluster.start_kernel(gpus=2)
    # Occupy both GPUs of a's executor host with a running cell.
    kc_a.execute("import time; time.sleep(6)")
    cluster.wait(lambda: cluster.status().gpus_committed == 2, 10, "a's GPUs committed")
    busy_host = next(h.host_id for h in cluster.status().hosts if h.gpus_committed == 2)
    # Both kernels were placed on the same most-idle hosts, so b has a replica on the busy host.
    assert busy_host in _hosts_of(cluster, b)
    run = run_cell(kc_b, "y = 7\ny")
    assert result_text(run) == "7"
    executor = cluster.kernel(b).executor_replica_id
    executor_host = next(r.host_id for r in cluster.kernel(b).replicas
                         if r.replica_id == executor)
    assert executor_host != busy_host
    kc_a.get_shell_msg(timeout=30)


def test_subscription_limit_and_bad_input_get_clear_errors(make_cluster):
    cluster = make_cluster({"NOTEBOOKOS_CLUSTER_MAX_SUBSCRIPTION_RATIO": "0.34"})
    cluster.start_gs()
    for i in range(4):
        cluster.start_ls(f"host-{i}")
    cluster.wait_hosts(4)
    kernel_id, kc = cluster.start_kernel(gpus=2)
    # SR limit 0.34 on 2-GPU hosts: one 2-GPU replica per host, so a second kernel needs three
    # more hosts and only one is left.
    with pytest.raises(grpc.RpcError) as err:
        cluster.start_kernel(gpus=2)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "subscription" in err.value.details()

    stub = cluster.stub
    with pytest.raises(grpc.RpcError) as err:
        stub.StartKernel(global_scheduler_pb2.StartKernelRequest(
            kernel_id="bad", key="k", resources=common_pb2.ResourceSpec(gpus=-1)), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "gpus" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stub.StartKernel(global_scheduler_pb2.StartKernelRequest(kernel_id="nokey"), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for sla, why in (("fast", "is not a number"), ("0.5", "must be between 1")):
        with pytest.raises(grpc.RpcError) as err:
            stub.StartKernel(global_scheduler_pb2.StartKernelRequest(
                kernel_id="bad-sla", key="k", resources=common_pb2.ResourceSpec(gpus=1),
                hints=common_pb2.PolicyHints(extra={"gpu_sla": sla})), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "hints.extra['gpu_sla']" in err.value.details() and why in err.value.details()
    for call, request in (
        (stub.GetKernelStatus, global_scheduler_pb2.GetKernelStatusRequest(kernel_id="nope")),
        (stub.StopKernel, global_scheduler_pb2.StopKernelRequest(kernel_id="nope")),
    ):
        with pytest.raises(grpc.RpcError) as err:
            call(request, timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert "nope" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stub.RegisterHost(global_scheduler_pb2.RegisterHostRequest(
            host_id="empty", address="127.0.0.1:1", instance_id="x"), timeout=10,
            metadata=join_token_metadata())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "zero GPUs" in err.value.details()

    # A badly signed message to the front is dropped; the kernel and the daemons carry on.
    with bad_messages_sent(cluster.kernel(kernel_id).connection.shell_port):
        cluster.wait(lambda: cluster.kernel(kernel_id).dropped_messages == 2, 10,
                     "both bad messages counted")
    assert result_text(run_cell(kc, "z = 5\nz * 2")) == "10"
    assert cluster.kernel(kernel_id).dropped_messages == 2
    assert cluster.gs.poll() is None and all(p.poll() is None for p in cluster.ls.values())

    # A Local Scheduler offering zero GPUs is refused with a reason, and does not die.
    zero = cluster.start_ls("zero-gpus", gpus=0)
    cluster.wait(lambda: "zero GPUs" in cluster.log("zero-gpus"), 20, "the refusal logged")
    assert zero.poll() is None
    assert len(cluster.status().hosts) == 4



def test_a_cluster_status_for_one_kernel_holds_that_kernel_and_every_host(make_cluster):
    """What the JupyterLab extension asks after each cell (``/api/notebookos/kernels/<id>``):
    the hosts and that kernel only, so its cost does not grow with the open kernels."""
    cluster = make_cluster()
    cluster.start(hosts=3)
    first, _ = cluster.start_kernel(gpus=0)
    second, _ = cluster.start_kernel(gpus=0)
    whole = cluster.status()
    assert {k.kernel_id for k in whole.kernels} == {first, second}
    one = cluster.stub.GetClusterStatus(
        global_scheduler_pb2.GetClusterStatusRequest(kernel_id=second), timeout=10)
    assert [k.kernel_id for k in one.kernels] == [second]
    assert len(one.kernels[0].replicas) == 3
    assert {h.host_id for h in one.hosts} == {h.host_id for h in whole.hosts}
    assert one.gpus_total == whole.gpus_total and one.policy == whole.policy
    unknown = cluster.stub.GetClusterStatus(
        global_scheduler_pb2.GetClusterStatusRequest(kernel_id="no-such-kernel"), timeout=10)
    assert not list(unknown.kernels) and len(unknown.hosts) == 3
