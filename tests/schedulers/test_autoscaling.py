"""The autoscaler adds a Local Scheduler (local provider, virtual GPUs) when committed GPUs pass
the expected capacity, and releases an idle host when the load is gone."""

from __future__ import annotations

import time

import pytest
from sched_cluster import make_cluster_fixture, result_text, run_cell  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(150)


def test_scale_out_under_load_and_in_when_idle(make_cluster):
    cluster = make_cluster({
        "NOTEBOOKOS_GLOBAL_SCHEDULER_AUTOSCALE": "true",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_AUTOSCALE_INTERVAL_S": "1",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_MIN_HOSTS": "3",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_MAX_HOSTS": "5",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_SCALING_BUFFER_HOSTS": "1",
        "NOTEBOOKOS_LOCAL_SCHEDULER_VIRTUAL_GPUS": "2",
        "NOTEBOOKOS_LOCAL_SCHEDULER_PREWARM_POOL_SIZE": "0",
    })
    cluster.start_gs()
    for i in range(3):
        cluster.start_ls(f"host-{i}", gpus=2)
    cluster.wait_hosts(3)
    a, kc_a = cluster.start_kernel(gpus=2)
    b, kc_b = cluster.start_kernel(gpus=2)
    # Idle: min_hosts. (An autoscaler tick before the three Local Schedulers registered saw a
    # cluster below min_hosts and provisioned hosts, which it releases again once idle.)
    cluster.wait(lambda: len(cluster.status().hosts) == 3, 60, "idle at min_hosts")
    before = {h.host_id for h in cluster.status().hosts}

    # Two 2-GPU cells at once: 4 committed GPUs x 1.05 need 3 hosts, plus a spare one.
    kc_a.execute("import time; time.sleep(10); a = 1")
    kc_b.execute("import time; time.sleep(10); b = 2")
    cluster.wait(lambda: len(cluster.status().hosts) == 4, 40, "a fourth host added")
    added = [h for h in cluster.status().hosts if h.host_id not in before]
    assert len(added) == 1 and added[0].capacity.gpus == 2, added
    added = [h.host_id for h in added]
    kc_a.get_shell_msg(timeout=60)
    kc_b.get_shell_msg(timeout=60)

    # Idle again: the spare host is released (it holds no replica) and the kernels go on.
    cluster.wait(lambda: len(cluster.status().hosts) == 3, 40, "back to three hosts")
    assert added[0] not in {h.host_id for h in cluster.status().hosts}
    assert result_text(run_cell(kc_a, "a")) == "1"
    assert result_text(run_cell(kc_b, "b")) == "2"


def test_static_pool_keeps_idle_hosts_in_reserve_and_brings_them_back(make_cluster):
    cluster = make_cluster({
        "NOTEBOOKOS_GLOBAL_SCHEDULER_AUTOSCALE": "true",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_HOST_PROVIDER": "static",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_AUTOSCALE_INTERVAL_S": "1",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_MIN_HOSTS": "3",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_SCALING_BUFFER_HOSTS": "1",
    })
    cluster.start_gs()
    for i in range(4):
        cluster.start_ls(f"host-{i}", gpus=2)
    cluster.wait_hosts(4)

    def reserved() -> list[str]:
        return [h.host_id for h in cluster.status().hosts if h.draining]

    # Idle: one host goes into reserve (still registered, takes no replicas).
    cluster.wait(lambda: len(reserved()) == 1, 30, "a host in reserve")
    spare = reserved()[0]
    a, kc_a = cluster.start_kernel(gpus=2)
    b, kc_b = cluster.start_kernel(gpus=2)
    for kernel_id in (a, b):
        assert spare not in {r.host_id for r in cluster.kernel(kernel_id).replicas}

    # Load: 4 committed GPUs need 3 hosts plus the spare one, so the reserve comes back.
    kc_a.execute("import time; time.sleep(6)")
    kc_b.execute("import time; time.sleep(6)")
    cluster.wait(lambda: not reserved(), 30, "the reserve back at work")
    assert len(cluster.status().hosts) == 4
    kc_a.get_shell_msg(timeout=60)
    kc_b.get_shell_msg(timeout=60)
    cluster.wait(lambda: len(reserved()) == 1, 30, "a host back in reserve when idle")
    assert all(p.poll() is None for p in cluster.ls.values())  # nothing was stopped
    assert result_text(run_cell(kc_a, "1 + 1")) == "2"


def test_scale_in_moves_a_hosts_replicas_off_before_releasing_it(make_cluster):
    cluster = make_cluster({
        "NOTEBOOKOS_GLOBAL_SCHEDULER_AUTOSCALE": "true",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_HOST_PROVIDER": "static",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_AUTOSCALE_INTERVAL_S": "12",  # first decision after setup
        "NOTEBOOKOS_GLOBAL_SCHEDULER_MIN_HOSTS": "3",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_SCALING_BUFFER_HOSTS": "0",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_SCALE_IN": "idle",  # move replicas to release a host
    })
    cluster.start_gs()
    for i in range(4):
        cluster.start_ls(f"host-{i}", gpus=2)
    cluster.wait_hosts(4)
    a, kc_a = cluster.start_kernel(gpus=2)
    kc_a.execute("import time; time.sleep(20)")  # a's executor host is busy from now on
    cluster.wait(lambda: cluster.status().gpus_committed == 2, 10, "a's cell running")
    busy = next(h.host_id for h in cluster.status().hosts if h.gpus_committed == 2)
    b, kc_b = cluster.start_kernel(gpus=2)  # placed on the three hosts with idle GPUs
    assert result_text(run_cell(kc_b, "kept = 'b'\nkept")) == "'b'"
    b_hosts = {r.host_id for r in cluster.kernel(b).replicas}
    assert busy not in b_hosts
    # Every host holds replicas now; the one with the fewest that is not busy holds one of b's.
    victim = next(h for h in sorted(b_hosts) if h not in {r.host_id for r in
                                                          cluster.kernel(a).replicas})
    assert all(h.draining is False for h in cluster.status().hosts)

    # The next decision wants 3 hosts: the victim's replica moves to the busy host (the only one
    # without a replica of b), then the victim goes into reserve.
    def moved() -> bool:
        hosts = [r.host_id for r in cluster.kernel(b).replicas if r.pid > 0]
        return victim not in hosts and len(hosts) == 3

    cluster.wait(lambda: any(h.draining for h in cluster.status().hosts) and moved(), 40,
                 "a scale-in that moved b's replica")
    reserved = [h.host_id for h in cluster.status().hosts if h.draining]
    assert reserved == [victim]
    b_hosts_after = {r.host_id for r in cluster.kernel(b).replicas}
    assert victim not in b_hosts_after and busy in b_hosts_after and len(b_hosts_after) == 3
    assert result_text(run_cell(kc_b, "kept")) == "'b'"


def test_the_local_provider_releases_only_the_hosts_it_started(make_cluster):
    """Found by the fault campaign: with more idle hosts than min_hosts, the autoscaler shut down
    one of ``notebookos up``'s Local Schedulers, which up started again, and the next tick shut
    it down again (every 15 s for the rest of the run). The local provider gives back only the
    hosts it started itself."""
    cluster = make_cluster({
        "NOTEBOOKOS_GLOBAL_SCHEDULER_AUTOSCALE": "true",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_AUTOSCALE_INTERVAL_S": "1",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_MIN_HOSTS": "1",
        "NOTEBOOKOS_GLOBAL_SCHEDULER_SCALING_BUFFER_HOSTS": "0",
    })
    cluster.start_gs()
    for i in range(3):
        cluster.start_ls(f"host-{i}", gpus=2)
    cluster.wait_hosts(3)
    time.sleep(5)  # several ticks of an autoscaler that wants one host
    assert all(p.poll() is None for p in cluster.ls.values()), cluster.log("gs")
    assert len(cluster.status().hosts) == 3
    assert "scaling in host host-" not in cluster.log("gs")
