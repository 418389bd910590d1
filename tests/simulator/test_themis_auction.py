"""Themis's column auction against the scalar one it replaced, and the lease engine's fast paths.

The auction computes rho for all candidates at once and solves the knapsack over the bidders that
can matter; these tests check it allocates exactly as the scalar formulas over every bidder where
the bidders' values differ, and that where they tie it reaches the same optimum, the earlier bidder
(larger rho, then smaller seq) winning.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from notebookos.policies import get_policy
from notebookos.policies.base import QueuedJob
from notebookos.policies.themis import ThemisPolicy, knapsack
from notebookos.policies.themis_auction import bidders_that_matter
from notebookos.simulator.config import SimConfig
from notebookos.simulator.job_leases import LeaseJobSimulator
from notebookos.workload.model import jobs_workload


def scalar_allocate(policy: ThemisPolicy, candidates, offer, now, n_avg, rng):
    """The auction as it was written first: rho per job, a knapsack over every bidder."""
    def rho(job, holds_gang):
        t_id = max(1.0, n_avg.get(job.seq, 1.0)) * max(job.duration, 1e-9)
        t_sh = (now - job.submit_time) + job.remaining + (0.0 if holds_gang else policy.lease_s)
        if policy.apps == "user":
            user = job.user or job.job_id
            t_sh += policy._user_wall.get(user, 0.0)
            t_id += policy._user_busy.get(user, 0.0)
        return t_sh / t_id

    fit = [j for j in candidates if j.num_gpus <= offer]
    if offer <= 0 or not fit:
        return [], 0
    worst = sorted(fit, key=lambda j: (-rho(j, False), j.seq))
    bidders = worst[: max(1, math.ceil((1.0 - policy.fairness_knob) * len(worst)))]
    gains = [math.log(rho(j, False) / rho(j, True)) for j in bidders]
    weights = [j.num_gpus for j in bidders]
    _, won = knapsack(gains, weights, offer)
    granted, losses = [], 0
    won_value = sum(gains[i] for i in won)
    for i in won:
        rest = [k for k in range(len(bidders)) if k != i]
        without, _ = knapsack([gains[k] for k in rest], [weights[k] for k in rest], offer)
        c = math.exp((won_value - gains[i]) - without)
        if c * weights[i] + 1e-9 >= weights[i] - 0.5:
            granted.append(bidders[i].seq)
        else:
            losses += 1
    left = offer - sum(j.num_gpus for j in candidates if j.seq in set(granted))
    bidding = {j.seq for j in bidders}
    others = [j for j in fit if j.seq not in bidding]
    if left > 0 and others:
        for index in rng.permutation(len(others)):
            job = others[int(index)]
            if job.num_gpus <= left:
                granted.append(job.seq)
                left -= job.num_gpus
                if left == 0:
                    break
    return granted, losses


def random_candidates(rng, n, ties=False):
    """Candidates in an order that is not seq order; with ``ties`` many are identical."""
    def pick(choices, low, high):
        return float(rng.choice(choices)) if ties else float(rng.uniform(low, high))

    jobs = []
    for seq in rng.permutation(n * 2)[:n].tolist():
        duration = pick([60.0, 600.0, 3600.0], 10.0, 5000.0)
        remaining = duration if rng.random() < 0.7 else duration * pick([0.5, 0.8], 0.01, 1.0)
        jobs.append(QueuedJob(f"j{seq}", pick([0.0, 100.0, 250.0], 0.0, 900.0),
                              int(rng.choice([1, 1, 2, 4, 8])), duration, remaining, 0.0, seq,
                              "", f"u{seq % 3}"))
    n_avg = {j.seq: pick([1.0, 2.0, 7.5], 1.0, 8.0) for j in jobs}
    return jobs, n_avg


@pytest.mark.parametrize("apps", ["job", "user"])
def test_the_column_auction_allocates_as_the_scalar_one(apps):
    rng = np.random.default_rng(7)
    for trial in range(60):
        n = int(rng.choice([1, 3, 20, 70, 300]))
        jobs, n_avg = random_candidates(rng, n)
        offer = int(rng.integers(0, 25))
        policy = get_policy("themis", apps=apps, seed=trial)
        if apps == "user":
            policy._user_wall = {"u0": 5000.0, "u1": 10.0}
            policy._user_busy = {"u0": 100.0, "u2": 900.0}
        reference_rng = np.random.default_rng(trial)
        expected, losses = scalar_allocate(policy, jobs, offer, 1000.0, n_avg, reference_rng)
        got = [q.seq for q in policy.allocate(jobs, offer, 64, 1000.0, n_avg=n_avg)]
        assert got == expected, (trial, n, offer)
        assert policy.payment_losses == losses
        assert policy.rng.random() == reference_rng.random()  # the same draws were made


@pytest.mark.parametrize("ties", [False, True])
def test_the_knapsack_over_the_bidders_that_matter_reaches_the_same_optimum(ties):
    rng = np.random.default_rng(11)
    for _ in range(300):
        n = int(rng.integers(1, 60))
        if ties:
            ratios = rng.choice([1.01, 1.5, 2.0], size=n) * rng.choice([1.0, 1.3], size=n)
        else:
            ratios = rng.uniform(1.001, 3.0, size=n)
        weights = rng.choice([1, 2, 4, 8], size=n)
        capacity = int(rng.integers(1, 20))
        rows, gains = bidders_that_matter(ratios, weights, capacity)
        all_gains = [math.log(x) for x in ratios.tolist()]
        full_value, full = knapsack(all_gains, weights.tolist(), capacity)
        rows = np.arange(n) if rows is None else rows
        value, chosen = knapsack(gains, weights[rows].tolist(), capacity)
        # Ties: the full solve's pick among equal-valued sets follows the rounding of its
        # running sums; the value is the same up to that rounding.
        assert value == pytest.approx(full_value, rel=1e-12)
        if not ties:
            assert rows[chosen].tolist() == full and value == full_value


def test_tied_bidders_go_to_the_worst_off_then_the_earliest():
    # Four identical 1-GPU jobs and two GPUs on offer; fairness_knob=0 makes all four bid. Seqs 0
    # and 1 (the earliest) win, as the full solve picks among identical values. (Long jobs: a
    # lease changes their rho little, so the hidden payment, 1 - exp(-gain), leaves them a GPU.)
    jobs = [QueuedJob(f"j{s}", 0.0, 1, 1e5, 1e5, 0.0, s, "", "") for s in (3, 0, 2, 1)]
    policy = get_policy("themis", fairness_knob=0.0)
    assert sorted(q.seq for q in policy.allocate(jobs, 2, 4, 50.0)) == [0, 1]
    expected, _ = scalar_allocate(policy, jobs, 2, 50.0, {}, np.random.default_rng(0))
    assert sorted(expected) == [0, 1]


def lease_run(policy, rows, hosts=2, gpus=4, slow_order=False):
    engine = LeaseJobSimulator(jobs_workload(rows, "hand"), policy,
                               SimConfig(hosts=hosts, gpus_per_host=gpus))
    if slow_order:
        engine._fixed_order = False
    record = engine.run()
    return [(t.start, t.end, t.preemptions) for t in record.tasks], record.extra


class ListOnly:
    """A leasing policy without ``allocate_seqs`` (the engine's generic path)."""

    def __init__(self, inner: ThemisPolicy) -> None:
        self._inner = inner

    def __getattr__(self, name):
        if name == "allocate_seqs":
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_the_lease_engine_paths_agree():
    rng = np.random.default_rng(5)
    rows = [(f"j{i}", float(rng.integers(0, 4000)), float(rng.choice([30, 300, 3000])),
             int(rng.choice([1, 2, 4, 8]))) for i in range(120)]
    fast = lease_run(get_policy("themis", lease_s=120), rows)
    assert fast == lease_run(get_policy("themis", lease_s=120), rows, slow_order=True)
    assert fast == lease_run(ListOnly(get_policy("themis", lease_s=120)), rows)
    assert fast[1]["auctions"] > 100 and fast[1]["leftover_grants"] > 0
