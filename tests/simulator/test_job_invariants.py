"""Properties of the job engine on random small traces (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from notebookos.policies import get_policy
from notebookos.simulator.config import SimConfig
from notebookos.simulator.jobsim import JobSimulator
from notebookos.workload.model import jobs_workload

jobs = st.lists(
    st.tuples(st.integers(0, 50), st.integers(1, 30), st.sampled_from([1, 2, 4, 8])),
    min_size=1, max_size=25)


def run(trace, policy, placement="pooled", **params):
    rows = [(f"j{i:02d}", float(s), float(d), g) for i, (s, d, g) in enumerate(trace)]
    workload = jobs_workload(rows, "random")
    record = JobSimulator(workload, get_policy(policy, **params),
                          SimConfig(hosts=2, gpus_per_host=8, placement=placement)).run()
    return record


@settings(max_examples=60, deadline=None)
@given(trace=jobs, policy=st.sampled_from(["fifo", "sjf"]),
       placement=st.sampled_from(["pooled", "consolidated"]))
def test_non_preemptive_runs_never_exceed_capacity_and_finish(trace, policy, placement):
    record = run(trace, policy, placement)
    for t in record.tasks:
        assert t.start >= t.submit and t.end == t.start + t.duration
    points = sorted({t.start for t in record.tasks})
    for p in points:
        busy = sum(t.gpus for t in record.tasks if t.start <= p < t.end)
        assert busy <= 16
    if policy == "fifo":
        starts = [t.start for t in record.tasks]
        assert starts == sorted(starts)


@settings(max_examples=60, deadline=None)
@given(trace=jobs, policy=st.sampled_from(["srtf", "tiresias"]))
def test_preemptive_runs_finish_every_job_after_its_own_work(trace, policy):
    params = {"thresholds": [20.0]} if policy == "tiresias" else {}
    record = run(trace, policy, **params)
    for t in record.tasks:
        assert t.end is not None and t.end - t.submit >= t.duration - 1e-9
    # Work conservation at the end: the last job ends no later than all work run back to back.
    total = sum(t.duration for t in record.tasks)
    assert max(t.end for t in record.tasks) <= max(t.submit for t in record.tasks) + total + 1e-6
