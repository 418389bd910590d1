"""The policy framework: the entry-point registry (a plug-in outside the project adds a policy),
the strategy objects that replace the engines' mode branches, and the optional extension points."""

from __future__ import annotations

import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from notebookos.cluster import Cluster, Host
from notebookos.policies import (
    PostFilterAction,
    broken_policies,
    get_policy,
    policy_names,
    registry,
)
from notebookos.resources import ResourceSpec
from notebookos.simulator.config import SimConfig
from notebookos.simulator.runner import simulate
from notebookos.workload.model import Session, Task, Workload

ROOT = Path(__file__).resolve().parents[1]


def test_builtin_table_mirrors_the_entry_points_in_pyproject():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][
        registry.GROUP]
    assert declared == registry.BUILTIN


@pytest.fixture
def plugin_distribution(tmp_path, monkeypatch):
    """An installed distribution (a dist-info on sys.path) that is not NotebookOS and declares two
    policies in the group: one good, one whose module does not import."""
    package = tmp_path / "nbos_plugin_demo"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent('''
        from typing import ClassVar
        from notebookos.policies.best_fit import BestFitPolicy

        class WorstFitPolicy(BestFitPolicy):
            """Most idle GPUs first, one container per session, GPUs reserved."""
            name: ClassVar[str] = "worst-fit"
            gpu_binding = "session"
            description: ClassVar[str] = "a plug-in used by the tests"

            def candidate_hosts(self, cluster, request):
                return cluster.hosts_by_idle_gpus(request.gpus, limit=self.candidate_limit)
    '''))
    dist = tmp_path / "nbos_plugin_demo-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nbos-plugin-demo\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[notebookos.policies]\n"
        "worst-fit = nbos_plugin_demo:WorstFitPolicy\n"
        "broken = nbos_plugin_demo_missing:Nothing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.refresh()
    yield
    sys.modules.pop("nbos_plugin_demo", None)
    monkeypatch.undo()
    registry.refresh()


def test_a_plugin_package_adds_a_policy_that_the_simulator_runs(plugin_distribution):
    from notebookos.policies import GpuBinding

    assert "worst-fit" in policy_names()
    policy = get_policy("worst-fit")
    assert policy.binding.mode is GpuBinding.SESSION
    spec = ResourceSpec(gpus=1)
    workload = Workload((Session("s", 0, 100, spec, (Task("s/0", "s", 10, 20, spec),)),))
    summary, record = simulate(workload, "worst-fit", SimConfig(hosts=2, gpus_per_host=8,
                                                                autoscale=False))
    assert summary["completed"] == 1 and summary["policy"] == "worst-fit"
    # The broken one is listed as broken, not as a policy, and asking for it says why.
    assert "broken" not in policy_names()
    assert "nbos_plugin_demo_missing" in broken_policies()["broken"]
    with pytest.raises(ValueError, match="installed but cannot be loaded"):
        get_policy("broken")


def test_unknown_policy_lists_what_is_installed():
    with pytest.raises(ValueError) as info:
        get_policy("gandiva")
    message = str(info.value)
    assert "unknown policy 'gandiva'" in message and "notebookos.policies" in message
    for name in ("notebookos", "reservation", "fifo", "tiresias"):
        assert name in message


def test_strategies_replace_the_mode_flags():
    nb, res, batch, lcp = (get_policy(n) for n in ("notebookos", "reservation", "batch", "lcp"))
    assert not nb.binding.binds_at_placement and res.binding.binds_at_placement
    assert nb.binding.standby_gpus(4, 3) == 12 and res.binding.standby_gpus(4, 1) == 0
    assert nb.binding.waiting_gpus(4) == 0 and res.binding.waiting_gpus(4) == 4
    assert not nb.lifetime.per_cell and nb.lifetime.pool_size(1) == 1  # prewarm pool
    assert res.lifetime.pool_size(1) == 0
    assert batch.lifetime.per_cell and batch.lifetime.state_io and batch.lifetime.pool_size(1) == 0
    assert lcp.lifetime.per_cell and lcp.lifetime.warm_pool and lcp.lifetime.pool_size(1) == 8
    assert get_policy("lcp", warm_containers_per_host=0).lifetime.pool_size(1) == 0


def _cluster(idle: dict[str, int]) -> Cluster:
    cluster = Cluster()
    for host_id, free in idle.items():
        host = cluster.add_host(Host(host_id, ResourceSpec(64000, 512000, 8, 320.0)))
        if free < 8:
            host.commit(f"busy-{host_id}", ResourceSpec(gpus=8 - free))
    return cluster


def test_score_reranks_the_bounded_walk():
    from notebookos.policies.notebookos_policy import NotebookOSPolicy

    class PreferHostC(NotebookOSPolicy):
        def score(self, cluster, host, request):
            return 10.0 if host.host_id == "c" else 0.0

    cluster = _cluster({"a": 8, "b": 7, "c": 1, "d": 6})
    assert [h.host_id for h in get_policy("notebookos").choose_hosts(cluster, ResourceSpec(
        gpus=1))] == ["a", "b", "d"]
    assert [h.host_id for h in PreferHostC().choose_hosts(cluster, ResourceSpec(gpus=1))] == [
        "c", "a", "b"]


def test_post_filter_migrates_waits_or_says_the_policy_does_not_migrate():
    cluster = _cluster({"a": 0, "b": 0, "c": 0, "d": 4})
    kernel = cluster.add_kernel("k", ResourceSpec(gpus=2))
    for rid, host in enumerate("abc"):
        cluster.place_replica("k", rid, host)
    decision = get_policy("notebookos").post_filter(cluster, kernel, ResourceSpec(gpus=2))
    assert decision.action is PostFilterAction.MIGRATE
    assert decision.migration.target_host_id == "d"
    decision = get_policy("notebookos").post_filter(cluster, kernel, ResourceSpec(gpus=6))
    assert decision.action is PostFilterAction.WAIT and "no host" in decision.reason
    decision = get_policy("reservation").post_filter(cluster, kernel, ResourceSpec(gpus=2))
    assert decision.action is PostFilterAction.WAIT and "does not migrate" in decision.reason
