"""Gavel's finish-time-fairness allocation, as Muri's simulator runs it for "themis" (issue 35).

Gavel (``scheduler/policies/finish_time_fairness.py``, ``FinishTimeFairnessPolicyWithPerf``) and
Muri's copy of it (``simulator/run_sim.py``, ``themis_sim_jobs``) solve, over the jobs present::

    minimize   max_i rho_i(x),   rho_i(x) = (e_i + R_i / (tput_i x_i)) / D_i
    subject to 0 <= x_i <= 1,    sum_i s_i x_i <= G

with e_i the time since submission, R_i the remaining steps, tput_i the steps a second on the
job's GPUs, D_i the job's "isolated" finish time (the steps it has done at its isolated share plus
its remaining steps at that share), s_i its GPUs and G the cluster's. Write r_i = R_i / tput_i
(remaining seconds at the full share). rho_i falls as x_i grows, so the optimum t* is the least t
at which every job's least share that keeps rho_i <= t, l_i(t) = r_i / (t D_i - e_i), is at most 1
and the shares fit: t* = max(L, t_c) with L = max_i rho_i(1) and t_c the root of
sum_i s_i l_i(t) = G (monotone: bisection). No LP or convex solver is needed for the value.

The shares are unique where the GPUs bind (t_c > L: x_i = l_i(t*)). Where they do not (t* = L,
set by a job that is already worst off at its full share, the common case on an overloaded
trace), every x with l_i(L) <= x_i <= 1 that fits is optimal, and Muri's order (x / executed time)
depends on which one the solver returns. Muri calls cvxpy with ECOS; ECOS's interior-point iterate
on that face is the solver's own. So there are two ways here:

- ``solver="ecos"``: the conic problem cvxpy hands ECOS, built here entry for entry (variables
  t, x, u; ``-t + (R_i/D_i) u_i <= -e_i/D_i``; ``-x <= 0``; ``x <= 1``; ``s'x <= G``; one SOC
  ``(tput_i x_i + u_i, tput_i x_i - u_i, 2)`` per job, i.e. u_i >= 1 / (tput_i x_i)) and solved by
  the ``ecos`` package: the same x as Muri's cvxpy call to the printed digit
  (tests/simulator/test_gavel_ftf.py checks it where ``ecos`` and ``cvxpy`` are installed).
  ``ecos`` comes with the test extra (`pip install -e .[test]`); the daemons do not need it.
- ``solver="center"``: no dependency. The unique shares where the GPUs bind; on a degenerate face
  the analytic center of that face under the same barrier (the free jobs' log(1 - x_i) +
  2 log(x_i - l_i(L)), the capacity's log(G - s'x); the jobs that set L at 1), found by a
  bisection on the capacity's multiplier. ECOS does not land on the center (two free jobs of
  the docstring's test: 0.347 each against 0.376), so this is a stand-in, not Muri's number.

The policy ``gavel-ftf`` (``GavelFTF``, below) is that allocation run as Muri's simulator runs
it; its engine is ``notebookos.simulator.job_ftf.FTFJobSimulator``, which ``notebookos simulate``
picks for it (``runner.job_engine_for``).
"""

from __future__ import annotations

import importlib.util
import math
from typing import ClassVar

import numpy as np

from notebookos.policies.base import Policy, PolicyKind, QueuedJob

__all__ = ["FTF_SOLVERS", "FTF_UNITS", "GavelFTF", "ftf_value", "ftf_allocation"]

FTF_SOLVERS = ("center", "ecos")
FTF_UNITS = ("muri", "gavel")


class GavelFTF(Policy):
    """``gavel-ftf``: Muri's "themis", i.e. Gavel's finish-time-fairness shares recomputed at
    every arrival and completion and run greedily in the order share / executed time (never-run
    jobs first), YARN placement. Not Themis's auction (that is ``themis``). Parameters
    (``--policy-param gavel-ftf.KEY=VALUE``):

    - ``solver``: ``center`` (default, no dependency: the analytic center where the optimum is
      not unique) or ``ecos`` (Muri's solver, the same x as its cvxpy call; needs ``ecos``);
    - ``units``: ``muri`` (default: the isolated time in iterations over the isolated share, as
      Muri computes it) or ``gavel`` (times the throughput, as Gavel does);
    - ``overhead``: charge each running job its model's restart cost at every event (Muri's
      ``overhead_dict``; default true);
    - ``iteration_factor``: Muri's 1.015 on the trace's iteration times (default); it applies to
      jobs whose trace gives ``iterations`` and ``iteration_time`` (Muri's traces) and makes their
      work ``iterations x iteration_time x factor``; 1 keeps the trace's iteration times.
    """

    name: ClassVar[str] = "gavel-ftf"
    kind: ClassVar[PolicyKind] = PolicyKind.JOB
    preemptive: ClassVar[bool] = True
    backfill: ClassVar[bool] = True
    description: ClassVar[str] = ("Gavel's finish-time fairness as Muri's simulator runs its "
                                  "'themis' (max-min rho shares at events, greedy)")

    def __init__(self, *, solver: str = "center", units: str = "muri", overhead: bool = True,
                 iteration_factor: float = 1.015, **kwargs) -> None:
        super().__init__(**kwargs)
        if solver not in FTF_SOLVERS:
            raise ValueError(f"solver={solver!r} must be one of {', '.join(FTF_SOLVERS)}")
        if solver == "ecos" and importlib.util.find_spec("ecos") is None:
            raise ValueError("solver='ecos' needs the ecos package (pip install ecos, or the "
                             "test extra: pip install -e .[test]); solver='center' needs none")
        if units not in FTF_UNITS:
            raise ValueError(f"units={units!r} must be one of {', '.join(FTF_UNITS)}")
        if not isinstance(overhead, bool):
            raise ValueError(f"overhead={overhead!r} must be true or false")
        if (isinstance(iteration_factor, bool) or not isinstance(iteration_factor, int | float)
                or not math.isfinite(iteration_factor) or iteration_factor <= 0):
            raise ValueError(f"iteration_factor={iteration_factor!r} must be a number > 0")
        self.ftf_solver = solver
        self.ftf_units = units
        self.ftf_overhead = overhead
        self.iteration_factor = float(iteration_factor)

    def priority_key(self, job: QueuedJob, now: float) -> tuple:
        return (job.seq,)  # the engine orders the jobs itself, at every event


def _least_shares(t: float, e: np.ndarray, r: np.ndarray, D: np.ndarray) -> np.ndarray:
    denom = t * D - e
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(denom > 0, r / denom, np.inf)
    return np.where(r <= 0, 0.0, out)


def ftf_value(e, r, D, s, G: float) -> tuple[float, bool]:
    """(t*, binds): the least max rho, and whether the GPUs bind there (then the x is unique)."""
    e, r, D, s = (np.asarray(a, dtype=float) for a in (e, r, D, s))
    L = float(np.max((e + r) / D))
    if float(np.dot(s, _least_shares(L, e, r, D))) <= G:
        return L, False
    lo, hi = L, max(L, 1e-12) * 2.0
    while float(np.dot(s, _least_shares(hi, e, r, D))) > G:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if float(np.dot(s, _least_shares(mid, e, r, D))) > G:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return hi, True


def _center(lower: np.ndarray, s: np.ndarray, room: float) -> np.ndarray:
    """argmax sum log(1 - x) + 2 log(x - l) + log(room - s'x) over l < x < 1."""
    w = 1.0 - lower
    slack = room - float(np.dot(s, lower))
    if len(lower) == 0:
        return lower
    if slack <= 0:
        return lower.copy()

    def shares(lam: float) -> np.ndarray:
        a = s * lam * w + 3.0
        return lower + 4.0 * w / (a + np.sqrt(np.maximum(a * a - 8.0 * s * lam * w, 0.0)))

    def excess(lam: float) -> float:  # > 0 while lam is too small
        return 1.0 - lam * (room - float(np.dot(s, shares(lam))))

    lo, hi = 0.0, 1.0
    while excess(hi) > 0:
        lo, hi = hi, hi * 4.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if excess(mid) > 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-14 * hi:
            break
    return shares(hi)


def _ecos(e, R, tput, D, s, G: float) -> np.ndarray:
    import ecos
    import scipy.sparse as sp

    n = len(e)
    rows, cols, vals = [], [], []
    for i in range(n):  # -t + (R_i / D_i) u_i <= -e_i / D_i
        rows += [i, i]
        cols += [0, 1 + n + i]
        vals += [-1.0, R[i] / D[i]]
        rows.append(n + i)  # -x_i <= 0
        cols.append(1 + i)
        vals.append(-1.0)
        rows.append(2 * n + i)  # x_i <= 1
        cols.append(1 + i)
        vals.append(1.0)
        rows.append(3 * n)  # s'x <= G
        cols.append(1 + i)
        vals.append(float(s[i]))
        base = 3 * n + 1 + 3 * i  # (tput x + u, tput x - u, 2) in the second-order cone
        rows += [base, base, base + 1, base + 1]
        cols += [1 + i, 1 + n + i, 1 + i, 1 + n + i]
        vals += [-tput[i], -1.0, -tput[i], 1.0]
    h = np.zeros(3 * n + 1 + 3 * n)
    for i in range(n):
        h[i] = -e[i] / D[i]
        h[2 * n + i] = 1.0
        h[3 * n + 1 + 3 * i + 2] = 2.0
    h[3 * n] = G
    matrix = sp.csc_matrix((vals, (rows, cols)), shape=(6 * n + 1, 1 + 2 * n))
    c = np.zeros(1 + 2 * n)
    c[0] = 1.0
    sol = ecos.solve(c, matrix, h, {"l": 3 * n + 1, "q": [3] * n, "e": 0}, verbose=False)
    x = np.asarray(sol["x"][1:1 + n], dtype=float)
    if not np.all(np.isfinite(x)):
        raise ArithmeticError(f"ECOS returned no allocation: {sol['info'].get('infostring')}")
    return x


def ftf_allocation(e, R, tput, D, s, G: float, solver: str = "center") -> np.ndarray:
    """The shares x of Gavel's finish-time-fairness problem (module docstring).

    ``e``: seconds since submission; ``R``: remaining steps; ``tput``: steps a second at the full
    share; ``D``: isolated finish times (the units Muri gives them); ``s``: GPUs; ``G``: GPUs of
    the cluster."""
    e, R, tput, D, s = (np.asarray(a, dtype=float) for a in (e, R, tput, D, s))
    if solver == "ecos":
        return _ecos(e, R, tput, D, s, float(G))
    if solver != "center":
        raise ValueError(f"unknown solver {solver!r} (center, ecos)")
    r = R / tput
    t, binds = ftf_value(e, r, D, s, G)
    if binds:
        return np.clip(_least_shares(t, e, r, D), 0.0, 1.0)
    rho_full = (e + r) / D
    worst = rho_full >= t * (1.0 - 1e-12)
    x = np.ones(len(e))
    free = ~worst
    room = float(G) - float(np.dot(s[worst], x[worst]))
    x[free] = _center(np.clip(_least_shares(t, e[free], r[free], D[free]), 0.0, 1.0), s[free],
                      room)
    return x
