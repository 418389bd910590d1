"""Themis's auction as columns: the candidates of one offer as numpy arrays, and the exact knapsack.

An auction on an overloaded cluster has thousands of candidates (Muri trace 2 at 64 GPUs: the
waiting queue stays in the thousands for months of simulated time, and every lease end is an
auction), so rho is computed for all of them at once, the worst-off fraction is found by a
partition, and the knapsack is solved over the only bidders that can matter: of the bidders that
want w GPUs, an optimal allocation of ``offer`` GPUs takes at most ``offer // w``, and only the best
of them; one more per weight is kept so that the solves without each winner (the hidden payments)
see the same optimum as over all bidders. Every value is computed with the same floating-point
operations as the scalar formulas (``ThemisPolicy.rho``), so where the bidders' values differ the
allocation is the one the knapsack over every bidder finds. Where values tie (identical jobs), any
of the tied sets is optimal: here the worst-off bidders (larger rho, then smaller seq) win, where
the solve over every bidder picked by the rounding of its running sums (a last-bit difference).
Themis's figures on the traces it ran before (Sensei at 20x8 and 16x8, Muri 1, 3 and 4) are
unchanged; tests/simulator/test_themis_auction.py checks both cases against the scalar auction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from notebookos.policies.base import QueuedJob

#: A ratio this close below the cut-off may still round to the same log (a tie in value).
_TIE_SLACK = 1e-12


def knapsack(values: list[float], weights: list[int], capacity: int) -> tuple[float, list[int]]:
    """Exact 0/1 knapsack over integer weights: (best value, chosen indices)."""
    n = len(values)
    if n == 0 or capacity <= 0:
        return 0.0, []
    best = np.zeros((n + 1, capacity + 1))
    for i in range(n):
        w, v = weights[i], values[i]
        row = best[i].copy()
        if w <= capacity:
            row[w:] = np.maximum(best[i][w:], best[i][: capacity + 1 - w] + v)
        best[i + 1] = row
    chosen, c = [], capacity
    for i in range(n, 0, -1):
        if best[i][c] != best[i - 1][c]:
            chosen.append(i - 1)
            c -= weights[i - 1]
    return float(best[n][capacity]), sorted(chosen)


def knapsack_milp(values: list[float], weights: list[int], capacity: int) -> tuple[float,
                                                                                    list[int]]:
    """The same problem through scipy.optimize.milp (HiGHS)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    n = len(values)
    if n == 0 or capacity <= 0:
        return 0.0, []
    result = milp(c=-np.asarray(values, dtype=float), integrality=np.ones(n),
                  bounds=Bounds(0, 1),
                  constraints=LinearConstraint(np.asarray([weights], dtype=float), 0, capacity))
    if not result.success:
        raise ValueError(f"themis auction: the solver failed: {result.message}")
    chosen = [i for i, x in enumerate(result.x) if x > 0.5]
    return float(sum(values[i] for i in chosen)), chosen


@dataclass(slots=True)
class LeaseCandidates:
    """The jobs that may hold GPUs for the next lease, one row each, in the engine's order (the
    waiting jobs in queue order, then the expired leases); ``jobs[seq]`` is the job itself (for
    per-user terms)."""

    seq: np.ndarray  # int64
    submit: np.ndarray  # float64
    remaining: np.ndarray
    duration: np.ndarray
    gpus: np.ndarray  # int64
    n_avg: np.ndarray  # N_avg since arrival, >= 1
    jobs: Mapping[int, QueuedJob] | Sequence[QueuedJob]
    # S(G) of the placement the offer gives each candidate (>= 1; 1 on one host), Themis's
    # placement slowdown (eq. 1); None: placement costs nothing (every S = 1)
    slowdown: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.seq.size)

    @classmethod
    def from_jobs(cls, jobs: list[QueuedJob], n_avg: Mapping[int, float] | None = None,
                  slowdown: Mapping[int, float] | None = None) -> LeaseCandidates:
        """From queued jobs; ``n_avg`` (job seq -> N_avg) defaults to 1 for every job, and
        ``slowdown`` (job seq -> S of its offered placement) to none."""
        n_avg = n_avg or {}
        slow = None
        if slowdown is not None:
            slow = np.asarray([max(1.0, slowdown.get(q.seq, 1.0)) for q in jobs], dtype=float)
        return cls(np.asarray([q.seq for q in jobs], dtype=np.int64),
                   np.asarray([q.submit_time for q in jobs], dtype=float),
                   np.asarray([q.remaining for q in jobs], dtype=float),
                   np.asarray([q.duration for q in jobs], dtype=float),
                   np.asarray([q.num_gpus for q in jobs], dtype=np.int64),
                   np.asarray([max(1.0, n_avg.get(q.seq, 1.0)) for q in jobs], dtype=float),
                   {q.seq: q for q in jobs}, slow)

    def take(self, rows: np.ndarray) -> LeaseCandidates:
        return LeaseCandidates(self.seq[rows], self.submit[rows], self.remaining[rows],
                               self.duration[rows], self.gpus[rows], self.n_avg[rows], self.jobs,
                               None if self.slowdown is None else self.slowdown[rows])


def worst_off(rho: np.ndarray, seq: np.ndarray, count: int) -> np.ndarray:
    """Rows of the ``count`` largest rho, largest first, ties by seq (as sorting every row by
    (-rho, seq) and taking the first ``count``)."""
    n = rho.size
    if count >= n or n <= 64:
        return np.lexsort((seq, -rho))[:count]
    cut = np.partition(rho, n - count)[n - count]
    rows = (rho >= cut).nonzero()[0]
    return rows[np.lexsort((seq[rows], -rho[rows]))][:count]


def bidders_that_matter(ratios: np.ndarray, weights: np.ndarray,
                        capacity: int) -> tuple[np.ndarray | None, list[float]]:
    """Of the bidders (values log(ratio), in bidding order), the positions an exact knapsack of
    ``capacity`` can choose, with or without any one winner: per weight w the ``capacity // w + 1``
    best, ties to the earlier bidder; and their values (``math.log``, as the scalar formula).
    ``None``: all of them."""
    sizes = weights.tolist()
    if len(sizes) <= capacity // max(sizes) + 1:  # no weight has more bidders than it may keep
        return None, [math.log(x) for x in ratios.tolist()]
    kept: list[np.ndarray] = []
    for w in set(sizes):
        rows = (weights == w).nonzero()[0]
        k = capacity // w + 1
        if rows.size > k:
            r = ratios[rows]
            cut = np.partition(r, rows.size - k)[rows.size - k]
            rows = rows[r >= cut * (1.0 - _TIE_SLACK)]
            if rows.size > k:
                logs = np.asarray([math.log(x) for x in ratios[rows].tolist()])
                rows = rows[np.lexsort((rows, -logs))][:k]
        kept.append(rows)
    rows = np.sort(np.concatenate(kept))
    return rows, [math.log(x) for x in ratios[rows].tolist()]
