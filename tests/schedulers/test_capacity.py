"""Oversubscription by default (issue 19.1): a cluster started with default settings runs the
paper's dynamic subscription-ratio limit, the same policy and defaults the simulator runs, so idle
notebooks far outnumber GPUs; a refusal says why. Real daemons and replicas on loopback."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from sched_cluster import make_cluster_fixture, result_text, run_cell  # noqa: F401 - fixture

from notebookos.policies import get_policy
from notebookos.policies.defaults import MAX_SUBSCRIPTION_RATIO

pytestmark = pytest.mark.timeout(240)

NOTEBOOKS = 18  # 3 hosts x 2 GPUs: SR 3 on every host, three times what reservation allows


def test_default_settings_open_three_times_more_notebooks_than_gpus(make_cluster):
    cluster = make_cluster()
    assert not any(k.startswith("NOTEBOOKOS_CLUSTER_") for k in cluster.env)
    cluster.start_gs()
    for i in range(3):
        cluster.start_ls(f"host-{i}", gpus=2)
    cluster.wait_hosts(3)
    assert get_policy("notebookos").max_subscription_ratio == MAX_SUBSCRIPTION_RATIO

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=3) as pool:
        kernels = list(pool.map(lambda _: cluster.start_kernel(gpus=1, timeout=120),
                                range(NOTEBOOKS)))
    elapsed = time.monotonic() - started
    status = cluster.status()
    assert len(kernels) == NOTEBOOKS
    assert sum(h.capacity.gpus for h in status.hosts) == 6
    assert [round(h.subscription_ratio, 3) for h in status.hosts] == [3.0] * 3
    # The paper's limit (3.4.1): subscribed GPUs / GPUs of the cluster = 54 / 6, capped at 7.
    assert status.subscription_ratio_limit == pytest.approx(MAX_SUBSCRIPTION_RATIO)
    # Every notebook is a working kernel, not just a registration.
    kernel_id, kc = kernels[-1]
    assert result_text(run_cell(kc, "n = 6 * 7\nn")) == "42"
    assert status.gpus_committed == 0

    # A refusal carries its reason: no host has 3 GPUs.
    with pytest.raises(grpc.RpcError) as err:
        cluster.start_kernel(gpus=3)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "no host can hold the request" in err.value.details()
    print(f"{NOTEBOOKS} notebooks opened in {elapsed:.1f} s")
