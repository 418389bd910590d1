"""The resource and cluster model: validation, accounting, and its invariants under any sequence."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from notebookos.cluster import AccountingError, Cluster, Host, ReplicaState
from notebookos.resources import ZERO, InvalidResourceSpec, ResourceSpec


def spec(cpu: int = 1000, mem: int = 1024, gpus: int = 1, vram: float = 8.0) -> ResourceSpec:
    return ResourceSpec(cpu, mem, gpus, vram)


# -- ResourceSpec -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"millicpus": -1}, "millicpus"),
        ({"memory_mb": 1.5}, "memory_mb"),
        ({"gpus": True}, "gpus"),
        ({"gpus": "2"}, "gpus"),
        ({"vram_gb": -0.1}, "vram_gb"),
        ({"vram_gb": math.nan}, "vram_gb"),
        ({"vram_gb": math.inf}, "vram_gb"),
    ],
)
def test_invalid_spec_names_field_and_value(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidResourceSpec) as err:
        ResourceSpec(**kwargs)
    assert field in str(err.value) and repr(next(iter(kwargs.values()))) in str(err.value)


def test_spec_arithmetic_and_fit() -> None:
    a, b = spec(1000, 100, 1, 2.0), spec(500, 50, 1, 1.0)
    assert a + b == spec(1500, 150, 2, 3.0)
    assert a - b == spec(500, 50, 0, 1.0)
    assert b.fits_within(a) and not a.fits_within(b)
    assert a.shortfall(b) == ["millicpus 1000 > 500", "memory_mb 100 > 50", "vram_gb 2.0 > 1.0"]
    with pytest.raises(InvalidResourceSpec):
        b - a
    assert spec().scaled(3) == spec(3000, 3072, 3, 24.0)


def test_spec_from_dict_rejects_unknown_fields() -> None:
    assert ResourceSpec.from_dict({"gpus": 2}) == ResourceSpec(gpus=2)
    with pytest.raises(InvalidResourceSpec, match="unknown field"):
        ResourceSpec.from_dict({"gpu": 2})
    with pytest.raises(InvalidResourceSpec, match="mapping"):
        ResourceSpec.from_dict([("gpus", 2)])  # type: ignore[arg-type]


@given(st.builds(ResourceSpec, st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 64),
                 st.floats(0, 1e4)),
       st.builds(ResourceSpec, st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 64),
                 st.floats(0, 1e4)))
def test_add_then_subtract_is_identity(a: ResourceSpec, b: ResourceSpec) -> None:
    back = (a + b) - b
    assert (back.millicpus, back.memory_mb, back.gpus) == (a.millicpus, a.memory_mb, a.gpus)
    assert back.vram_gb == pytest.approx(a.vram_gb, abs=1e-6)


# -- Host ------------------------------------------------------------------------------------


def test_host_commit_binds_distinct_device_ids_and_release_frees_them() -> None:
    host = Host("h", spec(8000, 64000, 4, 80.0))
    first = host.commit("k/0", spec(gpus=2))
    second = host.commit("k2/0", spec(gpus=2))
    assert set(first).isdisjoint(second) and sorted(first + second) == [0, 1, 2, 3]
    assert host.idle_gpus == 0
    with pytest.raises(AccountingError, match="cannot commit"):
        host.commit("k3/0", spec(gpus=1))
    assert host.release("k/0") == first
    assert host.commit("k3/0", spec(gpus=1)) == (min(first),)


def test_failed_operations_change_nothing() -> None:
    host = Host("h", spec(2000, 4096, 2, 16.0), oversubscription=1.5)
    host.subscribe("a", spec(gpus=2))
    before = (host.subscribed, host.pending, host.committed, host.idle_gpus)
    for op in (
        lambda: host.subscribe("a", spec(gpus=1)),  # twice
        lambda: host.subscribe("b", spec(gpus=2)),  # past the subscription limit (3 GPUs)
        lambda: host.subscribe("c", spec(gpus=3)),  # can never fit
        lambda: host.commit("d", spec(gpus=3)),
        lambda: host.commit("d", spec(gpus=1), device_ids=[7]),
        lambda: host.release("nobody"),
        lambda: host.unsubscribe("nobody"),
        lambda: host.cancel_reservation("nobody"),
        lambda: host.reserve("e", spec(gpus=5)),
    ):
        with pytest.raises(AccountingError):
            op()
        assert (host.subscribed, host.pending, host.committed, host.idle_gpus) == before


def test_reservation_converts_to_commitment() -> None:
    host = Host("h", spec(4000, 8192, 2, 16.0))
    host.reserve("k/1", spec(gpus=2))
    assert host.idle_gpus == 0 and host.pending.gpus == 2
    assert not host.can_commit(spec(gpus=2)) and host.can_commit(spec(gpus=2), owner="k/1")
    host.commit("k/1", spec(gpus=2))
    assert host.pending == ZERO and host.committed.gpus == 2


def test_subscription_ratio_follows_design_formula() -> None:
    host = Host("h", spec(64000, 512000, 8, 640.0))
    for i in range(6):
        host.subscribe(f"k{i}/0", spec(gpus=2))
    assert host.subscription_ratio(3) == pytest.approx(12 / (8 * 3))
    assert Host("cpu", spec(gpus=0, vram=0)).subscription_ratio() == 0.0


def test_host_validates_device_ids() -> None:
    with pytest.raises(ValueError, match="distinct"):
        Host("h", spec(gpus=2), gpu_device_ids=[0, 0])
    assert Host("h", spec(gpus=2), gpu_device_ids=[3, 5]).commit("x", spec(gpus=1)) == (3,)


# -- Cluster ---------------------------------------------------------------------------------


def test_cluster_places_replicas_on_distinct_hosts_and_reports_status() -> None:
    cluster = Cluster()
    for i in range(4):
        cluster.add_host(Host(f"h{i}", spec(8000, 32000, 2, 32.0), address=f"10.0.0.{i}"))
    cluster.add_kernel("k", spec(gpus=1))
    for r in range(3):
        cluster.place_replica("k", r, f"h{r}")
    with pytest.raises(AccountingError, match="already has a replica on host h0"):
        cluster.place_replica("k", 3, "h0")
    cluster.get_host("h1").commit("k/1", spec(gpus=1))
    cluster.get_kernel("k").executor = 1
    status = cluster.status()
    h1 = next(h for h in status["hosts"] if h["id"] == "h1")
    assert h1["gpus"]["total"] == 2 and h1["gpus"]["committed"] == 1 and h1["gpus"]["pending"] == 0
    assert h1["subscription_ratio"] == pytest.approx(1 / 6, abs=1e-6)
    (kernel,) = status["kernels"]
    assert kernel["executor"] == 1
    assert [r["host_id"] for r in kernel["replicas"]] == ["h0", "h1", "h2"]
    assert {r["state"] for r in kernel["replicas"]} == {str(ReplicaState.STARTING)}
    assert cluster.subscribed_gpus == 3 and cluster.committed_gpus == 1
    with pytest.raises(AccountingError, match="still holds"):
        cluster.remove_host("h1")
    cluster.remove_kernel("k")
    assert cluster.subscribed_gpus == 0 and cluster.committed_gpus == 0
    cluster.remove_host("h1")
    assert cluster.total_gpus == 6


def test_idle_index_orders_hosts_by_idle_gpus() -> None:
    cluster = Cluster()
    for i, gpus in enumerate([2, 8, 4, 8]):
        cluster.add_host(Host(f"h{i}", spec(8000, 32000, gpus, 80.0)))
    cluster.get_host("h3").commit("x", spec(gpus=5))
    assert [h.host_id for h in cluster.hosts_by_idle_gpus()] == ["h1", "h2", "h3", "h0"]
    assert [h.host_id for h in cluster.hosts_by_idle_gpus(4)] == ["h1", "h2"]
    cluster.get_host("h3").release("x")
    assert [h.host_id for h in cluster.hosts_by_idle_gpus(8)] == ["h1", "h3"]


# -- invariants under arbitrary operation sequences -------------------------------------------

OWNERS = [f"k{i}/0" for i in range(6)]
SPECS = st.builds(ResourceSpec, st.integers(0, 6000), st.integers(0, 20000), st.integers(0, 6),
                  st.floats(0, 60, allow_nan=False))


class HostAccounting(RuleBasedStateMachine):
    """Any sequence of operations keeps the books consistent; failures change nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.cluster = Cluster()
        self.host = self.cluster.add_host(Host("h", ResourceSpec(8000, 32000, 4, 64.0)))
        self.other = self.cluster.add_host(Host("g", ResourceSpec(4000, 16000, 2, 32.0)))

    def _attempt(self, op) -> None:
        before = (self.host.subscribed, self.host.pending, self.host.committed,
                  self.host.owners, self.host.idle_gpus)
        try:
            op()
        except AccountingError:
            after = (self.host.subscribed, self.host.pending, self.host.committed,
                     self.host.owners, self.host.idle_gpus)
            assert after == before

    @rule(owner=st.sampled_from(OWNERS), s=SPECS)
    def subscribe(self, owner: str, s: ResourceSpec) -> None:
        self._attempt(lambda: self.host.subscribe(owner, s))

    @rule(owner=st.sampled_from(OWNERS))
    def unsubscribe(self, owner: str) -> None:
        self._attempt(lambda: self.host.unsubscribe(owner))

    @rule(owner=st.sampled_from(OWNERS), s=SPECS)
    def reserve(self, owner: str, s: ResourceSpec) -> None:
        self._attempt(lambda: self.host.reserve(owner, s))

    @rule(owner=st.sampled_from(OWNERS))
    def cancel(self, owner: str) -> None:
        self._attempt(lambda: self.host.cancel_reservation(owner))

    @rule(owner=st.sampled_from(OWNERS), s=SPECS)
    def commit(self, owner: str, s: ResourceSpec) -> None:
        self._attempt(lambda: self.host.commit(owner, s))

    @rule(owner=st.sampled_from(OWNERS))
    def release(self, owner: str) -> None:
        self._attempt(lambda: self.host.release(owner))

    @rule(owner=st.sampled_from(OWNERS))
    def drop(self, owner: str) -> None:
        self.host.release_owner(owner)

    @invariant()
    def never_negative_or_past_capacity(self) -> None:
        h = self.host
        for total in (h.subscribed, h.pending, h.committed):
            assert total.millicpus >= 0 and total.gpus >= 0 and total.vram_gb >= 0
        assert (h.pending + h.committed).fits_within(h.capacity)
        assert h.subscribed.fits_within(h.subscription_limit)
        assert 0 <= h.idle_gpus <= h.capacity.gpus

    @invariant()
    def device_ids_are_exclusive(self) -> None:
        bound = [i for owner in self.host.owners for i in (self.host.commitment_of(owner) or ())]
        assert len(bound) == len(set(bound)) == self.host.committed.gpus
        assert set(bound) <= set(self.host.gpu_device_ids)

    @invariant()
    def cluster_totals_and_index_agree(self) -> None:
        hosts = self.cluster.hosts.values()
        assert self.cluster.subscribed_gpus == sum(h.subscribed.gpus for h in hosts)
        assert self.cluster.committed_gpus == sum(h.committed.gpus for h in hosts)
        ordered = list(self.cluster.hosts_by_idle_gpus())
        assert sorted(h.host_id for h in ordered) == sorted(self.cluster.hosts)
        idles = [h.idle_gpus for h in ordered]
        assert idles == sorted(idles, reverse=True)


TestHostAccounting = HostAccounting.TestCase
TestHostAccounting.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
