"""Exact JCTs of fifo, sjf, srtf and tiresias on tiny traces, worked out by hand."""

from __future__ import annotations

import pytest

from notebookos.policies import get_policy
from notebookos.simulator.config import SimConfig
from notebookos.simulator.jobsim import JobSimulator
from notebookos.workload.model import jobs_workload

# One host with 4 GPUs. A (t=0, 10 s, 4 GPUs), B (t=1, 2 s, 4 GPUs), C (t=2, 1 s, 2 GPUs).
TRACE = [("A", 0, 10, 4), ("B", 1, 2, 4), ("C", 2, 1, 2)]


def run(trace, policy, hosts=1, gpus=4, **config):
    params = config.pop("params", {})
    workload = jobs_workload(trace, "hand")
    record = JobSimulator(workload, get_policy(policy, **params),
                          SimConfig(hosts=hosts, gpus_per_host=gpus, **config)).run()
    return {t.task_id: (t.start, t.end) for t in record.tasks}, record


def jcts(result, trace):
    submit = {j: s for j, s, _, _ in trace}
    return {j: end - submit[j] for j, (_, end) in result.items()}


def test_fifo_runs_in_arrival_order():
    # A 0-10, B 10-12, C 12-13 (C could fit beside nobody: B holds all 4 GPUs).
    result, _ = run(TRACE, "fifo")
    assert result == {"A": (0, 10), "B": (10, 12), "C": (12, 13)}
    assert jcts(result, TRACE) == {"A": 10, "B": 11, "C": 11}


def test_sjf_picks_the_shortest_waiting_job_when_gpus_free_up():
    # At 10 both B (2 s) and C (1 s) wait: C first (10-11); B needs all 4 GPUs, so 11-13.
    result, _ = run(TRACE, "sjf")
    assert jcts(result, TRACE) == {"A": 10, "B": 12, "C": 9}


def test_srtf_preempts_for_shorter_remaining_time():
    # t=1: B (2 s) < A (9 s left): A is preempted, B runs 1-3. t=2: C (1 s) ties B's 1 s left;
    # B arrived first and keeps the GPUs. t=3: C runs 3-4 on 2 GPUs; A needs 4: waits. A 4-13.
    result, record = run(TRACE, "srtf")
    assert result == {"A": (0, 13), "B": (1, 3), "C": (3, 4)}
    assert jcts(result, TRACE) == {"A": 13, "B": 2, "C": 2}
    assert [t.preemptions for t in record.tasks] == [1, 0, 0]


def test_tiresias_demotes_a_job_when_its_attained_service_crosses_the_threshold():
    # Threshold 8 GPU-s. t=1: B joins queue 0 behind A (FIFO inside a queue), A keeps running.
    # t=2: A has 4 GPUs x 2 s = 8 GPU-s: demoted to queue 1; C arrives. Order B, C, A:
    # B runs 2-4 (all 4 GPUs), C 4-5, A (8 s left) 5-13.
    result, _ = run(TRACE, "tiresias", params={"thresholds": [8]})
    assert result == {"A": (0, 13), "B": (2, 4), "C": (4, 5)}
    assert jcts(result, TRACE) == {"A": 13, "B": 3, "C": 3}


def test_tiresias_keeps_running_a_job_that_stays_in_queue_zero():
    # Threshold 100 GPU-s: nobody is demoted, so Tiresias behaves as FIFO with backfill.
    result, _ = run(TRACE, "tiresias", params={"thresholds": [100]})
    assert jcts(result, TRACE) == {"A": 10, "B": 11, "C": 11}


def test_strict_fifo_blocks_while_sjf_backfills():
    # 4 GPUs. X (t=0, 5 s, 2 GPUs), Y (t=1, 5 s, 4 GPUs), Z (t=2, 1 s, 2 GPUs).
    trace = [("X", 0, 5, 2), ("Y", 1, 5, 4), ("Z", 2, 1, 2)]
    fifo, _ = run(trace, "fifo")
    assert fifo == {"X": (0, 5), "Y": (5, 10), "Z": (10, 11)}  # Z waits behind Y
    sjf, _ = run(trace, "sjf")
    assert sjf == {"X": (0, 5), "Z": (2, 3), "Y": (5, 10)}  # Z backfills beside X


@pytest.mark.parametrize("placement, expected", [("pooled", (1, 3)), ("consolidated", (2, 4))])
def test_pooled_spans_hosts_but_consolidated_waits_for_one_host(placement, expected):
    # Two hosts of 4 GPUs. P and Q (3 GPUs each, t=0, 2 s) fill 3+3; R (t=1, 2 GPUs, 2 s): pooled
    # takes 1 GPU from each host at once; consolidated must wait until one host frees at t=2.
    trace = [("P", 0, 2, 3), ("Q", 0, 2, 3), ("R", 1, 2, 2)]
    result, record = run(trace, "fifo", hosts=2, placement=placement)
    assert result["R"] == expected
    r = next(t for t in record.tasks if t.task_id == "R")
    assert r.host.count("+") == (1 if placement == "pooled" else 0)


def test_preemption_overhead_is_added_to_the_preempted_job():
    result, _ = run(TRACE, "srtf", preemption_overhead_s=1.5)
    assert result["A"] == (0, 14.5)


def test_a_job_larger_than_the_cluster_is_reported_not_run():
    result, record = run([("big", 0, 5, 8), ("ok", 0, 1, 1)], "fifo")
    assert record.unschedulable == ["big"]
    assert result["ok"] == (0, 1) and result["big"] == (None, None)
