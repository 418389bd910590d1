"""Scale-in as one decision (notebookos/policies/scale_in.py, issue 35): which hosts the
autoscaler may give back, and in which order. The decision-equality test runs one recorded
sequence of cluster states (hosts added, replicas placed and removed, GPUs committed and
released, a host draining) through the live autoscaler's tick, records what it decided on each
state, and replays every recorded state through the simulator's scaling tick: the candidates and
the hosts released must be the same. As the placement cycle's test (tests/test_cycle.py), a side
that stops calling the shared decision is caught.
"""

from __future__ import annotations

import copy
import threading
from types import SimpleNamespace

import pytest

from notebookos.cluster import Cluster, Host
from notebookos.global_scheduler import autoscaler as autoscaler_module
from notebookos.global_scheduler.autoscaler import Autoscaler
from notebookos.policies import get_policy
from notebookos.policies.scale_in import releasable_hosts
from notebookos.resources import ResourceSpec
from notebookos.simulator import sessionsim
from notebookos.simulator.config import SimConfig
from notebookos.simulator.sessionsim import SessionSimulator
from notebookos.workload.model import Workload

GPH = 8
HOST = ResourceSpec(64000, 512000, GPH, 640.0)
FIXED = {"h0"}  # the host `notebookos up` started: the provider cannot release it


def _host(host_id: str) -> Host:
    return Host(host_id, HOST, oversubscription=21.0)


# -- the live side: the autoscaler's tick on a stand-in service ---------------------------------


class _Link:
    def __init__(self) -> None:
        self.draining = False


class _Provider:
    def can_release(self, host_id: str) -> bool:
        return host_id not in FIXED

    def add_hosts(self, n: int) -> list[str]:
        return []

    def wakeable(self, hosts: int, max_hosts: int) -> int:
        return 0

    def close(self) -> None:
        pass


class _Service:
    """What ``Autoscaler.tick`` reads: the lock, the cluster, the policy, the host links."""

    def __init__(self, policy) -> None:  # noqa: ANN001
        self.lock = threading.RLock()
        self.cluster = Cluster()
        self.policy = policy
        self.hosts: dict[str, _Link] = {}
        self.metrics = SimpleNamespace(scale_events=SimpleNamespace(
            labels=lambda **_: SimpleNamespace(inc=lambda: None)))
        self.on_capacity_wanted = None


def _apply(svc: _Service, step: tuple) -> None:
    cluster = svc.cluster
    kind = step[0]
    if kind == "add":
        for host_id in step[1:]:
            cluster.add_host(_host(host_id))
            svc.hosts[host_id] = _Link()
    elif kind == "place":
        _, kernel_id, gpus, where = step
        cluster.add_kernel(kernel_id, ResourceSpec(1000, 1000, gpus, 0.0))
        for rid, host_id in enumerate(where, start=1):
            cluster.place_replica(kernel_id, rid, host_id)
    elif kind == "commit":
        _, kernel_id, rid = step
        kernel = cluster.kernels[kernel_id]
        host = cluster.hosts[kernel.replicas[rid].host_id]
        host.commit(kernel.replicas[rid].owner, kernel.request)
        kernel.executor = rid
    elif kind == "reserve":
        _, kernel_id, rid = step
        kernel = cluster.kernels[kernel_id]
        cluster.hosts[kernel.replicas[rid].host_id].reserve(kernel.replicas[rid].owner,
                                                             kernel.request)
    elif kind == "release":
        _, kernel_id, rid = step
        owner = cluster.kernels[kernel_id].replicas[rid].owner
        host = cluster.hosts[cluster.kernels[kernel_id].replicas[rid].host_id]
        if host.commitment_of(owner) is not None:
            host.release(owner)
        else:
            host.cancel_reservation(owner)
    elif kind == "remove":
        cluster.remove_kernel(step[1])
    elif kind == "draining":
        svc.hosts[step[1]].draining = step[2]
    else:  # pragma: no cover - a typo in the sequence
        raise ValueError(step)


# The recorded sequence: each entry, the changes applied before one autoscaler tick.
SEQUENCE = [
    [("add", "h0", "h1", "h2", "h3", "h4", "h5")],  # all empty: newest first, h0 kept
    [("place", "a", 2, ["h1", "h2", "h3"]), ("place", "b", 1, ["h3", "h4", "h5"])],
    [("commit", "a", 2)],  # h2 bound: never a candidate
    [("add", "h6", "h7")],  # new empty hosts go first
    [("reserve", "b", 3)],  # h5 pending: not a candidate either
    [("release", "a", 2), ("release", "b", 3), ("commit", "b", 1)],  # h3 bound now
    [("draining", "h7", True)],  # the live autoscaler releases h7 already: kept
    [("draining", "h7", False), ("remove", "a")],  # h1, h2 empty again
    [("remove", "b")],
]


def _live_run(policy_params: dict) -> tuple[list[tuple], list[list[str]], list[tuple]]:
    """The live autoscaler on the sequence: what it decided on each state (the recorded
    state, its scale_in mode and vetoes, the candidates) and the hosts it released."""
    svc = _Service(get_policy(**policy_params))
    auto = Autoscaler(svc, _Provider(), interval_s=1.0, gpus_per_host=GPH, max_hosts=100)
    released: list[str] = []
    auto.release = released.append  # the decision, not the drain (host_drain.py has its tests)
    records: list[tuple] = []
    original = autoscaler_module.releasable_hosts

    def spy(cluster, mode, *, keep, limit):  # noqa: ANN001, ANN202
        kept = frozenset(h for h in cluster.hosts if keep(h))
        records.append((copy.deepcopy(cluster), mode, kept, limit,
                        original(cluster, mode, keep=keep, limit=limit)))
        return records[-1][-1]

    autoscaler_module.releasable_hosts = spy
    releases: list[list[str]] = []
    draining: list[tuple] = []
    try:
        for changes in SEQUENCE:
            for step in changes:
                _apply(svc, step)
            before = len(records)
            released.clear()
            auto.tick()
            assert len(records) == before + 1, "the live tick did not run the shared decision"
            releases.append(list(released))
            draining.append(tuple(h for h, link in svc.hosts.items() if link.draining))
    finally:
        autoscaler_module.releasable_hosts = original
    return records, releases, draining


# -- the simulator's side: its scaling tick on the state the live autoscaler saw ----------------


def _sim_decides(record: tuple, policy_params: dict) -> tuple[list[str], list[str]]:
    """The simulator's scaling tick (``SessionSimulator._autoscale``) on a recorded state, the
    live vetoes as its reserved hosts: the candidates it computed and the hosts it released."""
    snapshot, _mode, kept, _limit, _ = record
    config = SimConfig(hosts=0, gpus_per_host=GPH, autoscale=True, drain_hysteresis_hosts=0)
    sim = SessionSimulator(Workload(()), get_policy(**policy_params), config)
    sim.cluster = copy.deepcopy(snapshot)
    sim.reserved = dict.fromkeys(sorted(kept))
    sim.maybe_empty = True
    seen: list[list[str]] = []
    original = sessionsim.releasable_hosts

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        seen.append(original(*args, **kwargs))
        return seen[-1]

    sessionsim.releasable_hosts = spy
    released: list[str] = []
    remove_host = sim.cluster.remove_host
    sim.cluster.remove_host = lambda host_id: (released.append(host_id), remove_host(host_id))[1]
    try:
        sim._autoscale(0.0)
    finally:
        sessionsim.releasable_hosts = original
    assert len(seen) == 1, "the simulator's tick did not run the shared scale-in decision"
    return seen[0], released


POLICIES = [
    {"name": "notebookos", "scale_in": "empty"},
    {"name": "notebookos", "scale_in": "idle"},
    {"name": "notebookos", "scale_in": "drain"},
    {"name": "reservation"},  # no migration: empty hosts only, on both sides
]


@pytest.mark.parametrize("params", POLICIES, ids=lambda p: p.get("scale_in", p["name"]))
def test_the_live_autoscaler_and_the_simulator_release_the_same_hosts(params):
    records, releases, draining = _live_run(params)
    assert len(records) == len(SEQUENCE)
    for i, (record, live_released) in enumerate(zip(records, releases, strict=True)):
        candidates, sim_released = _sim_decides(record, params)
        live_candidates = record[-1]
        assert candidates == live_candidates, (i, candidates, live_candidates)
        if draining[i]:
            continue  # the live count leaves the draining host out, the simulator has none
        if params.get("scale_in") in ("idle", "drain"):
            # the simulator moves the replicas off at once; the live release() drains
            assert sim_released == live_released[:len(sim_released)], (i, sim_released)
        else:
            assert sim_released == live_released, (i, sim_released, live_released)

    # What the decisions were (the same on both sides): empty hosts first, the newest first;
    # h0 (the provider's own), a bound or reserved host, a draining host never.
    cands = [r[-1] for r in records]
    mode = params.get("scale_in", "empty") if params["name"] == "notebookos" else "empty"
    assert cands == EXPECTED[mode], (mode, cands)
    assert releases[0] == ["h5", "h4"] and releases[6][0] == "h6"


EXPECTED = {
    "empty": [["h5", "h4", "h3", "h2", "h1"], [], [], ["h7", "h6"], ["h7", "h6"], ["h7", "h6"],
              ["h6"], ["h7", "h6", "h2", "h1"], ["h7", "h6", "h5", "h4", "h3", "h2", "h1"]],
    # then the hosts holding replicas, fewest first (h3 holds two), the newest first
    "idle": [["h5", "h4", "h3", "h2", "h1"], ["h5", "h4", "h2", "h1", "h3"],
             ["h5", "h4", "h1", "h3"], ["h7", "h6", "h5", "h4", "h1", "h3"],
             ["h7", "h6", "h4", "h1", "h3"], ["h7", "h6", "h5", "h4", "h2", "h1"],
             ["h6", "h5", "h4", "h2", "h1"], ["h7", "h6", "h2", "h1", "h5", "h4"],
             ["h7", "h6", "h5", "h4", "h3", "h2", "h1"]],
    # the prototype's order: fewest last executors (a's replica 2 on h2 ran its last cell)
    "drain": [["h5", "h4", "h3", "h2", "h1"], ["h5", "h4", "h2", "h1", "h3"],
              ["h5", "h4", "h1", "h3"], ["h7", "h6", "h5", "h4", "h1", "h3"],
              ["h7", "h6", "h4", "h1", "h3"], ["h7", "h6", "h5", "h4", "h1", "h2"],
              ["h6", "h5", "h4", "h1", "h2"], ["h7", "h6", "h2", "h1", "h5", "h4"],
              ["h7", "h6", "h5", "h4", "h3", "h2", "h1"]],
}


def test_decision_equality_fails_when_a_side_decides_on_its_own(monkeypatch):
    """A simulator that picks its own hosts (here: the old tie-break, oldest host id first) is
    caught, and so is one that stops calling the shared decision."""
    params = {"name": "notebookos", "scale_in": "empty"}
    records, _, _ = _live_run(params)

    def oldest_first(cluster, mode, *, keep, limit):  # noqa: ANN001, ANN202
        return sorted(releasable_hosts(cluster, mode, keep=keep, limit=limit))

    monkeypatch.setattr(sessionsim, "releasable_hosts", oldest_first)
    candidates, _ = _sim_decides(records[0], params)
    assert candidates != records[0][-1]
    monkeypatch.undo()

    def own_tick(self, now):  # noqa: ANN001, ANN202
        return False

    monkeypatch.setattr(SessionSimulator, "_autoscale", own_tick)
    with pytest.raises(AssertionError, match="did not run the shared scale-in decision"):
        _sim_decides(records[0], params)


# -- the decision itself ----------------------------------------------------------------------------


def test_the_indexes_follow_the_accounting_and_the_walk_is_bounded():
    cluster = Cluster()
    for i in range(200):
        cluster.add_host(_host(f"h{i:03d}"))
    cluster.add_kernel("k", ResourceSpec(1000, 1000, 1, 0.0))
    cluster.place_replica("k", 1, "h199")
    cluster.hosts["h198"].commit("job", ResourceSpec(gpus=1))
    assert "h199" not in {h.host_id for h in cluster.empty_hosts()}
    assert "h199" in {h.host_id for h in cluster.unbound_hosts()}
    assert "h198" not in {h.host_id for h in cluster.unbound_hosts()}
    # at most ``limit`` candidates of each kind, newest first among them
    empty = releasable_hosts(cluster, "empty", limit=64)
    assert len(empty) == 64 and empty == sorted(empty, reverse=True)
    assert releasable_hosts(cluster, "idle", limit=64)[-1] == "h199"
    # a host that empties again is a candidate again; a removed host is forgotten
    cluster.hosts["h198"].release("job")
    cluster.remove_kernel("k")
    assert releasable_hosts(cluster, "empty", limit=None)[:2] == ["h199", "h198"]
    cluster.remove_host("h199")
    assert releasable_hosts(cluster, "empty", limit=None)[0] == "h198"
    # a vetoed host does not take a place in the window
    assert releasable_hosts(cluster, "empty", keep=lambda h: h != "h000", limit=1) == ["h000"]
    with pytest.raises(ValueError, match="scale_in"):
        releasable_hosts(cluster, "sometimes")
