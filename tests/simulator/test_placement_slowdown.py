"""Placement sensitivity (issue 35, Themis): a job spread over hosts runs slower by its model's
factor (``notebookos.simulator.job_placement``), Themis's bids see the offered placement, and
with the switch off the engine is the one before."""

from __future__ import annotations

import numpy as np
import pytest

from notebookos.policies import get_policy
from notebookos.policies.base import QueuedJob
from notebookos.simulator.config import SimConfig
from notebookos.simulator.job_leases import LeaseJobSimulator
from notebookos.simulator.job_placement import cross_host_factor, is_sensitive, slowdown
from notebookos.simulator.jobsim import JobSimulator
from notebookos.simulator.runner import job_engine_for
from notebookos.workload.model import jobs_workload

# Two hosts of 4 GPUs. A and B (DQN, 3 GPUs, 100 s) leave one GPU free on each host at t=1,
# when C (VGG16, 2 GPUs, 10 s) arrives: pooled placement must spread it over both hosts.
SPREAD = [("A", 0, 100, 3, "dqn"), ("B", 0, 100, 3, "dqn"), ("C", 1, 10, 2, "vgg16")]


def run(rows, policy="fifo", hosts=2, gpus=4, engine=JobSimulator, **config):
    record = engine(jobs_workload(rows, "hand"), get_policy(policy),
                    SimConfig(hosts=hosts, gpus_per_host=gpus, **config)).run()
    return {t.task_id: (t.start, t.end) for t in record.tasks}, record


def test_the_factors_follow_the_models_communication():
    assert cross_host_factor("vgg16") == pytest.approx(103.6 / 80.4, abs=0.01)  # Themis Table 1
    assert cross_host_factor("VGG16") == cross_host_factor("vgg16")
    assert cross_host_factor("resnet18") < cross_host_factor("bert") <= cross_host_factor("gpt2")
    assert cross_host_factor("dqn") == 1.0
    assert cross_host_factor("never-heard-of-it") == 1.1  # Themis's starting S (footnote 3)
    assert slowdown("vgg16", 1) == 1.0 and slowdown("vgg16", 2) == cross_host_factor("vgg16")
    assert is_sensitive("vgg19") and not is_sensitive("resnet18")


def test_a_job_spread_over_two_hosts_finishes_later_by_its_models_factor():
    result, record = run(SPREAD, placement_slowdown="model")
    start, end = result["C"]
    assert start == 1 and end - start == pytest.approx(10 * cross_host_factor("vgg16"))
    assert result["A"] == (0, 100) and result["B"] == (0, 100)  # one host each: not slowed
    assert record.extra["spread_starts"] == 1
    off, record = run(SPREAD)
    assert off["C"] == (1, 11) and "spread_starts" not in record.extra


def test_a_consolidated_job_is_not_slowed():
    rows = [("A", 0, 100, 3, "dqn"), ("C", 1, 10, 2, "vgg16")]  # host 2 is empty: C fits there
    result, record = run(rows, placement_slowdown="model")
    assert result["C"] == (1, 11) and record.extra["spread_starts"] == 0


def test_pooled_placement_takes_one_host_before_spreading():
    # A (3 GPUs) on one host, B (2) on the other: 1 and 2 GPUs idle. C (1 GPU) fits on either:
    # most-idle-first takes B's host and leaves 1 + 1, so D (VGG16, 2 GPUs) is spread; best fit
    # (the slowdown on) takes A's host and keeps B's 2 GPUs whole for D.
    rows = [("A", 0, 100, 3, "dqn"), ("B", 0, 100, 2, "dqn"), ("C", 1, 50, 1, "dqn"),
            ("D", 2, 10, 2, "vgg16")]
    result, record = run(rows, placement_slowdown="model")
    assert result["D"] == (2, 12) and record.extra["spread_starts"] == 0
    assert run(rows)[0]["D"] == (2, 12)  # off: spread, but a spread costs nothing
    assert run(rows)[1].tasks[3].host.count("+") == 1


def test_sensitive_placement_waits_for_one_host_only_for_sensitive_models():
    rows = SPREAD + [("D", 1, 10, 2, "resnet18")]
    result, _ = run(rows, policy="sjf", placement="sensitive", placement_slowdown="model")
    assert result["D"][0] == 1  # ResNet: spread at once, a little slower
    assert result["D"][1] - 1 == pytest.approx(10 * cross_host_factor("resnet18"))
    assert result["C"] == (100, 110)  # VGG16 waits for a whole host, then runs at full speed


def test_themis_rho_counts_the_offered_placements_slowdown():
    policy = get_policy("themis")
    job = QueuedJob("j", 0.0, 2, 1000.0, 1000.0, 0.0, 0, "vgg16", "")
    assert policy.rho(job, True, 100.0) == pytest.approx(1100.0 / 1000.0)
    assert policy.rho(job, True, 100.0, slowdown=1.29) == pytest.approx(1390.0 / 1000.0)
    assert policy.rho(job, False, 100.0, slowdown=1.29) > policy.rho(job, True, 100.0, 1.29)


@pytest.mark.parametrize("spread", [0, 1])
def test_themis_prefers_the_job_its_offer_consolidates(spread):
    # Two jobs alike in every way but the placement the offer gives them; only one fits.
    jobs = [QueuedJob(f"j{s}", 0.0, 2, 1e4, 1e4, 0.0, s, "vgg16", "") for s in (0, 1)]
    policy = get_policy("themis", fairness_knob=0.0)  # both bid
    won = policy.allocate(jobs, 2, 4, 600.0, slowdown={spread: 1.29})
    assert [q.seq for q in won] == [1 - spread]
    # without the slowdowns the tie goes to the earliest job
    assert [q.seq for q in get_policy("themis", fairness_knob=0.0).allocate(jobs, 2, 4,
                                                                             600.0)] == [0]


def test_the_lease_engine_offers_each_candidate_its_placements_slowdown():
    # Two hosts of 4; A (3 GPUs) and B (3 GPUs) leave one GPU per host: a 2-GPU VGG16 would be
    # spread (S = 1.29), a 1-GPU job fits one host (S = 1).
    rows = [("A", 0, 1e4, 3, "dqn"), ("B", 0, 1e4, 3, "dqn"), ("C", 1, 10, 2, "vgg16"),
            ("D", 1, 10, 1, "vgg16")]
    engine = LeaseJobSimulator(jobs_workload(rows, "hand"), get_policy("themis"),
                               SimConfig(hosts=2, gpus_per_host=4, placement_slowdown="model"))
    a, b = engine.jobs[0], engine.jobs[1]
    host1, host2 = engine.cluster.hosts.values()
    engine._start(a, [(host1, 3)], 0.0)
    engine._start(b, [(host2, 3)], 0.0)
    seqs = np.asarray([2, 3])
    assert engine._offered_slowdown(seqs, engine._gpus[seqs], []).tolist() == [1.29, 1.0]
    # A's lease has expired: its 3 GPUs are offered too, so host 1 has a block of 4
    assert engine._offered_slowdown(seqs, engine._gpus[seqs], [a]).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("policy, total", [("fifo", 498760.0), ("tiresias", 367062.0),
                                           ("themis", 249964.0)])
def test_the_switch_off_reproduces_the_engine_before_it(policy, total):
    # Sums of JCTs computed with the engine before placement sensitivity (commit 4d384e5).
    rng = np.random.default_rng(35)
    models = ["vgg16", "resnet18", "bert", "dqn", "gpt2", "shufflenet_v2_x1_0"]
    rows = [(f"j{i}", float(rng.integers(0, 6000)), float(rng.choice([60, 600, 3000])),
             int(rng.choice([1, 2, 4, 8])), str(rng.choice(models))) for i in range(80)]
    pol = get_policy(policy)
    record = job_engine_for(pol)(jobs_workload(rows, "hand"), pol,
                                 SimConfig(hosts=3, gpus_per_host=8)).run()
    assert sum(t.end - t.submit for t in record.tasks) == pytest.approx(total, abs=1e-6)
    pol = get_policy(policy)
    on = job_engine_for(pol)(jobs_workload(rows, "hand"), pol,
                             SimConfig(hosts=3, gpus_per_host=8, placement_slowdown="model")).run()
    assert on.extra["spread_starts"] > 0
    assert sum(t.end - t.submit for t in on.tasks) > total  # spread jobs pay for it


def test_the_config_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="placement_slowdown"):
        SimConfig(placement_slowdown="always")


def test_the_simulate_command_takes_the_switch(tmp_path):
    import json

    from notebookos.cli import main

    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_time,duration,num_gpu,model_name\n" + "".join(
        f"j{i},{i * 30},{600 + i * 10},{(3, 3, 2)[i % 3]},{('dqn', 'dqn', 'vgg16')[i % 3]}\n"
        for i in range(30)))
    runs = {}
    for mode in ("off", "model"):
        out = tmp_path / mode
        assert main(["simulate", "--trace", str(trace), "--format", "tiresias", "--cluster", "2x4",
                     "--compare", "fifo,themis", "--placement-slowdown", mode, "--quiet",
                     "--no-plots", "--out", str(out)]) == 0
        runs[mode] = {s["policy"]: s for s in json.loads((out / "compare.json").read_text())}
    assert "placement_slowdown" not in runs["off"]["fifo"]
    assert runs["model"]["themis"]["placement_slowdown"] == "model"
    assert runs["model"]["fifo"]["avg_jct_s"] > runs["off"]["fifo"]["avg_jct_s"]
