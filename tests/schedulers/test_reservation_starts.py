"""Reservation kernels started at the same moment each get their GPUs: the host's GPUs are set
aside in the scheduler's model when the host is chosen, not only once the replica runs and binds
them (before, concurrent starts all chose the host with the most idle GPUs and all but one
failed to bind: 9 of 10 kernels of a Sensei replay slice)."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from sched_cluster import ls_gpus_committed, make_cluster_fixture  # noqa: F401 - fixture

from notebookos.proto import common_pb2, global_scheduler_pb2

pytestmark = pytest.mark.timeout(240)


def test_reservation_kernels_started_together_all_get_their_gpus(make_cluster) -> None:  # noqa: ANN001
    cluster = make_cluster()
    cluster.start_gs("--policy", "reservation")
    for i in range(3):
        cluster.start_ls(f"host-{i}", gpus=4)
    cluster.wait_hosts(3)

    def start(n: int) -> str:  # StartKernel as the provisioner sends it (no client here)
        kernel_id = f"k-together-{n}"
        cluster.stub.StartKernel(global_scheduler_pb2.StartKernelRequest(
            kernel_id=kernel_id, key=uuid.uuid4().hex,
            resources=common_pb2.ResourceSpec(millicpus=100, memory_mb=128, gpus=4)),
            timeout=90)
        return kernel_id

    with ThreadPoolExecutor(3) as pool:
        kernels = list(pool.map(start, range(3)))
    hosts = {}
    for kernel_id in kernels:
        status = cluster.kernel(kernel_id)
        (replica,) = status.replicas
        hosts[kernel_id] = replica.host_id
    assert len(set(hosts.values())) == 3, hosts
    committed = {h.host_id: ls_gpus_committed(h.address) for h in cluster.status().hosts}
    assert committed == {"host-0": 4, "host-1": 4, "host-2": 4}, committed
