"""The simulator on the real traces in ../shared/traces (skipped where that folder is absent).

The average JCTs are pinned: the simulator is deterministic, and docs/simulator.md reports the same
figures; a change to the engine's semantics shows up here and must be explained there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from notebookos.simulator.config import SimConfig
from notebookos.simulator.runner import simulate
from notebookos.workload.readers import read_trace

TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
SENSEI_WEEK = TRACES / "sensei" / "sensei_week7d_tiresias_sec.csv"
MURI_3 = TRACES / "philly-muri" / "trace3.csv"

needs_traces = pytest.mark.skipif(not SENSEI_WEEK.is_file() or not MURI_3.is_file(),
                                  reason=f"shared traces not found at {TRACES}")

# (trace, cluster) -> policy -> average JCT in seconds (docs/simulator.md, "Validation").
PINNED = {
    ("sensei", 20): {"fifo": 7613.224, "srtf": 4878.892, "tiresias": 5118.0},
    ("sensei", 16): {"fifo": 39395.147, "srtf": 5281.047, "tiresias": 7362.511},
    ("muri3", 8): {"fifo": 991167.0, "srtf": 180116.3, "tiresias": 378392.2},
}


def load(name):
    if name == "sensei":
        return read_trace(SENSEI_WEEK, "tiresias", "s")
    return read_trace(MURI_3, "muri", "ms")


@needs_traces
@pytest.mark.parametrize("trace, hosts", list(PINNED))
def test_job_policies_on_the_shared_traces(trace, hosts):
    workload = load(trace)
    results = {}
    for policy, expected in PINNED[(trace, hosts)].items():
        summary, record = simulate(workload, policy, SimConfig(hosts=hosts, gpus_per_host=8))
        assert summary["completed"] == workload.task_count
        for task in record.tasks:
            assert task.end - task.submit >= task.duration - 1e-6
        assert summary["avg_jct_s"] == pytest.approx(expected, rel=1e-6)
        results[policy] = (summary, record)
    fifo = results["fifo"][1].tasks  # in arrival order (submit time, then job id)
    starts = [t.start for t in fifo]
    assert starts == sorted(starts)  # strict FIFO: nobody overtakes
    assert results["srtf"][0]["avg_jct_s"] < results["fifo"][0]["avg_jct_s"]
    assert results["fifo"][0]["preemptions"] == 0 < results["srtf"][0]["preemptions"]


@needs_traces
def test_every_shared_template_runs_under_every_session_policy():
    for path in sorted((TRACES / "notebookos-templates").glob("*.json")):
        workload = read_trace(path, "template")
        for policy in ("notebookos", "reservation", "batch", "lcp"):
            summary, _ = simulate(workload, policy, SimConfig(hosts=2, gpus_per_host=8))
            assert summary["completed"] == workload.task_count, (path.name, policy)
