"""One scheduling cycle (notebookos/policies/cycle.py) and its profile (policies/profile.py),
issue 35: the status codes, the profile's plug-ins from entry points with their configuration
sections, and the decision-equality test: one recorded sequence of requests, with the cluster
snapshots the live Global Scheduler saw, gives the same decisions through the simulator's path.
The same for the container cycle (policies/container_cycle.py): a kernel's replicas (with
reservation's session GPUs), a per-cell container and a per-cell kernel's first container (batch,
lcp); and the replica that binds a reservation's session GPUs after a replacement (live only: the
simulator models no replica loss, so its records are replayed through the cycle itself).
"""

from __future__ import annotations

import asyncio
import copy
import sys
import textwrap
import threading
import tomllib
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from notebookos.cluster import Cluster, Host
from notebookos.global_scheduler import cycle_runner, execution
from notebookos.global_scheduler.cell_containers import CellContainerMixin
from notebookos.global_scheduler.cell_queue import CellQueue
from notebookos.global_scheduler.cycle_runner import (
    CELL_CONTAINER,
    FIRST_CONTAINER,
    REPLICAS,
    SESSION_GPUS,
    CycleRecord,
)
from notebookos.global_scheduler.errors import StartError
from notebookos.global_scheduler.execution import ExecutionMixin
from notebookos.global_scheduler.front import PlacementFailed, ReplicaEndpoint
from notebookos.global_scheduler.kernels import KernelEntry, ReplicaLink
from notebookos.global_scheduler.loop_waits import SignallingCondition
from notebookos.global_scheduler.recovery import RecoveryMixin
from notebookos.global_scheduler.replicas import ReplicaStarterMixin
from notebookos.global_scheduler.state_lock import StateLock
from notebookos.policies import cycle as cycle_module
from notebookos.policies import get_policy
from notebookos.policies import profile as profile_module
from notebookos.policies.cell_order import ArrivalOrder, UserFairness
from notebookos.policies.container_cycle import Purpose, run_container_cycle
from notebookos.policies.cycle import (
    ONE_REPLICA_STAYS,
    Action,
    CycleResult,
    PostFilter,
    Snapshot,
    Status,
    run_cycle,
)
from notebookos.policies.profile import Profile, load_plugin
from notebookos.resources import ResourceSpec
from notebookos.simulator import session_modes
from notebookos.simulator.session_modes import ReplicatedKernels
from notebookos.simulator.sessionsim import SessionSimulator

ROOT = Path(__file__).resolve().parents[1]
HOST = ResourceSpec(64000, 512000, 2, 160.0)  # two GPUs a host


def _cluster(hosts: int, kernels: dict[str, tuple[int, list[str]]]) -> Cluster:
    """``hosts`` hosts of two GPUs; each kernel: (its GPUs, its replicas' hosts)."""
    cluster = Cluster()
    for i in range(hosts):
        cluster.add_host(Host(f"h{i}", HOST, oversubscription=8.0))
    for kernel_id, (gpus, where) in kernels.items():
        cluster.add_kernel(kernel_id, ResourceSpec(1000, 1000, gpus, 0.0))
        for rid, host_id in enumerate(where, start=1):
            cluster.place_replica(kernel_id, rid, host_id)
    return cluster


def _hog(cluster: Cluster, host_id: str, gpus: int) -> None:
    cluster.hosts[host_id].commit(f"hog-{host_id}", ResourceSpec(gpus=gpus))


def _gpus(n: int) -> ResourceSpec:
    return ResourceSpec(100, 100, n, 0.0)


# -- the status codes ---------------------------------------------------------------------------


def test_success_runs_on_the_policys_executor_then_the_most_idle_host():
    cluster = _cluster(3, {"k": (1, ["h0", "h1", "h2"])})
    _hog(cluster, "h0", 2)
    _hog(cluster, "h2", 1)
    result = run_cycle(Snapshot(cluster), cluster.kernels["k"], _gpus(1),
                       Profile.for_policy(get_policy("notebookos")))
    assert (result.status, result.action, result.replica_id, result.host_id) == (
        Status.SUCCESS, Action.EXECUTE, 2, "h1")
    assert result.order[0] == 2
    # a host that refused (the live scheduler's commit RPC) is passed over: the next fits
    result = run_cycle(Snapshot(cluster, refused={2: "held"}), cluster.kernels["k"], _gpus(1),
                       Profile.for_policy(get_policy("notebookos")))
    assert (result.status, result.replica_id, result.host_id) == (Status.SUCCESS, 3, "h2")


def test_post_filter_migrates_or_is_unschedulable_or_waits():
    notebookos = Profile.for_policy(get_policy("notebookos"))
    cluster = _cluster(4, {"k": (2, ["h0", "h1", "h2"])})
    for h in ("h0", "h1", "h2"):
        _hog(cluster, h, 1)
    kernel = cluster.kernels["k"]
    result = run_cycle(Snapshot(cluster), kernel, _gpus(2), notebookos)
    assert (result.status, result.action, result.host_id) == (Status.SUCCESS, Action.MIGRATE, "h3")
    assert result.migration.target_host_id == "h3" and "busy" in result.reason
    # a replica change under way: wait for it, no migration
    result = run_cycle(Snapshot(cluster, replica_change="a replica is moving"), kernel, _gpus(2),
                       notebookos)
    assert result.status is Status.WAIT and "a replica is moving" in result.reason
    # no host can take a replica: unschedulable (more capacity would help)
    _hog(cluster, "h3", 1)
    result = run_cycle(Snapshot(cluster), kernel, _gpus(2), notebookos)
    assert result.status is Status.UNSCHEDULABLE and "no host can take" in result.reason
    assert result.migration is not None and result.migration.target_host_id is None
    # a policy that does not migrate waits for its own hosts
    result = run_cycle(Snapshot(cluster), kernel, _gpus(2),
                       Profile.for_policy(get_policy("reservation")))
    assert result.status is Status.WAIT and result.migration is None
    # more GPUs than any host has: unresolvable
    result = run_cycle(Snapshot(cluster), kernel, _gpus(3), notebookos)
    assert result.status is Status.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert "no host of the cluster has more than 2" in result.reason


def test_a_cells_migration_never_goes_to_an_unavailable_host():
    """A draining host, or one whose Local Scheduler does not answer, takes no migrating replica
    (it took one before: the move failed to start, or the drain had to move it again)."""
    notebookos = Profile.for_policy(get_policy("notebookos"))
    cluster = _cluster(5, {"k": (1, ["h0", "h1", "h2"])})
    for h in ("h0", "h1", "h2"):
        _hog(cluster, h, 2)
    _hog(cluster, "h4", 1)  # h3 is the most idle: the migration's first choice
    kernel = cluster.kernels["k"]
    result = run_cycle(Snapshot(cluster), kernel, _gpus(1), notebookos)
    assert (result.status, result.action, result.host_id) == (Status.SUCCESS, Action.MIGRATE, "h3")
    result = run_cycle(Snapshot(cluster, unavailable_hosts=frozenset({"h3"})), kernel, _gpus(1),
                       notebookos)
    assert (result.status, result.action, result.host_id) == (Status.SUCCESS, Action.MIGRATE, "h4")
    result = run_cycle(Snapshot(cluster, unavailable_hosts=frozenset({"h3", "h4"})), kernel,
                       _gpus(1), notebookos)
    assert result.status is Status.UNSCHEDULABLE and result.migration.target_host_id is None


def test_the_migration_cycle_chooses_the_replica_and_its_host_or_says_why_not():
    """MIGRATION (an operator's MigrateReplica naming no target): the policy's replica and its
    most idle acceptable host, never an unavailable one; the replica the caller names moves;
    a kernel of one replica, a policy that does not migrate, a cluster with no room: why not."""
    notebookos = Profile.for_policy(get_policy("notebookos"))
    cluster = _cluster(5, {"k": (1, ["h0", "h1", "h2"]), "solo": (1, ["h0"])})
    _hog(cluster, "h4", 1)
    kernel = cluster.kernels["k"]
    move = {"purpose": Purpose.MIGRATION, "kernel": kernel}
    result = run_container_cycle(Snapshot(cluster), _gpus(1), notebookos, **move)
    assert (result.status, result.action, result.host_id, result.hosts) == (
        Status.SUCCESS, Action.MIGRATE, "h3", ("h3",))
    assert result.replica_id in (1, 2, 3) and result.migration.replica_id == result.replica_id
    result = run_container_cycle(Snapshot(cluster), _gpus(1), notebookos, replica_id=3, **move)
    assert (result.replica_id, result.host_id) == (3, "h3")
    result = run_container_cycle(Snapshot(cluster, unavailable_hosts=frozenset({"h3"})),
                                 _gpus(1), notebookos, **move)
    assert (result.status, result.host_id) == (Status.SUCCESS, "h4")
    result = run_container_cycle(Snapshot(cluster, unavailable_hosts=frozenset({"h3", "h4"})),
                                 _gpus(1), notebookos, **move)
    assert result.status is Status.UNSCHEDULABLE and "no host can take" in result.reason
    result = run_container_cycle(Snapshot(cluster), _gpus(3), notebookos, **move)
    assert result.status is Status.UNSCHEDULABLE_AND_UNRESOLVABLE
    result = run_container_cycle(Snapshot(cluster), _gpus(1), notebookos, purpose=Purpose.MIGRATION,
                                 kernel=cluster.kernels["solo"])
    assert (result.status, result.reason) == (Status.UNSCHEDULABLE_AND_UNRESOLVABLE,
                                              ONE_REPLICA_STAYS)
    result = run_container_cycle(Snapshot(cluster), _gpus(1),
                                 Profile.for_policy(get_policy("reservation")), **move)
    assert result.status is Status.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert "does not migrate" in result.reason
    result = run_container_cycle(Snapshot(cluster, replica_change="a replica is moving"),
                                 _gpus(1), notebookos, **move)
    assert (result.status, result.reason) == (Status.WAIT, "a replica is moving")
    assert run_container_cycle(Snapshot(cluster), _gpus(1), notebookos,
                               purpose=Purpose.MIGRATION).status is Status.ERROR


def test_one_replica_waits_and_no_replica_waits_and_a_failing_plugin_is_an_error():
    notebookos = Profile.for_policy(get_policy("notebookos"))
    cluster = _cluster(2, {"one": (2, ["h0"]), "none": (1, [])})
    _hog(cluster, "h0", 1)
    result = run_cycle(Snapshot(cluster), cluster.kernels["one"], _gpus(2), notebookos)
    assert result.status is Status.WAIT and ONE_REPLICA_STAYS in result.reason
    result = run_cycle(Snapshot(cluster), cluster.kernels["none"], _gpus(1), notebookos)
    assert result.status is Status.WAIT and "no replica" in result.reason
    assert run_cycle(Snapshot(cluster), None, _gpus(1), notebookos).status is Status.ERROR

    class Broken(PostFilter):
        name = "broken"

        def post_filter(self, ctx):  # noqa: ANN001, ANN201
            raise RuntimeError("boom")

    broken = Profile(notebookos.policy, post_filters=(Broken(),))
    result = run_cycle(Snapshot(cluster), cluster.kernels["one"], _gpus(2), broken)
    assert result.status is Status.ERROR and "boom" in result.reason


# -- the profile ------------------------------------------------------------------------------


def test_builtin_plugin_tables_mirror_the_entry_points_in_pyproject():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    for group, table in profile_module.BUILTIN.items():
        assert declared[group] == table, group


def test_a_profile_gives_each_plugin_its_own_configuration_section():
    profile = Profile.load({
        "policy": "notebookos", "queue_sort": "themis", "post_filter": ["migrate"],
        "scale": "ces",
        "config": {"policy": {"scale_factor": 1.5}, "queue_sort": {"half_life_s": 42.0},
                   "scale": {"check_interval_s": 60.0}}})
    assert profile.policy.scale_factor == 1.5
    assert isinstance(profile.queue_sort, UserFairness) and profile.queue_sort.half_life_s == 42.0
    assert profile.scale.check_interval_s == 60.0
    assert [p.name for p in profile.post_filters] == ["migrate"] and not profile.shares
    with pytest.raises(ValueError, match="bad configuration"):
        Profile.load({"queue_sort": "arrival", "config": {"queue_sort": {"nope": 1}}})
    with pytest.raises(ValueError, match="unknown notebookos.post_filter plug-in"):
        Profile.load({"post_filter": ["preempt"]})


@pytest.fixture
def post_filter_plugin(tmp_path, monkeypatch):
    """A distribution that is not NotebookOS adds a post-filter through the entry-point group."""
    package = tmp_path / "nbos_cycle_demo"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent('''
        from notebookos.policies.cycle import CycleResult, PostFilter, Status

        class Patience(PostFilter):
            name = "patience"

            def __init__(self, note: str = "") -> None:
                self.note = note

            def post_filter(self, ctx):
                return CycleResult(Status.WAIT, f"{ctx.why}; {self.note}", order=ctx.order)
    '''))
    dist = tmp_path / "nbos_cycle_demo-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nbos-cycle-demo\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[notebookos.post_filter]\npatience = nbos_cycle_demo:Patience\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("nbos_cycle_demo", None)


def test_an_entry_point_plugin_is_found_and_configured(post_filter_plugin):
    assert "patience" in profile_module.plugin_names(profile_module.POST_FILTER)
    profile = Profile.load({"post_filter": ["patience", "migrate"],
                            "config": {"post_filter": {"patience": {"note": "told to wait"}}}})
    cluster = _cluster(4, {"k": (2, ["h0", "h1", "h2"])})
    for h in ("h0", "h1", "h2"):
        _hog(cluster, h, 1)
    result = run_cycle(Snapshot(cluster), cluster.kernels["k"], _gpus(2), profile)
    assert result.status is Status.WAIT and result.reason.endswith("told to wait")
    assert load_plugin(profile_module.POST_FILTER, "patience").note == ""


# -- decision equality: the live Global Scheduler and the simulator --------------------------


class _FakeLink:
    """A Local Scheduler that agrees with the cluster model: it commits what the model can."""

    def __init__(self, cluster: Cluster, host_id: str) -> None:
        self.cluster, self.host_id, self.gpus = cluster, host_id, []
        self.draining = False  # as HostLink's: not being drained
        self.unreachable_since = 0.0  # and answering

    def commit_gpus(self, kernel_id, replica_id, request_id, gpus, *, shareable=False):  # noqa: ANN001, ANN201
        host = self.cluster.hosts[self.host_id]
        owner = self.cluster.kernels[kernel_id].replicas[replica_id].owner
        if not host.can_commit(ResourceSpec(gpus=gpus), owner):
            return None, f"host {self.host_id} is busy"
        return sorted(host._free_device_ids)[:gpus], ""

    def take_over_held(self, kernel_id, replica_id, request_id, gpus):  # noqa: ANN001, ANN201
        return None  # no release held (hosts.py's HostLink holds them)


class _Live(ExecutionMixin):
    """The live scheduler's cycle and apply code (``_try_place``) on a stand-in holding just the
    state they use; migrations move the replica in the model."""

    def __init__(self, cluster: Cluster, policy: str) -> None:
        self.lock = StateLock()  # as the service's: awaited on the loop
        self.cluster = cluster
        self.policy = get_policy(policy)
        self.hosts = {h: _FakeLink(cluster, h) for h in cluster.hosts}
        self.kernels = {}
        for kernel_id, kernel in cluster.kernels.items():
            entry = KernelEntry(kernel_id, "key", "hmac-sha256", "python3", {}, state="idle")
            for rid, replica in kernel.replicas.items():
                endpoint = ReplicaEndpoint(rid, "127.0.0.1", 1, 2, 3, 4, replica.host_id)
                entry.replicas[rid] = ReplicaLink(rid, replica.host_id, endpoint, "", 0, True)
            self.kernels[kernel_id] = entry
        self.records: list[CycleRecord] = []
        self.cycle_recorder = self.records.append
        self.capacity_wanted: list[int] = []
        self.on_capacity_wanted = self.capacity_wanted.append
        self.migrations: list[tuple[int, str]] = []

    def _short_of_replicas(self, entry):  # noqa: ANN001, ANN202
        return ""

    def migration_running(self, kernel_id):  # noqa: ANN001, ANN202
        return False

    def migrate_replica(self, kernel_id, replica_id, target, request, reason=""):  # noqa: ANN001, ANN202
        self.migrations.append((replica_id, target))
        self.cluster.remove_replica(kernel_id, replica_id)
        self.cluster.place_replica(kernel_id, replica_id, target)
        self.kernels[kernel_id].replicas[replica_id].host_id = target
        return replica_id, target

    def release(self, kernel_id: str, msg_id: str) -> None:
        rid, host_id = self.kernels[kernel_id].executions.pop(msg_id)
        self.cluster.hosts[host_id].release(self.cluster.kernels[kernel_id].replicas[rid].owner)


class _SimStandIn:
    """The simulator's session engine as ``ReplicatedKernels.try_run`` uses it, on a cluster."""

    def __init__(self, cluster: Cluster, policy: str) -> None:
        self.cluster = cluster
        self.policy = get_policy(policy)
        self.config = SimpleNamespace(migration_state_s=1.0, prewarm_promotion_s=0.0,
                                      prewarm_per_host=0)
        self.record = SimpleNamespace(migrations=0)
        self.maybe_empty = False
        self.outcome: tuple | None = None

    def _books(self, now): pass  # noqa: ANN001, E704
    def _refresh_books(self): pass  # noqa: E704
    def _add_standby(self, sign, gpus): pass  # noqa: ANN001, E704
    def _take_warm(self, host_id, now, promotion): return 0.0  # noqa: ANN001, ANN202, E704

    def _start(self, sess, run, now):  # noqa: ANN001, ANN202
        self.outcome = ("execute", sess.kernel.executor, run.host_id)

    def _push_start(self, when, sess, run):  # noqa: ANN001, ANN202
        self.outcome = ("migrate", sess.kernel.executor, run.host_id)

    def _enter_wait(self, sess, gpus, subs, now):  # noqa: ANN001, ANN202
        self.outcome = ("wait", None, None)


def _sim_decides(record: CycleRecord, policy: str) -> tuple[CycleResult, tuple]:
    """The simulator's path (``ReplicatedKernels.try_run``) on the snapshot the live scheduler
    saw: the cycle's result it took and what it did."""
    cluster = copy.deepcopy(record.snapshot.cluster)
    sim = _SimStandIn(cluster, policy)
    mode = ReplicatedKernels(sim)
    kernel = cluster.kernels[record.kernel_id]
    run = SimpleNamespace(task=SimpleNamespace(request=record.request, gpus=record.request.gpus),
                          rec=SimpleNamespace(bound=None, reused_executor=None, migrated=False),
                          host_id=None, owner=None)
    sess = SimpleNamespace(kernel=kernel, queue=deque([run]), last_exec=None, current=None)
    seen: list[CycleResult] = []
    original = session_modes.run_cycle

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        seen.append(original(*args, **kwargs))
        return seen[-1]

    session_modes.run_cycle = spy
    try:
        mode.try_run(sess, run, 0.0)
    finally:
        session_modes.run_cycle = original
    assert len(seen) == 1, "the simulator's path did not run the shared scheduling cycle"
    return seen[0], sim.outcome


# The recorded sequence: (kernel, msg, GPUs) to place, or ("release", kernel, msg).
SEQUENCE = [
    ("a", "a1", 1), ("b", "b1", 2), ("c", "c1", 1), ("release", "a", "a1"),
    ("a", "a2", 1),  # fills h0..h2 (with b1, c1)
    ("d", "d1", 2),  # every replica's host busy: migrate to h3
    ("e", "e1", 2),  # nothing left, nowhere to migrate: unschedulable
    ("release", "b", "b1"),
    ("e", "e2", 2),  # runs where b ran
    ("f", "f1", 2),  # one replica, its host busy: waits
    ("a", "a3", 3),  # more than any host: unresolvable
]
KERNELS = {"a": (1, ["h0", "h1", "h2"]), "b": (2, ["h1", "h2", "h0"]),
           "c": (1, ["h2", "h0", "h1"]), "d": (2, ["h0", "h1", "h2"]),
           "e": (2, ["h0", "h1", "h2"]), "f": (1, ["h2"])}


def test_the_live_scheduler_and_the_simulator_take_the_same_decisions(monkeypatch):
    live = _Live(_cluster(4, KERNELS), "notebookos")
    live_calls: list[CycleResult] = []
    original = execution.run_cycle

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        live_calls.append(original(*args, **kwargs))
        return live_calls[-1]

    monkeypatch.setattr(execution, "run_cycle", spy)
    live_outcomes = []
    for step in SEQUENCE:
        if step[0] == "release":
            live.release(step[1], step[2])
            continue
        kernel_id, msg_id, gpus = step
        before = len(live.migrations)
        try:
            placed = live._try_place(kernel_id, msg_id, _gpus(gpus))[0]
        except PlacementFailed:
            placed = None
        if placed is None:
            live_outcomes.append(("wait", None, None))
        else:
            host_id = live.kernels[kernel_id].executions[msg_id][1]
            kind = "migrate" if len(live.migrations) > before else "execute"
            live_outcomes.append((kind, placed[0], host_id))
    records = live.records
    assert len(records) == len(live_outcomes) == len(live_calls) == 9
    assert [r.result for r in records] == live_calls  # the hook saw what the cycle decided
    assert all(not r.snapshot.refused for r in records)  # the model agreed with the hosts
    statuses = [r.result.status for r in records]
    assert statuses == [Status.SUCCESS] * 5 + [Status.UNSCHEDULABLE, Status.SUCCESS, Status.WAIT,
                                               Status.UNSCHEDULABLE_AND_UNRESOLVABLE]
    assert records[4].result.action is Action.MIGRATE
    assert [target for _, target in live.migrations] == ["h3"]
    assert live.capacity_wanted == [2]

    for record, live_outcome in zip(records, live_outcomes, strict=True):
        sim_result, sim_outcome = _sim_decides(record, "notebookos")
        assert sim_result.decision() == record.result.decision(), record
        assert sim_result.reason == record.result.reason
        assert sim_outcome == live_outcome, (record, sim_outcome, live_outcome)


def test_a_cell_taking_over_held_gpus_is_placed_without_a_call_and_others_keep_their_cycle():
    """The first pass of a try runs on the fronts' loop (execution.py's ``_try_held``): a cell
    whose replica's host still holds its previous cell's GPUs takes them over there, with no
    CommitGpus call and no thread; any other cell's pass goes on in ``_try_place`` on a
    thread, which acts on that cycle rather than running (and recording) a second one."""
    live = _Live(_cluster(4, KERNELS), "notebookos")
    calls: list[str] = []
    for link in live.hosts.values():
        def counted(*args, _commit=link.commit_gpus, **kwargs):  # noqa: ANN002, ANN003, ANN202
            calls.append(args[2])
            return _commit(*args, **kwargs)
        link.commit_gpus = counted
    first = live._try_held("a", "a1", _gpus(1))  # nothing held: a call is needed
    assert isinstance(first, execution._Pass) and len(live.records) == 1
    placed = live._try_place("a", "a1", _gpus(1), first)[0]
    assert placed is not None and calls == ["a1"] and len(live.records) == 1
    rid, host_id = live.kernels["a"].executions["a1"]
    live.release("a", "a1")
    held = {("a", rid, 1): list(placed[1])}
    live.hosts[host_id].take_over_held = lambda k, r, m, g: held.pop((k, r, g), None)
    assert live._try_held("a", "a2", _gpus(1)) == (rid, placed[1])  # taken over
    assert calls == ["a1"] and live.kernels["a"].executions["a2"] == (rid, host_id)
    assert live.cluster.kernels["a"].executor == rid


def test_decision_equality_fails_when_a_side_stops_calling_the_cycle(monkeypatch):
    """The simulator's path must run the shared cycle: one that takes its own decisions is
    caught (here: one that never migrates)."""
    live = _Live(_cluster(4, KERNELS), "notebookos")
    for step in SEQUENCE[:6]:
        if step[0] == "release":
            live.release(step[1], step[2])
        else:
            live._try_place(step[0], step[1], _gpus(step[2]))
    record = live.records[4]
    assert record.result.action is Action.MIGRATE

    def own_sequence(self, sess, run, now):  # noqa: ANN001, ANN202
        self.sim._enter_wait(sess, run.task.gpus, 0, now)
        return False

    monkeypatch.setattr(ReplicatedKernels, "try_run", own_sequence)
    with pytest.raises(AssertionError, match="did not run the shared scheduling cycle"):
        _sim_decides(record, "notebookos")
    monkeypatch.undo()
    monkeypatch.setattr(cycle_module.MigratePostFilter, "post_filter",
                        lambda self, ctx: CycleResult(Status.WAIT, ctx.why, order=ctx.order))
    sim_result, _ = _sim_decides(record, "notebookos")
    assert sim_result.decision() != record.result.decision()


def test_the_configuration_builds_the_profile_and_configures_its_plugins(tmp_path):
    from notebookos.config import ConfigError, load_config
    from notebookos.policies.profile import profile_from_config, profile_spec

    config = load_config(env={"NOTEBOOKOS_STATE_DIR": str(tmp_path)}, overrides={
        "global_scheduler.cell_order": "qssf", "global_scheduler.gpu_sharing": "tensorshare",
        "global_scheduler.gpu_sharing_predictor": "blind",
        "global_scheduler.plugin_config": '{"policy": {"candidate_limit": 7}, '
                                          '"queue_sort": {"default_s": 5.0}}'})
    spec = profile_spec(config)
    assert spec["post_filter"] == ["share", "migrate"] and spec["queue_sort"] == "qssf"
    profile = profile_from_config(config)
    assert profile.policy.candidate_limit == 7  # the section, on top of the settings' own
    assert profile.policy.scale_factor == config.global_scheduler.scaling_factor
    assert profile.queue_sort.default_s == 5.0 and profile.shares
    with pytest.raises(ConfigError):
        load_config(env={"NOTEBOOKOS_STATE_DIR": str(tmp_path)},
                    overrides={"global_scheduler.plugin_config": '{"filter": {}}'})


# -- the container cycle: a kernel's replicas (reservation's session GPUs) and a cell's own
# -- container (batch, lcp), notebookos/policies/container_cycle.py --------------------------


def test_the_container_cycle_places_reserves_or_says_why_not():
    cluster = _cluster(3, {})
    _hog(cluster, "h0", 2)
    _hog(cluster, "h1", 1)
    reservation = Profile.for_policy(get_policy("reservation"))
    result = run_container_cycle(Snapshot(cluster), _gpus(2), reservation)
    assert (result.status, result.action, result.host_id, result.hosts) == (
        Status.SUCCESS, Action.RESERVE, "h2", ("h2",))
    batch = Profile.for_policy(get_policy("batch"))
    result = run_container_cycle(Snapshot(cluster), _gpus(1), batch)
    assert (result.status, result.action) == (Status.SUCCESS, Action.PLACE)
    assert result.host_id == "h1"  # best fit: the host with the fewest idle GPUs that fit
    # a draining host takes nothing new
    result = run_container_cycle(Snapshot(cluster, unavailable_hosts=frozenset({"h2"})),
                                 _gpus(2), batch)
    assert result.status is Status.UNSCHEDULABLE and result.hosts == ()
    # fewer hosts than replicas: unschedulable, with the hosts found (the simulator asks for
    # the rest); more GPUs than any host has: unresolvable
    notebookos = Profile.for_policy(get_policy("notebookos"))
    result = run_container_cycle(Snapshot(cluster), _gpus(1), notebookos, count=4)
    assert result.status is Status.UNSCHEDULABLE and len(result.hosts) == 3
    result = run_container_cycle(Snapshot(cluster), _gpus(3), batch)
    assert result.status is Status.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert "none that large" in result.reason
    # a per-cell kernel whose last container is still there waits for it
    result = run_container_cycle(Snapshot(cluster, replica_change="parking"), _gpus(1), batch)
    assert (result.status, result.reason) == (Status.WAIT, "parking")


def test_the_container_cycle_places_a_first_container_without_gpus():
    """A per-cell kernel's first container (ANSWER_ONLY) binds no GPUs: the policy's host when
    one can bind the request, else any that can hold its subscription; never a draining one."""
    cluster = _cluster(3, {})
    _hog(cluster, "h0", 2)
    _hog(cluster, "h1", 1)
    batch = Profile.for_policy(get_policy("batch"))
    first = {"purpose": Purpose.ANSWER_ONLY}
    result = run_container_cycle(Snapshot(cluster), _gpus(2), batch, **first)
    assert (result.status, result.action, result.hosts) == (Status.SUCCESS, Action.PLACE, ("h2",))
    _hog(cluster, "h2", 2)  # no two GPUs idle anywhere: a new cell's container would wait
    assert run_container_cycle(Snapshot(cluster), _gpus(2), batch).status is Status.UNSCHEDULABLE
    result = run_container_cycle(Snapshot(cluster), _gpus(2), batch, **first)
    assert (result.status, result.action, result.host_id) == (Status.SUCCESS, Action.PLACE, "h1")
    result = run_container_cycle(Snapshot(cluster, unavailable_hosts=frozenset({"h1"})),
                                 _gpus(2), batch, **first)
    assert result.placed and result.host_id != "h1"
    result = run_container_cycle(Snapshot(cluster, unavailable_hosts=frozenset(cluster.hosts)),
                                 _gpus(2), batch, **first)
    assert result.status is Status.UNSCHEDULABLE and "binds no GPUs" in result.reason
    result = run_container_cycle(Snapshot(cluster), _gpus(3), batch, **first)
    assert result.status is Status.UNSCHEDULABLE_AND_UNRESOLVABLE


def test_the_container_cycle_chooses_the_replica_that_binds_the_session_gpus():
    """SESSION_GPUS: the replacement first, then the other live replicas by id; a refused one is
    passed over; none can now: wait (reservation does not migrate); none ever: unresolvable."""
    cluster = _cluster(4, {"k": (1, ["h0", "h1", "h2"])})
    kernel = cluster.kernels["k"]
    cluster.remove_replica("k", 1)
    cluster.place_replica("k", 4, "h3")
    reservation = Profile.for_policy(get_policy("reservation"))

    def cycle(snapshot: Snapshot, gpus: int = 1) -> CycleResult:
        return run_container_cycle(snapshot, _gpus(gpus), reservation,
                                   purpose=Purpose.SESSION_GPUS, kernel=kernel)

    result = cycle(Snapshot(cluster, new_replicas=(4,)))
    assert (result.status, result.action, result.replica_id, result.host_id, result.order) == (
        Status.SUCCESS, Action.RESERVE, 4, "h3", (4, 2, 3))
    _hog(cluster, "h3", 2)
    assert cycle(Snapshot(cluster, new_replicas=(4,))).replica_id == 2
    result = cycle(Snapshot(cluster, refused={2: "host h1 refused"}, new_replicas=(4,)))
    assert (result.replica_id, result.host_id) == (3, "h2")
    for h in ("h1", "h2"):
        _hog(cluster, h, 2)
    result = cycle(Snapshot(cluster, new_replicas=(4,)))
    assert result.status is Status.WAIT and "per cell until one can" in result.reason
    assert cycle(Snapshot(cluster), gpus=3).status is Status.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert run_container_cycle(Snapshot(cluster), _gpus(1), reservation,
                               purpose=Purpose.SESSION_GPUS).status is Status.ERROR


class _HostLinkStandIn:
    """What the placement reads of a host link: its host, address, whether it drains, whether
    its Local Scheduler answers."""

    def __init__(self, host_id: str) -> None:
        self.host_id, self.ip, self.draining = host_id, "127.0.0.1", False
        self.unreachable_since = 0.0


class _LiveContainers(CellContainerMixin, ReplicaStarterMixin):
    """The live scheduler's container decisions and their effects on a stand-in: a cell's
    container slot (``_take_cell_slot``: the GPUs set aside on the chosen host) and a kernel's
    replicas (``_plan_replicas``: placed in the model, a reservation's GPUs set aside)."""

    def __init__(self, cluster: Cluster, policy: str) -> None:
        self.lock = StateLock()  # as the service's: awaited on the loop
        self._cell_cv = SignallingCondition(self.lock)  # as the service's
        self._placement_cv = threading.Condition(threading.Lock())
        self._stop = threading.Event()
        self.cell_queue = CellQueue(ArrivalOrder())
        self._cell_waiters = []
        self.cell_queue_timeout_s = 0.0  # a cell that cannot go now fails at once (its wait)
        self.cluster = cluster
        self.policy = get_policy(policy)
        self.binding = self.policy.binding
        self.mode = SimpleNamespace(reserves_session_gpus=not self.policy.lifetime.per_cell)
        self.hosts = {h: _HostLinkStandIn(h) for h in cluster.hosts}
        self.kernels: dict[str, KernelEntry] = {}
        self.records: list[CycleRecord] = []
        self.cycle_recorder = self.records.append
        self.capacity_wanted: list[int] = []
        self.on_capacity_wanted = self.capacity_wanted.append
        self.uses_warm_pool = False

    def _save_kernel(self, entry):  # noqa: ANN001, ANN202
        return None

    def _raft_ports_in_use(self):  # noqa: ANN202
        return {}

    def _locked(self):  # noqa: ANN202 - as the service's
        return self.lock.held()

    async def _add_replicas(self, kernel_id, count, *, join, on_host=None, **_):  # noqa: ANN001, ANN003, ANN202
        """Plan (the placement's effect on the model), start nothing."""
        _, plan, _, _ = self._plan_replicas(kernel_id, count, join=join, on_host=on_host)
        return [rid for rid, _, _ in plan]

    def start_per_cell_kernel(self, kernel_id: str, gpus: int) -> str | None:
        """A per-cell kernel's StartKernel: the host its first container started on (it is
        parked at once: out of the model again), or None when StartKernel was refused."""
        self.cluster.add_kernel(kernel_id, _gpus(gpus))
        self.kernels[kernel_id] = KernelEntry(kernel_id, "key", "hmac-sha256", "python3", {})
        try:
            asyncio.run(self._start_first_container(kernel_id))
        except StartError:
            return None
        kernel = self.cluster.kernels[kernel_id]
        (replica,) = kernel.replicas.values()
        self.cluster.remove_replica(kernel_id, replica.replica_id)
        self.kernels[kernel_id].state = "parked"
        return replica.host_id

    def start_kernel(self, kernel_id: str, gpus: int) -> tuple | None:
        """A kernel's replicas placed (StartKernel's plan): (hosts, session GPUs set aside on),
        or None when it cannot start now."""
        self.cluster.add_kernel(kernel_id, _gpus(gpus))
        self.kernels[kernel_id] = KernelEntry(kernel_id, "key", "hmac-sha256", "python3", {})
        try:
            _, plan, _, _ = self._plan_replicas(kernel_id, self.policy.replicas_per_kernel,
                                                join=False)
        except StartError:
            return None
        owners = {rid: self.cluster.kernels[kernel_id].replicas[rid].owner for rid, _, _ in plan}
        hosts = tuple(link.host_id for _, link, _ in plan)
        reserved = tuple(link.host_id for rid, link, _ in plan
                         if self.cluster.hosts[link.host_id].reservation_of(owners[rid]))
        return hosts, reserved

    def run_cell(self, kernel_id: str, msg_id: str, gpus: int) -> str | None:
        """A per-cell kernel's cell: the host its container's GPUs were set aside on, or None
        when it cannot go now."""
        if kernel_id not in self.kernels:
            self.cluster.add_kernel(kernel_id, _gpus(gpus))
            self.kernels[kernel_id] = KernelEntry(kernel_id, "key", "hmac-sha256", "python3",
                                                  {}, state="parked")
        try:
            return asyncio.run(self._take_cell_slot(kernel_id, msg_id, _gpus(gpus)))
        except PlacementFailed:
            return None

    def cell_done(self, kernel_id: str, msg_id: str, host_id: str) -> None:
        self._cancel_slot(host_id, f"cell-slot:{kernel_id}:{msg_id}")


class _SimContainersStandIn(_SimStandIn):
    """The simulator's session engine as ``CellContainers.try_run`` and ``_place_kernel`` use
    it."""

    def __init__(self, cluster: Cluster, policy: str) -> None:
        super().__init__(cluster, policy)
        self.config = SimpleNamespace(migration_state_s=1.0, prewarm_promotion_s=0.0,
                                      prewarm_per_host=0, container_start_s=1.0,
                                      state_read_s=1.0, lcp_warmup_s=1.0)
        self.R = self.policy.replicas_per_kernel
        self.binding = self.policy.binding
        self.pool_size = self.policy.lifetime.pool_size(0)
        self.record = SimpleNamespace(migrations=0, integrals=SimpleNamespace(replicas=0))
        self.mode = session_modes.mode_for(self)

    def _enter_wait(self, sess, gpus, subs, now, lacking=0):  # noqa: ANN001, ANN202
        self.outcome = ("wait", lacking)

    def _push(self, when, kind, payload):  # noqa: ANN001, ANN202
        return None

    def _push_start(self, when, sess, run):  # noqa: ANN001, ANN202
        self.outcome = ("placed", run.host_id)


def _spied_container_cycle(module, calls: list[CycleResult]):  # noqa: ANN001, ANN202
    original = module.run_container_cycle

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(original(*args, **kwargs))
        return calls[-1]

    return spy


def _sim_places(record: CycleRecord, policy: str, monkeypatch) -> tuple[CycleResult, tuple]:  # noqa: ANN001
    """The simulator's path for the recorded container decision, on the snapshot the live
    scheduler saw: ``CellContainers.try_run`` (a cell's container) or ``_place_kernel`` (a
    kernel's replicas). The cycle's result it took, and what it did."""
    cluster = copy.deepcopy(record.snapshot.cluster)
    if record.kernel_id in cluster.kernels:  # the live model holds the kernel, not placed yet
        cluster.remove_kernel(record.kernel_id)
    sim = _SimContainersStandIn(cluster, policy)
    seen: list[CycleResult] = []
    with monkeypatch.context() as patch:
        patch.setattr(session_modes, "run_container_cycle",
                      _spied_container_cycle(session_modes, seen))
        task = SimpleNamespace(request=record.request, gpus=record.request.gpus,
                               task_id=f"{record.kernel_id}-cell")
        run = SimpleNamespace(task=task, rec=SimpleNamespace(bound=None, reused_executor=None),
                              host_id=None, owner=None, container=None)
        sess = SimpleNamespace(s=SimpleNamespace(session_id=record.kernel_id,
                                                 request=record.request),
                               queue=deque([run]), last_exec=None, current=None,
                               kernel=None, wake_started=None)
        if record.kind == CELL_CONTAINER:
            sim.mode.try_run(sess, run, 0.0)
        elif record.kind == FIRST_CONTAINER:
            sess.ready = False
            sim.mode.on_session_start(sess, 0.0)
            assert sess.ready  # its cells come, as before
            sim.outcome = ("started", sim.mode.first_containers_unplaced)
        else:
            if SessionSimulator._place_kernel(sim, sess, 0.0):
                replicas = [r for _, r in sorted(cluster.kernels[record.kernel_id].replicas
                                                 .items())]
                hosts = tuple(r.host_id for r in replicas)
                bound = tuple(r.host_id for r in replicas
                              if cluster.hosts[r.host_id].commitment_of(r.owner) is not None)
                sim.outcome = ("placed", hosts, bound)
    assert len(seen) == 1, "the simulator's path did not run the shared container cycle"
    return seen[0], sim.outcome


# (kernel, msg, GPUs) a cell of a per-cell kernel, ("done", kernel, msg): it ended
CELL_SEQUENCE = [
    ("a", "a1", 1), ("b", "b1", 2), ("c", "c1", 1),  # best fit: a and c share a host
    ("d", "d1", 2),  # h2 left: 2 GPUs
    ("e", "e1", 1),  # nothing idle: unschedulable, capacity asked for
    ("done", "b", "b1"),
    ("e", "e2", 1),  # where b ran
    ("f", "f1", 2),  # one GPU idle on one host: unschedulable
    ("g", "g1", 3),  # more than any host: fails before the cycle (never_fits)
]


@pytest.mark.parametrize("policy", ["batch", "lcp"])
def test_per_cell_containers_are_placed_by_the_same_cycle_live_and_simulated(policy,
                                                                              monkeypatch):
    live = _LiveContainers(_cluster(3, {}), policy)
    calls: list[CycleResult] = []
    monkeypatch.setattr(cycle_runner, "run_container_cycle",
                        _spied_container_cycle(cycle_runner, calls))
    live_outcomes, held = [], {}
    for step in CELL_SEQUENCE:
        if step[0] == "done":
            live.cell_done(step[1], step[2], held.pop((step[1], step[2])))
            continue
        kernel_id, msg_id, gpus = step
        before = len(live.records)
        host_id = live.run_cell(kernel_id, msg_id, gpus)
        if host_id is not None:
            held[(kernel_id, msg_id)] = host_id
        if len(live.records) > before:
            live_outcomes.append(("wait", 0) if host_id is None else ("placed", host_id))
    records = live.records
    assert [r.kind for r in records] == [CELL_CONTAINER] * 7 and len(calls) == 7
    assert [r.result for r in records] == calls
    assert [r.result.status for r in records] == [Status.SUCCESS] * 4 + [
        Status.UNSCHEDULABLE, Status.SUCCESS, Status.UNSCHEDULABLE]
    assert {r.result.action for r in records if r.result.placed} == {Action.PLACE}
    assert live.capacity_wanted == [1, 2]
    assert "g" in live.kernels and not any(r.kernel_id == "g" for r in records)
    for record, live_outcome in zip(records, live_outcomes, strict=True):
        sim_result, sim_outcome = _sim_places(record, policy, monkeypatch)
        assert sim_result.decision() == record.result.decision(), record
        assert sim_result.reason == record.result.reason
        assert sim_outcome == live_outcome, (record, sim_outcome, live_outcome)


@pytest.mark.parametrize(("policy", "sequence", "statuses"), [
    ("reservation", [("k1", 2), ("k2", 1), ("k3", 2), ("k4", 2), ("k5", 1), ("k6", 1),
                     ("k7", 3)],
     [Status.SUCCESS] * 3 + [Status.UNSCHEDULABLE, Status.SUCCESS, Status.UNSCHEDULABLE,
                             Status.UNSCHEDULABLE_AND_UNRESOLVABLE]),
    ("notebookos", [("k1", 2), ("k2", 1), ("k3", 3)],
     [Status.SUCCESS, Status.SUCCESS, Status.UNSCHEDULABLE_AND_UNRESOLVABLE]),
])
def test_kernel_replicas_and_session_gpus_are_placed_by_the_same_cycle_live_and_simulated(
        policy, sequence, statuses, monkeypatch):
    live = _LiveContainers(_cluster(3, {}), policy)
    calls: list[CycleResult] = []
    monkeypatch.setattr(cycle_runner, "run_container_cycle",
                        _spied_container_cycle(cycle_runner, calls))
    live_outcomes = []
    for kernel_id, gpus in sequence:
        placed = live.start_kernel(kernel_id, gpus)
        live_outcomes.append(("placed", *placed) if placed is not None else None)
    records = live.records
    assert [r.kind for r in records] == [REPLICAS] * len(sequence)
    assert [r.result for r in records] == calls
    assert [r.result.status for r in records] == statuses
    reserves = policy == "reservation"
    assert {r.result.action for r in records if r.result.placed} == {
        Action.RESERVE if reserves else Action.PLACE}
    for record, live_outcome in zip(records, live_outcomes, strict=True):
        sim_result, sim_outcome = _sim_places(record, policy, monkeypatch)
        assert sim_result.decision() == record.result.decision(), record
        if live_outcome is None:
            assert sim_outcome[0] == "wait"
        else:  # the same hosts; the session's GPUs bound (simulated) / set aside (live) alike
            assert sim_outcome == live_outcome, (record, sim_outcome, live_outcome)
            assert bool(live_outcome[2]) is reserves


def test_container_decision_equality_fails_when_the_simulator_decides_alone(monkeypatch):
    """A simulator path that stops calling the container cycle (here: the per-cell containers
    choosing hosts themselves, as before issue 35's second part) is caught."""
    live = _LiveContainers(_cluster(3, {}), "batch")
    live.run_cell("a", "a1", 1)
    record = live.records[0]

    def own_choice(self, sess, run, now):  # noqa: ANN001, ANN202
        hosts = self.policy.choose_hosts(self.sim.cluster, run.task.request, 1)
        self.sim._push_start(0.0, sess, SimpleNamespace(host_id=hosts[0].host_id))
        return True

    monkeypatch.setattr(session_modes.CellContainers, "try_run", own_choice)
    with pytest.raises(AssertionError, match="did not run the shared container cycle"):
        _sim_places(record, "batch", monkeypatch)


# A per-cell kernel's StartKernel (kernel, GPUs), or ("hog", host, GPUs): GPUs taken there
FIRST_SEQUENCE = [
    ("a", 1),  # the policy's host: one that can bind the request
    ("hog", "h0", 2), ("hog", "h1", 2), ("hog", "h2", 1),
    ("b", 2),  # no host can bind 2 GPUs now: any that can hold the subscription
    ("c", 1),
    ("d", 3),  # more than any host: StartKernel refused, unresolvable
]


@pytest.mark.parametrize("policy", ["batch", "lcp"])
def test_a_per_cell_kernels_first_container_is_placed_by_the_same_cycle_live_and_simulated(
        policy, monkeypatch):
    live = _LiveContainers(_cluster(3, {}), policy)
    calls: list[CycleResult] = []
    monkeypatch.setattr(cycle_runner, "run_container_cycle",
                        _spied_container_cycle(cycle_runner, calls))
    live_hosts = []
    for step in FIRST_SEQUENCE:
        if step[0] == "hog":
            _hog(live.cluster, step[1], step[2])
            continue
        live_hosts.append(live.start_per_cell_kernel(*step))
    records = live.records
    assert [r.kind for r in records] == [FIRST_CONTAINER] * 4 and len(calls) == 4
    assert [r.result for r in records] == calls
    assert [r.result.status for r in records] == [Status.SUCCESS] * 3 + [
        Status.UNSCHEDULABLE_AND_UNRESOLVABLE]
    assert {r.result.action for r in records if r.result.placed} == {Action.PLACE}
    # the container started where the cycle said, also where no host could bind its GPUs
    assert live_hosts == [r.result.host_id for r in records]
    assert live_hosts[1] == "h2" and live_hosts[3] is None
    for record in records:
        sim_result, sim_outcome = _sim_places(record, policy, monkeypatch)
        assert sim_result.decision() == record.result.decision(), record
        assert sim_result.reason == record.result.reason
        assert sim_outcome == ("started", int(not record.result.placed))


class _GpuStub:
    """A Local Scheduler's ReleaseGpus, as the rebind calls it for the old holder."""

    def __init__(self) -> None:
        self.released: list[int] = []

    def ReleaseGpus(self, request, timeout):  # noqa: ANN001, ANN201, N802
        self.released.append(request.replica_id)


class _LiveRecovery(RecoveryMixin, _LiveContainers):
    """The live scheduler's rebind of a reservation's session GPUs (``_rebind_session_gpus``)
    on a stand-in whose Local Schedulers commit what the model can, except on ``refusing``
    hosts."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster, "reservation")
        self.refusing: set[str] = set()
        for link in self.hosts.values():
            link.stub = _GpuStub()

    def _bind_for_session(self, entry, spec, replica_id=None):  # noqa: ANN001, ANN202
        rl = entry.replicas[replica_id]
        if rl.host_id in self.refusing:
            raise StartError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"host {rl.host_id} cannot bind {spec.gpus} GPU(s) for the session")
        owner = self.cluster.kernels[entry.kernel_id].replicas[replica_id].owner
        ids = self.cluster.hosts[rl.host_id].commit(owner, spec)
        entry.session_gpus = (replica_id, rl.host_id, list(ids))

    def add(self, kernel_id: str, rid: int, host_id: str) -> None:
        self.cluster.place_replica(kernel_id, rid, host_id)
        endpoint = ReplicaEndpoint(rid, "127.0.0.1", 1, 2, 3, 4, host_id)
        self.kernels[kernel_id].replicas[rid] = ReplicaLink(rid, host_id, endpoint, "", 0, True)

    def replace(self, kernel_id: str, lost: int, rid: int, host_id: str) -> None:
        """``lost`` died (out of the model, its commitment with it); ``rid`` replaced it."""
        self.kernels[kernel_id].replicas.pop(lost)
        self.cluster.remove_replica(kernel_id, lost)
        self.add(kernel_id, rid, host_id)
        self._rebind_session_gpus(kernel_id, [rid])


def test_a_reservations_session_gpus_rebind_through_the_cycle_after_a_replacement(monkeypatch):
    """The replica that binds a reservation's session GPUs after the holder was replaced is
    the container cycle's decision (SESSION_GPUS), recorded; a host that refuses the commit is
    passed over by the next cycle. The simulator models no replica loss: each record is
    replayed through the cycle on the snapshot the live scheduler saw."""
    live = _LiveRecovery(_cluster(4, {}))
    live.cluster.add_kernel("k", _gpus(1))
    live.kernels["k"] = KernelEntry("k", "key", "hmac-sha256", "python3", {}, state="idle")
    for rid, host_id in ((1, "h0"), (2, "h1"), (3, "h2")):
        live.add("k", rid, host_id)
    live._bind_for_session(live.kernels["k"], _gpus(1), 1)
    calls: list[CycleResult] = []
    monkeypatch.setattr(cycle_runner, "run_container_cycle",
                        _spied_container_cycle(cycle_runner, calls))
    entry = live.kernels["k"]

    live.replace("k", 1, 4, "h3")  # the replacement's host can bind them
    assert entry.session_gpus[:2] == (4, "h3") and live.hosts["h0"].stub.released == [1]
    _hog(live.cluster, "h0", 2)
    live.refusing.add("h1")
    live.replace("k", 4, 5, "h0")  # its host is busy; h1 refuses the commit: h2
    assert entry.session_gpus[:2] == (3, "h2")
    for h in ("h1", "h3"):
        _hog(live.cluster, h, 2)
    live.replace("k", 3, 6, "h3")  # every replica's host is busy: cells bind per cell
    assert entry.session_gpus is None

    records = live.records
    assert [r.kind for r in records] == [SESSION_GPUS] * 4 and [r.result for r in records] == calls
    assert [(r.result.status, r.result.replica_id, r.result.host_id) for r in records] == [
        (Status.SUCCESS, 4, "h3"), (Status.SUCCESS, 2, "h1"), (Status.SUCCESS, 3, "h2"),
        (Status.WAIT, None, None)]
    assert {r.result.action for r in records if r.result.placed} == {Action.RESERVE}
    assert dict(records[2].snapshot.refused) == {2: "host h1 cannot bind 1 GPU(s) for the "
                                                    "session"}
    assert [r.snapshot.new_replicas for r in records] == [(4,), (5,), (5,), (6,)]
    reservation = Profile.for_policy(get_policy("reservation"))
    for record in records:
        snapshot = copy.deepcopy(record.snapshot)
        replayed = run_container_cycle(snapshot, record.request, reservation,
                                       purpose=Purpose.SESSION_GPUS,
                                       kernel=snapshot.cluster.kernels[record.kernel_id])
        assert replayed.decision() == record.result.decision(), record
        assert replayed.reason == record.result.reason
