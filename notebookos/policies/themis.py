"""``themis``: Themis, finish-time fair GPU allocation by partial-allocation auctions (seed 004).

Every job is an app (the shared traces have no app structure). Its finish-time fairness is
rho = T_shared / T_independent (eq. 1), with, for a rigid job of g GPUs,

- T_shared(G) = (now - submit) + remaining x S(G) / min(G, g) x g ... that is ``(now - submit) +
  remaining x S`` when it holds its gang (G = g) and ``(now - submit) + lease_s + remaining x S``
  when it holds nothing (it waits at least a lease). S(G) >= 1 is the slowdown of the placement
  the offer gives it: 1 when its gang fits on one host of the offer's GPUs, else its model's
  cross-host factor (``notebookos.simulator.job_placement``), when the engine models placement
  (``placement_slowdown = "model"``); without that S = 1 and rho is a JCT ratio. A job that the
  offer would spread thus gains less from winning (a smaller rho(0) / rho(G)) and bids less, so
  the auction prefers consolidated offers, as Themis's placement-aware valuations do;
- T_independent = N_avg x duration, N_avg the time-weighted mean number of active jobs since the
  job arrived (the paper's N_avg x serial time / min(R_C, demand) for a job of demand g <= R_C).

When leases expire or GPUs are free (the engine, ``job_leases``, offers them), rho is refreshed
for every candidate, the ``1 - fairness_knob`` fraction with the largest rho (at least one; f = 0.8:
the worst-off 20%) bid, and the auction picks the proportionally fair allocation: the subset of
bidders whose gangs fit the offer maximising the product of 1/rho (the sum of log 1/rho), solved
exactly (a 0/1 knapsack over whole GPUs: dynamic programming by default, or
``solver="milp"``: ``scipy.optimize.milp``, the same optimum, checked by the tests), over the
bidders that can win (``themis_auction``: rho for every candidate at once, and per gang size only
the best ``offer // size + 1`` bidders). Each winner i pays a hidden payment:
c_i = prod_{j != i} 1/rho_j(with i) / prod_{j != i} 1/rho_j(without i) <= 1 of its allocation
(Pseudocode 1). A rigid gang cannot run on a fraction, so a winner keeps
its gang when c_i x g rounds to g (c_i >= 1 - 0.5 / g) and otherwise returns it to the leftovers;
the leftover GPUs go at random (seeded) to the candidates that did not bid, first fit. Leases last
``lease_s`` (10 min).

For notebooks (``apps="user"``, with short leases, e.g. ``lease_s=60``): an app is a user (a
session of a template), and its rho counts the user's finished cells too: (time its finished cells
took + this cell's so far and to go) / (N_avg x the GPU-busy time they needed), so a user whose
cells have waited a lot outranks one who was served at once. The engine then also reports
``max_user_finish_time_fairness`` (per user: the sum of its cells' completion times over the sum
of N_avg x their durations).

Figures: ``max_finish_time_fairness`` and its percentiles (the engine computes rho at completion
for every job policy, so baselines compare), ``auction_winners``, ``hidden_payment_losses``,
``leftover_grants``.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from notebookos.policies.base import Policy, PolicyKind, QueuedJob
from notebookos.policies.themis_auction import (
    LeaseCandidates,
    bidders_that_matter,
    knapsack,
    knapsack_milp,
    worst_off,
)

__all__ = ["SOLVERS", "LeaseCandidates", "ThemisPolicy", "knapsack", "knapsack_milp"]

SOLVERS = ("dp", "milp")


class ThemisPolicy(Policy):
    name: ClassVar[str] = "themis"
    kind: ClassVar[PolicyKind] = PolicyKind.JOB
    preemptive: ClassVar[bool] = True  # a lease that is not renewed preempts its job
    description: ClassVar[str] = "Themis: finish-time fairness, leases, partial-allocation auctions"

    def __init__(self, *, lease_s: float = 600.0, fairness_knob: float = 0.8,
                 solver: str = "dp", apps: str = "job", seed: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        if lease_s <= 0 or not 0.0 <= fairness_knob < 1.0:
            raise ValueError("lease_s must be > 0 and fairness_knob in [0, 1)")
        if solver not in SOLVERS:
            raise ValueError(f"solver={solver!r} must be one of {', '.join(SOLVERS)}")
        if apps not in ("job", "user"):
            raise ValueError(f"apps={apps!r} must be job or user")
        self.apps = apps
        self._user_wall: dict[str, float] = {}  # per user: time its finished jobs took
        self._user_busy: dict[str, float] = {}  # per user: N_avg x GPU-busy time they needed
        self.lease_s = float(lease_s)
        self.fairness_knob = float(fairness_knob)
        self.solver = knapsack if solver == "dp" else knapsack_milp
        self.rng = np.random.default_rng(seed)
        self._n_avg_table: LeaseCandidates | None = None  # the last auction's candidates
        self.winners = 0
        self.payment_losses = 0
        self.leftover_grants = 0

    # -- finish-time fairness ------------------------------------------------------------------

    def n_avg(self, job: QueuedJob, now: float) -> float:
        """N_avg as the engine measured it at the last auction (the mean number of active jobs
        since the job arrived); 1 when the job was not a candidate there."""
        table = self._n_avg_table
        if table is None:
            return 1.0
        rows = (table.seq == job.seq).nonzero()[0]
        return float(table.n_avg[rows[0]]) if rows.size else 1.0

    def rho(self, job: QueuedJob, holds_gang: bool, now: float, slowdown: float = 1.0) -> float:
        """rho of ``job`` with (``holds_gang``) or without its gang for the next lease, its work
        left running at 1 / ``slowdown`` (S of the offered placement)."""
        t_id = self.n_avg(job, now) * max(job.duration, 1e-9)
        t_sh = ((now - job.submit_time) + job.remaining * max(1.0, slowdown)
                + (0.0 if holds_gang else self.lease_s))
        if self.apps == "user":  # notebooks: the user's finished work counts in its app's rho
            user = job.user or job.job_id
            t_sh += self._user_wall.get(user, 0.0)
            t_id += self._user_busy.get(user, 0.0)
        return t_sh / t_id

    def job_finished(self, job: QueuedJob, now: float) -> None:
        if self.apps == "user":
            user = job.user or job.job_id
            self._user_wall[user] = self._user_wall.get(user, 0.0) + (now - job.submit_time)
            self._user_busy[user] = self._user_busy.get(user, 0.0) + self.n_avg(
                job, now) * job.duration

    def priority_key(self, job: QueuedJob, now: float) -> tuple:
        return (job.submit_time, job.seq)  # queue order only breaks ties; the auction decides

    # -- the auction ---------------------------------------------------------------------------

    def allocate(self, candidates: list[QueuedJob], offer: int, total_gpus: int, now: float,
                 n_avg: dict[int, float] | None = None,
                 slowdown: dict[int, float] | None = None) -> list[QueuedJob]:
        """The jobs that hold GPUs for the next lease (their gangs fit in ``offer``); ``n_avg``:
        each candidate's mean number of active jobs since it arrived (job seq -> N_avg);
        ``slowdown``: S of the placement the offer gives it (job seq -> S >= 1; default 1)."""
        table = LeaseCandidates.from_jobs(candidates, n_avg, slowdown)
        return [table.jobs[s] for s in self.allocate_seqs(table, offer, total_gpus, now)]

    def allocate_seqs(self, table: LeaseCandidates, offer: int, total_gpus: int,
                      now: float) -> list[int]:
        """``allocate`` over columns (what the lease engine calls): the seqs of the jobs that hold
        GPUs for the next lease."""
        self._n_avg_table = table
        if offer <= 0 or not len(table):
            return []
        fit = table
        fits = table.gpus <= offer
        if not fits.all():
            fit = table.take(fits.nonzero()[0])
            if not len(fit):
                return []
        # rho with and without the gang, as ``rho`` computes it, for every candidate at once
        if fit.slowdown is None:
            held = (now - fit.submit) + fit.remaining
        else:
            held = (now - fit.submit) + fit.remaining * fit.slowdown
        t_id = fit.n_avg * np.maximum(fit.duration, 1e-9)
        free = held + self.lease_s
        if self.apps == "user":
            users = [fit.jobs[s].user or fit.jobs[s].job_id for s in fit.seq.tolist()]
            wall = np.asarray([self._user_wall.get(u, 0.0) for u in users])
            held, free = held + wall, free + wall
            t_id = t_id + np.asarray([self._user_busy.get(u, 0.0) for u in users])
        rho_free = free / t_id
        bid = worst_off(rho_free, fit.seq,
                        max(1, math.ceil((1.0 - self.fairness_knob) * len(fit))))
        t_id = t_id[bid]
        ratios = (free[bid] / t_id) / (held[bid] / t_id)
        weights = fit.gpus[bid]
        rows, gains = bidders_that_matter(ratios, weights, offer)
        row_weights = weights.tolist() if rows is None else weights[rows].tolist()
        _, won = self.solver(gains, row_weights, offer)
        granted = self._pay(won, gains, row_weights, offer)
        winner_rows = granted if rows is None else rows[granted]
        winners = fit.seq[bid[winner_rows]].tolist()
        self.winners += len(winners)
        left = offer - sum(row_weights[i] for i in granted)
        if left > 0 and len(fit) > bid.size:
            others = np.ones(len(fit), dtype=bool)
            others[bid] = False
            others = others.nonzero()[0]
            winners += self._leftovers(fit.seq[others], fit.gpus[others], left)
        return winners

    def _pay(self, won: list[int], gains: list[float], weights: list[int],
             offer: int) -> list[int]:
        """The winners that keep their gangs after the hidden payment (Pseudocode 1)."""
        granted = []
        won_value = sum(gains[i] for i in won)
        for i in won:
            rest = [k for k in range(len(gains)) if k != i]
            without, _ = self.solver([gains[k] for k in rest], [weights[k] for k in rest], offer)
            c = math.exp((won_value - gains[i]) - without)  # <= 1: the hidden payment is 1 - c
            if c * weights[i] + 1e-9 >= weights[i] - 0.5:
                granted.append(i)
            else:
                self.payment_losses += 1
        return granted

    def _leftovers(self, seqs: np.ndarray, gpus: np.ndarray, left: int) -> list[int]:
        """The leftover GPUs at random to the jobs that did not bid, first fit."""
        order = self.rng.permutation(seqs.size)
        seqs, gpus = seqs[order], gpus[order]
        granted: list[int] = []
        at = 0
        while left > 0:
            fits = (gpus[at:] <= left).nonzero()[0]
            if not fits.size:
                break
            at += int(fits[0])
            granted.append(int(seqs[at]))
            left -= int(gpus[at])
            self.leftover_grants += 1
            at += 1
        return granted

    def report(self) -> dict:
        return {"auction_winners": self.winners, "hidden_payment_losses": self.payment_losses,
                "leftover_grants": self.leftover_grants}
