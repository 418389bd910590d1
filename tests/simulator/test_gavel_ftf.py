"""Gavel's finish-time-fairness solve and Muri's "themis" engine (issue 35)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from notebookos.policies.gavel_ftf import ftf_allocation, ftf_value
from notebookos.simulator.config import SimConfig
from notebookos.simulator.job_ftf import FTFJobSimulator, GavelFTF
from notebookos.workload.model import jobs_workload

SOLVERS = ["center", pytest.param("ecos", marks=pytest.mark.skipif(
    __import__("importlib").util.find_spec("ecos") is None, reason="ecos not installed"))]


@pytest.mark.parametrize("solver", SOLVERS)
def test_the_gpus_bind_the_max_min_shares_are_unique(solver):
    # One GPU, two 1-GPU jobs. A: new, 100 s to go, isolated time 100 -> rho_A = 1 / x_A.
    # B: waited 100 s, 100 s to go, isolated time 200 -> rho_B = (100 + 100 / x_B) / 200.
    # x_A + x_B = 1 and equal rho: a^2 - 4a + 2 = 0, x_A = 2 - sqrt 2, rho = 1 + 1 / sqrt 2.
    e, R, tput, D, s = [0.0, 100.0], [100.0, 100.0], [1.0, 1.0], [100.0, 200.0], [1.0, 1.0]
    t, binds = ftf_value(e, np.array(R) / tput, D, s, 1.0)
    assert binds and t == pytest.approx(1 + 1 / math.sqrt(2), rel=1e-9)
    x = ftf_allocation(e, R, tput, D, s, 1.0, solver)
    assert x == pytest.approx([2 - math.sqrt(2), math.sqrt(2) - 1], abs=1e-6)


def test_a_job_already_worst_off_sets_the_value_and_the_others_take_the_center():
    # Job 0 waited 5000 s for 1 s of work: rho_0(1) = 5001 / 300 whatever the others get, so the
    # GPUs do not bind. Jobs 1 and 2 need only x >= 0.02 for that; the center of
    # log(1 - x) + 2 log(x - 0.02) per job and log(2 - 1 - x1 - x2) is the root of
    # -1/(1 - x) + 2/(x - 0.02) - 1/(1 - 2x) = 0, x = 0.37567.
    e, R, D = [5000.0, 0.0, 0.0], [1.0, 200.0, 300.0], [300.0, 600.0, 900.0]
    t, binds = ftf_value(e, R, D, [1, 1, 1], 2.0)
    assert not binds and t == pytest.approx(5001 / 300)
    x = ftf_allocation(e, R, [1, 1, 1], D, [1, 1, 1], 2.0, "center")
    assert x[0] == 1.0 and x[1] == pytest.approx(x[2])
    lower = 200 / (t * 600)
    assert lower == pytest.approx(0.02, rel=1e-3)
    assert -1 / (1 - x[1]) + 2 / (x[1] - lower) - 1 / (1 - 2 * x[1]) == pytest.approx(0, abs=1e-6)
    assert x[1] == pytest.approx(0.37567, abs=1e-5)


def test_ecos_returns_what_muris_cvxpy_call_returns():
    pytest.importorskip("ecos")
    # Printed by cvxpy 1.9.3 + ECOS 2.0.14 for Muri's formulation (run_sim.py themis_sim_jobs):
    # the first case above, and six jobs drawn with numpy's default_rng(1) on 8 GPUs.
    x = ftf_allocation([5000, 0, 0], [1, 200, 300], [1, 1, 1], [300, 600, 900], [1, 1, 1], 2.0,
                       "ecos")
    assert x == pytest.approx([1.0, 0.34698, 0.34698], abs=1e-5)
    rng = np.random.default_rng(1)
    e, R, tput = rng.uniform(0, 5000, 6), rng.uniform(100, 1e5, 6), rng.uniform(1, 10, 6)
    D, s = rng.uniform(1e3, 1e5, 6), rng.choice([1, 2, 4, 8], 6).astype(float)
    x = ftf_allocation(e, R, tput, D, s, 8.0, "ecos")
    assert x == pytest.approx([1.0, 0.21016, 0.24337, 0.0394, 0.68329, 0.12633], abs=1e-5)


@pytest.mark.parametrize("solver", SOLVERS)
def test_the_shares_order_the_jobs(solver):
    # One host of 2 GPUs; at t=0 a 2-GPU job A and two 1-GPU jobs B, C, 100 s each. Isolated
    # shares min(ceil(2/3)/s, 1): A 1/2, B and C 1, so rho_A = 0.5/x_A, rho_B = 1/x_B; the GPUs
    # bind at 2 x_A + x_B + x_C = 2: t = 1.5, x_A = 1/3, x_B = x_C = 2/3. Never-run jobs go by x,
    # so B and C run first (end at 100) and A after (200); arrival order would run A first.
    workload = jobs_workload([("A", 0.0, 100.0, 2, "m"), ("B", 0.0, 100.0, 1, "m"),
                              ("C", 0.0, 100.0, 1, "m")], "t")
    engine = FTFJobSimulator(workload, GavelFTF(), SimConfig(hosts=1, gpus_per_host=2,
                                                             placement="consolidated"),
                             solver=solver, overhead=False)
    record = engine.run()
    ends = {t.task_id: t.end for t in record.tasks}
    assert ends == {"A": 200.0, "B": 100.0, "C": 100.0}
    assert engine.solves == 2  # at the arrivals and at B and C's completion


def test_muris_restart_overhead_is_charged_to_running_jobs_at_each_event():
    # A (1 GPU, "dqn": 5 s at 1 GPU) runs alone from 0. B arrives at 50 and runs on the second
    # GPU until 60. At each of those two events A loses 5 s of progress: it ends at 110, not 100.
    workload = jobs_workload([("A", 0.0, 100.0, 1, "dqn"), ("B", 50.0, 10.0, 1, "dqn")], "t")
    engine = FTFJobSimulator(workload, GavelFTF(), SimConfig(hosts=1, gpus_per_host=2,
                                                             placement="consolidated"))
    ends = {t.task_id: t.end for t in engine.run().tasks}
    assert ends == {"A": pytest.approx(110.0), "B": pytest.approx(60.0)}
