"""The registry kept in Redis survives a Global Scheduler restart; an operator's MigrateReplica
moves a replica and the kernel keeps its state (real daemons and replicas on loopback)."""

from __future__ import annotations

import signal
import uuid

import grpc
import pytest
import redis
from sched_cluster import make_cluster_fixture, result_text, run_cell  # noqa: F401 - fixture

from notebookos.proto import global_scheduler_pb2

pytestmark = pytest.mark.timeout(120)


def test_registry_in_redis_survives_a_restart_and_an_operator_can_migrate(make_cluster,
                                                                          redis_url):
    prefix = f"notebookos-test:{uuid.uuid4().hex[:8]}"
    cluster = make_cluster({"NOTEBOOKOS_GLOBAL_SCHEDULER_REGISTRY_REDIS_URL": redis_url,
                            "NOTEBOOKOS_GLOBAL_SCHEDULER_REGISTRY_REDIS_PREFIX": prefix})
    client = redis.Redis.from_url(redis_url)
    try:
        cluster.start_gs()
        for i in range(4):
            cluster.start_ls(f"host-{i}")
        cluster.wait_hosts(4)
        kernel_id, kc = cluster.start_kernel(gpus=1)
        # written before the start was answered (registry_writer.FlushBeforeAnswer)
        assert client.hexists(f"{prefix}:kernels", kernel_id)
        assert run_cell(kc, "data = [1, 2]")["reply"]["content"]["status"] == "ok"
        assert client.hexists(f"{prefix}:kernels", kernel_id)
        assert not (cluster.workdir / "state" / "global_scheduler" / "registry.json").exists()

        cluster.gs.send_signal(signal.SIGKILL)
        cluster.gs.wait(10)
        cluster.start_gs()
        cluster.wait_hosts(4)
        assert result_text(run_cell(kc, "data + [3]")) == "[1, 2, 3]"

        # MigrateReplica moves a replica to the host that holds none; the namespace is intact.
        status = cluster.kernel(kernel_id)
        free = ({f"host-{i}" for i in range(4)} - {r.host_id for r in status.replicas}).pop()
        victim = next(r.replica_id for r in status.replicas
                      if r.replica_id != status.executor_replica_id)
        moved = cluster.stub.MigrateReplica(global_scheduler_pb2.MigrateReplicaRequest(
            kernel_id=kernel_id, replica_id=victim, target_host_id=free), timeout=90)
        assert moved.target_host_id == free and moved.replica.host_id == free
        assert free in {r.host_id for r in cluster.kernel(kernel_id).replicas}
        assert victim not in {r.replica_id for r in cluster.kernel(kernel_id).replicas}
        assert result_text(run_cell(kc, "len(data)")) == "2"
        with pytest.raises(grpc.RpcError) as err:
            cluster.stub.MigrateReplica(global_scheduler_pb2.MigrateReplicaRequest(
                kernel_id=kernel_id, replica_id=moved.replica.replica_id, target_host_id=free),
                timeout=30)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
        client.close()
