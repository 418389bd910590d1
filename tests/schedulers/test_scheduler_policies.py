"""Each of the paper's four policies drives the live schedulers through a small workload: the
kernel starts with the policy's replica count (none between cells for the per-cell container
policies ``batch`` and ``lcp``: the kernel is parked), cells run and keep state, GPUs are bound
per cell (or, for ``reservation``, for the kernel's life)."""

from __future__ import annotations

import pytest
from sched_cluster import make_cluster_fixture, result_text, run_cell  # noqa: F401 - fixture

from notebookos.policies import ContainerLifetime, get_policy
from notebookos.proto import common_pb2

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("policy", ["notebookos", "reservation", "batch", "lcp"])
def test_policy_runs_a_small_workload_end_to_end(make_cluster, policy):
    cluster = make_cluster({"NOTEBOOKOS_GLOBAL_SCHEDULER_WARM_CONTAINERS_PER_HOST": "1"})
    cluster.start_gs("--policy", policy)
    for i in range(3):
        cluster.start_ls(f"host-{i}", gpus=2)
    cluster.wait_hosts(3)
    assert cluster.status().policy == policy
    kernel_id, kc = cluster.start_kernel(gpus=1)
    status = cluster.kernel(kernel_id)
    replicas = status.replicas
    if get_policy(policy).container_lifetime is ContainerLifetime.CELL:
        assert status.state == common_pb2.KERNEL_STATE_PARKED and not replicas
    else:
        assert len(replicas) == get_policy(policy).replicas_per_kernel
    assert len({r.host_id for r in replicas}) == len(replicas)
    for i in range(3):
        run = run_cell(kc, f"total = {i} + (total if {i} else 0)\ntotal")
        assert run["reply"]["content"]["status"] == "ok"
        assert run["statuses"] == ["busy", "idle"]
    assert result_text(run_cell(kc, "total")) == "3"
    committed = cluster.status().gpus_committed
    assert committed == (1 if policy == "reservation" else 0)
