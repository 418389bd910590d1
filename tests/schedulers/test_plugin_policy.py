"""A policy from a package outside NotebookOS drives the live Global Scheduler: found through the
``notebookos.policies`` entry-point group in the scheduler's own process, and its GPU binding
honoured through the policy's strategy object (the plug-in says ``gpu_binding = "session"`` as a
plain string, which the built-in policies never do)."""

from __future__ import annotations

import textwrap

import pytest
from sched_cluster import make_cluster_fixture, result_text, run_cell  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(90)


def write_plugin(root) -> None:  # noqa: ANN001 - a pytest tmp_path
    (root / "nbos_live_plugin.py").write_text(textwrap.dedent('''
        from typing import ClassVar
        from notebookos.policies.best_fit import BestFitPolicy

        class WorstFitReservation(BestFitPolicy):
            """Most idle GPUs first; the session's GPUs bound while its kernel lives."""
            name: ClassVar[str] = "worst-fit-reservation"
            gpu_binding = "session"

            def candidate_hosts(self, cluster, request):
                return cluster.hosts_by_idle_gpus(request.gpus, limit=self.candidate_limit)
    '''))
    dist = root / "nbos_live_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nbos-live-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[notebookos.policies]\nworst-fit-reservation = nbos_live_plugin:WorstFitReservation\n")


def test_a_plugin_policy_binds_gpus_for_the_session_in_the_live_scheduler(make_cluster, tmp_path):
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    write_plugin(plugin)
    cluster = make_cluster({"PYTHONPATH": str(plugin)})
    cluster.start_gs("--policy", "worst-fit-reservation")
    cluster.start_ls("host-0", gpus=2)
    cluster.start_ls("host-1", gpus=2)
    cluster.wait_hosts(2)
    assert cluster.status().policy == "worst-fit-reservation"
    kernel_id, kc = cluster.start_kernel(gpus=1)
    assert len(cluster.kernel(kernel_id).replicas) == 1
    assert cluster.status().gpus_committed == 1  # bound at start, before any cell
    assert result_text(run_cell(kc, "6 * 7")) == "42"
    assert cluster.status().gpus_committed == 1  # and still bound between cells
