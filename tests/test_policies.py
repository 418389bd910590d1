"""Unit tests of the policy objects on small hand-worked clusters."""

from __future__ import annotations

import pytest

from notebookos.cluster import Cluster, Host
from notebookos.policies import (
    GpuBinding,
    PolicyKind,
    QueuedJob,
    ScalingView,
    get_policy,
    policy_names,
)
from notebookos.resources import ResourceSpec

ONE_GPU = ResourceSpec(millicpus=1000, memory_mb=1000, gpus=1, vram_gb=1)


def make_cluster(idle_plan: dict[str, int], gpus: int = 8, oversub: float = 21.0) -> Cluster:
    """Hosts named by ``idle_plan`` with that many idle GPUs (the rest committed by 'busy')."""
    cluster = Cluster()
    for host_id, idle in idle_plan.items():
        host = cluster.add_host(Host(
            host_id, ResourceSpec(64000, 512000, gpus, 8 * 40.0), oversubscription=oversub))
        if idle < gpus:
            host.commit(f"busy-{host_id}", ResourceSpec(gpus=gpus - idle))
    return cluster


def test_registry_lists_every_policy_and_rejects_unknown_names():
    names = policy_names()
    assert names[:4] == ["notebookos", "batch", "lcp", "reservation"]
    assert {"fifo", "sjf", "srtf", "tiresias"} <= set(policy_names(PolicyKind.JOB))
    assert not set(policy_names(PolicyKind.JOB)) & set(policy_names(PolicyKind.SESSION))
    with pytest.raises(ValueError, match="installed policies: notebookos, batch, lcp"):
        get_policy("gandiva")
    with pytest.raises(ValueError, match="bad parameters for policy 'fifo'"):
        get_policy("fifo", nonsense=1)
    with pytest.raises(ValueError, match="strictly increasing"):
        get_policy("tiresias", thresholds=[10, 5])


def test_policy_parameters_describe_the_paper_baselines():
    nb, res, batch, lcp = (get_policy(n) for n in ("notebookos", "reservation", "batch", "lcp"))
    assert (nb.replicas_per_kernel, nb.gpu_binding, nb.supports_migration) == (
        3, GpuBinding.CELL, True)
    assert (res.replicas_per_kernel, res.gpu_binding) == (1, GpuBinding.SESSION)
    assert batch.container_lifetime == "cell" and not batch.backfill
    assert lcp.container_lifetime == "cell"


def test_notebookos_places_three_replicas_on_distinct_hosts_with_most_idle_gpus():
    cluster = make_cluster({"a": 2, "b": 8, "c": 5, "d": 7})
    hosts = get_policy("notebookos").choose_hosts(cluster, ONE_GPU)
    assert [h.host_id for h in hosts] == ["b", "d", "c"]
    # Only two hosts: three distinct hosts impossible.
    assert get_policy("notebookos").choose_hosts(make_cluster({"a": 8, "b": 8}), ONE_GPU) is None


def test_notebookos_refuses_hosts_past_the_subscription_ratio_limit():
    cluster = make_cluster({"a": 8, "b": 8, "c": 8, "d": 1})
    policy = get_policy("notebookos", subscription_ratio_limit=1.0)
    # Host a already holds 24 subscribed GPUs = SR 1.0 (8 GPUs x 3 replicas): one more passes 1.0.
    cluster.hosts["a"].subscribe("k0/0", ResourceSpec(gpus=8))
    cluster.hosts["a"].subscribe("k1/0", ResourceSpec(gpus=8))
    cluster.hosts["a"].subscribe("k2/0", ResourceSpec(gpus=8))
    hosts = policy.choose_hosts(cluster, ONE_GPU)
    assert [h.host_id for h in hosts] == ["b", "c", "d"]


def test_notebookos_paper_limit_is_total_subscribed_over_total_gpus():
    # Paper 3.4.1: limit = subscribed GPUs / GPUs, cluster-wide, at least 1, at most 7.
    cluster = make_cluster({"a": 8, "b": 8, "c": 8})
    policy = get_policy("notebookos")
    assert policy.sr_limit_for(cluster) == 1.0  # nothing subscribed: the floor
    for host in cluster.hosts.values():
        host.subscribe("k/x", ResourceSpec(gpus=8))
        host.subscribe("k/y", ResourceSpec(gpus=8))  # 48 subscribed GPUs on 24
    assert policy.sr_limit_for(cluster) == 2.0
    assert policy.subscription_ratio_limit == 2.0  # as last computed (notebookos status)
    # Host a: (16 + 8) / (8 x 3) = 1.0 <= 2: accepted.
    assert policy.host_acceptable(cluster, cluster.hosts["a"], ResourceSpec(gpus=8))
    capped = get_policy("notebookos", max_subscription_ratio=3.0)
    for i in range(7):  # a: 72 subscribed; limit 104/24 = 4.33, capped at 3
        cluster.hosts["a"].subscribe(f"k/z{i}", ResourceSpec(gpus=8))
    assert policy.sr_limit_for(cluster) == pytest.approx(104 / 24)
    assert capped.sr_limit_for(cluster) == 3.0
    # (72 + 8) / 24 = 3.33: under the paper's limit, over the capped one.
    assert policy.host_acceptable(cluster, cluster.hosts["a"], ResourceSpec(gpus=8))
    assert not capped.host_acceptable(cluster, cluster.hosts["a"], ResourceSpec(gpus=8))
    assert capped.host_acceptable(cluster, cluster.hosts["b"], ResourceSpec(gpus=8))


def test_notebookos_prototype_limit_follows_demand_over_busy():
    cluster = make_cluster({"a": 8, "b": 8, "c": 8})
    policy = get_policy("notebookos", sr_limit="prototype", ratio_window=2)
    assert policy.sr_limit_for(cluster) == 7.0  # nothing observed: the maximum
    for host in cluster.hosts.values():
        host.subscribe("k/x", ResourceSpec(gpus=4))  # demand = 12 / 3 = 4 GPUs
    cluster.hosts["a"].commit("k/x", ResourceSpec(gpus=1))  # busy = 1
    policy.observe(cluster)
    assert policy.subscription_ratio_limit == 4.0
    cluster.hosts["b"].commit("k/x", ResourceSpec(gpus=1))  # busy = 2 -> sample 2
    policy.observe(cluster)
    assert policy.subscription_ratio_limit == 3.0  # mean of 4 and 2
    with pytest.raises(ValueError, match="sr_limit='guess' must be one of paper, prototype"):
        get_policy("notebookos", sr_limit="guess")


def place_kernel(cluster: Cluster, hosts: list[str], request: ResourceSpec = ONE_GPU):
    kernel = cluster.add_kernel("k", request)
    for rid, host_id in enumerate(hosts):
        cluster.place_replica("k", rid, host_id)
    return kernel


def test_executor_is_sticky_then_most_idle_then_migrate():
    cluster = make_cluster({"a": 1, "b": 3, "c": 2, "d": 8})
    kernel = place_kernel(cluster, ["a", "b", "c"])
    policy = get_policy("notebookos")
    kernel.executor = 0
    assert policy.choose_executor(cluster, kernel, ONE_GPU).replica_id == 0  # sticky
    cluster.hosts["a"].commit("other", ResourceSpec(gpus=1))
    assert policy.choose_executor(cluster, kernel, ONE_GPU).replica_id == 1  # b has most idle
    decision = policy.choose_executor(cluster, kernel, ResourceSpec(gpus=4))
    assert decision.migrate and decision.replica_id is None
    migration = policy.choose_migration(cluster, kernel, ResourceSpec(gpus=4))
    assert migration.target_host_id == "d"  # the only host without a replica that fits 4 GPUs


def test_migration_without_a_target_says_so():
    cluster = make_cluster({"a": 0, "b": 0, "c": 0, "d": 1})
    kernel = place_kernel(cluster, ["a", "b", "c"])
    migration = get_policy("notebookos").choose_migration(cluster, kernel, ResourceSpec(gpus=2))
    assert migration.target_host_id is None
    assert get_policy("reservation").choose_migration(cluster, kernel, ONE_GPU) is None


def test_reservation_and_batch_pick_the_best_fitting_host():
    cluster = make_cluster({"a": 8, "b": 2, "c": 4})
    two = ResourceSpec(gpus=2)
    assert [h.host_id for h in get_policy("reservation").choose_hosts(cluster, two)] == ["b"]
    assert [h.host_id for h in get_policy("batch").choose_hosts(cluster, ResourceSpec(gpus=3))] == [
        "c"]
    assert get_policy("lcp").choose_hosts(cluster, ResourceSpec(gpus=9)) is None


def test_scaling_targets_committed_times_factor_plus_buffer():
    policy = get_policy("notebookos", subscription_ratio_limit=7.0)
    # 20 committed GPUs x 1.05 = 21 -> 3 hosts of 8, + 2 buffer = 5.
    view = ScalingView(hosts=3, gpus_per_host=8, committed_gpus=20, waiting_gpus=0,
                       subscribed_gpus=0)
    assert policy.scaling(view).add_hosts == 2
    view = ScalingView(hosts=9, gpus_per_host=8, committed_gpus=20, waiting_gpus=0,
                       subscribed_gpus=0, releasable_host_ids=("x", "y", "z"))
    assert policy.scaling(view).release_host_ids == ("x", "y")  # at most two per tick
    # Subscriptions need hosts only as an option (not in the paper): 3 x 8 x 7 = 168 per host.
    view = ScalingView(hosts=3, gpus_per_host=8, committed_gpus=0, waiting_gpus=0,
                       subscribed_gpus=169 * 4)
    assert policy.scaling(view).add_hosts == 2  # a fixed limit: on by default
    dynamic = get_policy("notebookos")
    dynamic._last_limit = 7.0
    assert dynamic.scaling(view).add_hosts == 0  # the paper's limit grows instead
    dynamic = get_policy("notebookos", scale_for_subscriptions=True)
    dynamic._last_limit = 7.0
    assert dynamic.scaling(view).add_hosts == 2
    # A kernel whose replicas found no host asks for the hosts it lacks (3.4.2's first trigger).
    view = ScalingView(hosts=3, gpus_per_host=8, committed_gpus=0, waiting_gpus=0,
                       subscribed_gpus=0, waiting_hosts=2)
    assert policy.scaling(view).add_hosts == 1  # 0 committed + 2 lacking + 2 buffer = 4 hosts
    batch = get_policy("batch")
    view = ScalingView(hosts=1, gpus_per_host=8, committed_gpus=8, waiting_gpus=9,
                       subscribed_gpus=0)
    assert batch.scaling(view).add_hosts == 2  # ceil(17 / 8) = 3 hosts


def job(job_id: str, submit: float, gpus: int, duration: float, remaining: float | None = None,
        attained: float = 0.0, seq: int = 0) -> QueuedJob:
    return QueuedJob(job_id, submit, gpus, duration,
                     duration if remaining is None else remaining, attained, seq)


def test_job_policies_order_the_queue():
    a = job("a", 0, 4, 10, remaining=9, attained=4, seq=0)
    b = job("b", 1, 4, 2, remaining=2, seq=1)
    c = job("c", 2, 2, 1, seq=2)
    ids = lambda name: [j.job_id for j in get_policy(name).order_queue([c, b, a], 5)]  # noqa: E731
    assert ids("fifo") == ["a", "b", "c"]
    assert ids("sjf") == ["c", "b", "a"]
    assert ids("srtf") == ["c", "b", "a"]
    tiresias = get_policy("tiresias", thresholds=[4])
    assert [j.job_id for j in tiresias.order_queue([c, b, a], 5)] == ["b", "c", "a"]
    assert get_policy("fifo").backfill is False and get_policy("srtf").preemptive


def test_tiresias_demotion_time_is_when_attained_service_crosses_a_threshold():
    tiresias = get_policy("tiresias", thresholds=[8, 100])
    running = job("a", 0, 4, 10, attained=4)
    assert tiresias.next_priority_change(running, now=1.0) == 2.0  # (8 - 4) / 4 GPUs
    running.attained_gpu_s = 8
    assert tiresias.queue_index(running) == 1
    assert tiresias.next_priority_change(running, now=2.0) == 25.0
    running.attained_gpu_s = 100
    assert tiresias.next_priority_change(running, now=25.0) is None


def test_placement_looks_at_a_bounded_number_of_hosts_among_ten_thousand():
    cluster = Cluster()
    for i in range(10_000):
        cluster.add_host(Host(f"h{i}", ResourceSpec(64000, 512000, 8, 320.0), oversubscription=1))
    # Every host is full of subscriptions (limit x1): nothing fits. The policy must give up after
    # its candidate limit instead of walking all 10,000 hosts.
    seen = []
    policy = get_policy("notebookos", candidate_limit=16)
    original = Host.can_subscribe

    def counting(self, spec):  # noqa: ANN001, ANN202
        seen.append(self.host_id)
        return False

    Host.can_subscribe = counting
    try:
        assert policy.choose_hosts(cluster, ONE_GPU) is None
    finally:
        Host.can_subscribe = original
    assert len(seen) == 16
