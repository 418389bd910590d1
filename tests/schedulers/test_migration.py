"""Contention: every replica's host is busy, so the kernel migrates a replica (to a prewarmed
process) and the cell runs with the kernel's state intact; with nowhere to go, the cell gets an
error reply that says why. Real daemons and replicas on loopback."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from sched_cluster import (  # noqa: F401 - fixture
    ls_gpus_committed,
    make_cluster_fixture,
    result_text,
    run_cell,
)

from notebookos.proto import common_pb2, global_scheduler_pb2, local_scheduler_pb2
from notebookos.proto import local_scheduler_pb2_grpc as ls_grpc
from notebookos.testing.credentials import connect, join_token_metadata

pytestmark = pytest.mark.timeout(150)


def test_all_hosts_busy_migrates_to_a_prewarmed_replica_and_keeps_state(make_cluster):
    cluster = make_cluster({"NOTEBOOKOS_GLOBAL_SCHEDULER_MIGRATION_RETRIES": "2",
                            "NOTEBOOKOS_GLOBAL_SCHEDULER_CELL_QUEUE_TIMEOUT_S": "2"})
    cluster.start_gs()
    for i in range(3):
        cluster.start_ls(f"host-{i}", gpus=1)
    cluster.wait_hosts(3)
    b, kc = cluster.start_kernel(gpus=1)
    assert result_text(run_cell(kc, "v = 'kept'\nv")) == "'kept'"

    # Work the Global Scheduler does not schedule takes every GPU of the three hosts: a replica
    # of another kernel started on each host directly, holding its host's GPU.
    addresses = {h.host_id: h.address for h in cluster.status().hosts}
    cluster.wait(lambda: sum(ls_gpus_committed(a) for a in addresses.values()) == 0, 10,
                 "the hosts to see the first cell's release")
    channels = []
    for host_id, address in addresses.items():
        channel = connect(address)
        channels.append(channel)
        stub = ls_grpc.LocalSchedulerStub(channel)
        stub.StartReplica(local_scheduler_pb2.StartReplicaRequest(
            kernel_id=f"hog-{host_id}", replica_id=1, raft_address="127.0.0.1:0", key="h" * 32,
            resources=common_pb2.ResourceSpec(millicpus=100, memory_mb=64, gpus=1)), timeout=60)
        held = stub.CommitGpus(local_scheduler_pb2.CommitGpusRequest(
            kernel_id=f"hog-{host_id}", replica_id=1, request_id="hold", gpus=1), timeout=10)
        assert held.committed

    # Nowhere to go: every host holds a replica of b already. The cell waits (told why) for
    # cell_queue_timeout_s, then gets a clear error; nothing runs.
    time.sleep(1.5)  # several heartbeats: the hogs' GPUs stay committed (not b's requests)
    started = time.monotonic()
    refused = run_cell(kc, "v = 'changed'")
    content = refused["reply"]["content"]
    assert content["status"] == "error" and content["ename"] == "NotebookOSNoGPUs"
    assert "busy" in content["evalue"] and "no host can take" in content["evalue"]
    assert "waited" in content["evalue"] and "cell_queue_timeout_s" in content["evalue"]
    assert refused["statuses"] == ["busy", "idle"]
    assert 2 <= time.monotonic() - started < 30
    told = [m["content"]["text"] for m in refused["outputs"] if m["msg_type"] == "stream"]
    assert told and "waiting for 1 GPU(s)" in told[0], refused["outputs"]

    # A new host with a prewarmed process joins: the next cell migrates a replica there.
    cluster.start_ls("host-3", gpus=1, prewarm=1)
    cluster.wait_hosts(4)
    cluster.wait(lambda: next(h for h in cluster.status().hosts
                              if h.host_id == "host-3").prewarm_pool_size == 1, 60,
                 "a prewarmed process on host-3")
    ran = run_cell(kc, "v + '!'")
    assert result_text(ran) == "'kept!'"
    assert ran["statuses"] == ["busy", "idle"]
    status = cluster.kernel(b)
    executor_host = next(r.host_id for r in status.replicas
                         if r.replica_id == status.executor_replica_id)
    assert executor_host == "host-3"
    # Its reply says where it ran and that it waited for a migration, and why (issue 16).
    block = ran["reply"]["metadata"]["notebookos"]
    assert block["host_id"] == "host-3" and block["waited_for"] == "migration", block
    assert "moved to host-3" in block["wait_reason"] and "busy" in block["wait_reason"], block
    assert len({r.host_id for r in status.replicas}) == 3
    assert "prewarmed=True" in cluster.log("host-3")
    for channel in channels:
        channel.close()


def test_a_kernel_of_one_replica_is_not_migrated_and_keeps_its_state(make_cluster):
    """A migration takes a replica out of its Raft group and a new one joins the others: a
    kernel of one replica has no other, so it is refused with the reason before anything is
    touched (it used to stop the replica and rebuild the kernel from its checkpoint, losing the
    cells since), and a cell that finds its host busy waits for it."""
    cluster = make_cluster({"NOTEBOOKOS_CLUSTER_REPLICAS_PER_KERNEL": "1",
                            "NOTEBOOKOS_CLUSTER_MAX_SUBSCRIPTION_RATIO": "7"})
    cluster.start_gs()
    for i in range(2):
        cluster.start_ls(f"host-{i}", gpus=1, prewarm=0)
    cluster.wait_hosts(2)
    kernel_id, kc = cluster.start_kernel(gpus=1)
    assert result_text(run_cell(kc, "kept = 41 + 1\nkept")) == "42"
    replica = cluster.kernel(kernel_id).replicas[0]
    other = next(h.host_id for h in cluster.status().hosts if h.host_id != replica.host_id)
    with pytest.raises(grpc.RpcError) as refused:
        cluster.stub.MigrateReplica(global_scheduler_pb2.MigrateReplicaRequest(
            kernel_id=kernel_id, replica_id=replica.replica_id, target_host_id=other),
            timeout=30)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "a kernel of one replica cannot migrate" in refused.value.details()
    after = cluster.kernel(kernel_id).replicas
    assert [(r.replica_id, r.host_id, r.pid) for r in after] == [
        (replica.replica_id, replica.host_id, replica.pid)]
    assert result_text(run_cell(kc, "kept")) == "42"


def test_two_migrations_of_one_kernel_at_once_run_one_after_the_other(make_cluster):
    """Two migrations of one kernel asked at the same time (the autoscaler draining a host
    while a waiting cell moves another replica: test_ces_scaling saw it) each stop a replica
    before its replacement joins: run together they left one of three members alive, the group
    without a Raft majority and the membership change hanging. They run one after the other,
    and the kernel keeps its state and its three replicas."""
    cluster = make_cluster({"NOTEBOOKOS_CLUSTER_MAX_SUBSCRIPTION_RATIO": "7"})
    cluster.start_gs()
    for i in range(5):
        cluster.start_ls(f"host-{i}", gpus=1, prewarm=1)
    cluster.wait_hosts(5)
    kernel_id, kc = cluster.start_kernel(gpus=1)
    assert result_text(run_cell(kc, "kept = 41 + 1\nkept")) == "42"
    replicas = cluster.kernel(kernel_id).replicas
    free = sorted({h.host_id for h in cluster.status().hosts} - {r.host_id for r in replicas})
    moves = [(replicas[0].replica_id, free[0]), (replicas[1].replica_id, free[1])]
    outcomes: dict[int, object] = {}

    def migrate(replica_id: int, host_id: str) -> None:
        try:
            outcomes[replica_id] = cluster.stub.MigrateReplica(
                global_scheduler_pb2.MigrateReplicaRequest(
                    kernel_id=kernel_id, replica_id=replica_id, target_host_id=host_id),
                timeout=90)
        except grpc.RpcError as exc:
            outcomes[replica_id] = exc

    threads = [threading.Thread(target=migrate, args=move) for move in moves]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    failed = {rid: o for rid, o in outcomes.items() if isinstance(o, grpc.RpcError)}
    assert len(outcomes) == 2 and not failed, {
        rid: (o.code(), o.details()) for rid, o in failed.items()}
    after = cluster.kernel(kernel_id).replicas
    assert sorted(r.host_id for r in after) == sorted(
        {r.host_id for r in replicas[2:]} | set(free)), after
    assert result_text(run_cell(kc, "kept + 1")) == "43"


def test_an_operators_migration_is_decided_by_the_cycle_and_skips_a_draining_host(make_cluster):
    """``MigrateReplica`` naming no target is decided by the scheduling cycle (issue 35): it
    used to ask the policy directly, which knew nothing of draining hosts, and sent the replica
    to a host being emptied for maintenance (the most idle one). Named explicitly, such a host
    is refused with the reason, before the replica is touched; the state is kept throughout."""
    cluster = make_cluster({"NOTEBOOKOS_CLUSTER_MAX_SUBSCRIPTION_RATIO": "7"})
    cluster.start(3, gpus=1)
    kernel_id, kc = cluster.start_kernel(gpus=1)
    assert result_text(run_cell(kc, "kept = 41 + 1\nkept")) == "42"
    cluster.start_ls("host-spare", gpus=1, prewarm=0)
    cluster.start_ls("host-draining", gpus=2, prewarm=0)  # the most idle: the policy's choice
    cluster.wait_hosts(5)
    drained = cluster.stub.DrainHost(global_scheduler_pb2.DrainHostRequest(
        host_id="host-draining", deadline_s=5), timeout=30, metadata=join_token_metadata())
    assert (drained.moved, drained.stayed) == (0, 0)
    before = cluster.kernel(kernel_id).replicas
    with pytest.raises(grpc.RpcError) as refused:
        cluster.stub.MigrateReplica(global_scheduler_pb2.MigrateReplicaRequest(
            kernel_id=kernel_id, replica_id=before[0].replica_id,
            target_host_id="host-draining"), timeout=30)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "host-draining" in refused.value.details() and "draining" in refused.value.details()
    assert [(r.replica_id, r.host_id) for r in cluster.kernel(kernel_id).replicas] == [
        (r.replica_id, r.host_id) for r in before]

    moved = cluster.stub.MigrateReplica(global_scheduler_pb2.MigrateReplicaRequest(
        kernel_id=kernel_id, replica_id=before[0].replica_id), timeout=90)
    assert moved.target_host_id == "host-spare" and moved.replica.host_id == "host-spare"
    hosts = {r.host_id for r in cluster.kernel(kernel_id).replicas}
    assert "host-spare" in hosts and "host-draining" not in hosts and len(hosts) == 3
    assert result_text(run_cell(kc, "kept + 1")) == "43"
