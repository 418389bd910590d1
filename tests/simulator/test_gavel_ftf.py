"""Gavel's finish-time-fairness solve and Muri's "themis" engine (issue 35)."""

from __future__ import annotations

import csv
import json
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


# -- gavel-ftf as a policy of ``notebookos simulate`` -------------------------------------------

MURI_HEADER = "job_id,num_gpu,submit_time,iterations,model_name,duration,iteration_time"


def muri_trace(path):
    """A small Muri-format trace (times in ms) on 1x4: bursts of 1-, 2- and 4-GPU jobs whose
    ``duration`` is rounded up to the second as Muri's traces are, so that the work from
    ``iterations`` x ``iteration_time`` differs from it."""
    rows = [MURI_HEADER]
    models = ("vgg16", "resnet18", "dqn", "a2c", "bert")
    for i in range(24):
        iterations, step_ms = 200 + 37 * (i % 9), 90 + 13 * (i % 5)
        duration = -(-iterations * step_ms // 1000) * 1000
        rows.append(f"{i},{(1, 2, 4)[i % 3]},{(i // 4) * 20_000},{iterations},{models[i % 5]},"
                    f"{duration},{step_ms}")
    path.write_text("\n".join(rows) + "\n")
    return path


def test_the_muri_reader_keeps_each_jobs_steps(tmp_path):
    from notebookos.workload.readers import read_trace

    task = read_trace(muri_trace(tmp_path / "t.csv"), "muri").tasks[1]
    assert (task.iterations, task.iteration_s) == (237.0, pytest.approx(0.103))
    assert task.duration == 25.0  # the trace's column, rounded up: 237 x 103 ms = 24.411 s


@pytest.mark.parametrize("solver", SOLVERS)
def test_simulate_runs_gavel_ftf_as_the_engine_does_called_directly(tmp_path, capsys, solver):
    from notebookos.cli import main
    from notebookos.policies import get_policy
    from notebookos.simulator.runner import job_engine_for
    from notebookos.workload.readers import read_trace

    path = muri_trace(tmp_path / "t.csv")
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(path), "--format", "muri", "--cluster", "1x4",
                 "--policy", "gavel-ftf", "--policy-param", f"gavel-ftf.solver={solver}",
                 "--quiet", "--no-plots", "--json", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    with (out / "tasks.csv").open() as f:
        ends = {r["task_id"]: float(r["end_s"]) for r in csv.DictReader(f)}

    # the engine, given the steps by hand as benchmarks/themis_paper.py once did
    workload = read_trace(path, "muri")
    jobs = [(t.task_id, t.submit, t.iterations * t.iteration_s * 1.015, t.gpus, t.name)
            for t in workload.tasks]
    scaled = jobs_workload(jobs, "t")
    steps = {t.task_id: t.iteration_s * 1.015 for t in workload.tasks}
    engine = FTFJobSimulator(scaled, GavelFTF(), SimConfig(hosts=1, gpus_per_host=4,
                                                           placement="consolidated"),
                             solver=solver, iteration_s=[steps[t.task_id] for t in scaled.tasks])
    direct = {t.task_id: t.end for t in engine.run().tasks}
    assert ends == pytest.approx(direct, abs=1e-3)
    assert summary["placement"] == "yarn" and summary["ftf_solves"] == engine.solves
    assert summary["preemptions"] > 0  # the order decided something
    assert job_engine_for(get_policy("gavel-ftf")) is FTFJobSimulator
    # the steps, not the rounded durations, are the work (Muri's jobs.py)
    rounded = FTFJobSimulator(read_trace(path, "muri"), GavelFTF(iteration_factor=1.0),
                              SimConfig(hosts=1, gpus_per_host=4), solver=solver).run()
    assert {t.task_id: t.duration for t in rounded.tasks} == pytest.approx(
        {t.task_id: t.iterations * t.iteration_s for t in workload.tasks})


def test_gavel_ftf_runs_beside_the_other_job_policies(tmp_path, capsys):
    from notebookos.cli import main

    path = muri_trace(tmp_path / "t.csv")
    assert main(["simulate", "--trace", str(path), "--format", "muri", "--cluster", "1x4",
                 "--compare", "fifo,themis,gavel-ftf", "--quiet", "--no-plots", "--json"]) == 0
    summaries = {s["policy"]: s for s in json.loads(capsys.readouterr().out)}
    assert summaries["gavel-ftf"]["completed"] == 24
    assert summaries["themis"]["placement"] == "pooled"


@pytest.mark.parametrize("param, message", [
    ("gavel-ftf.solver=cvxpy", "solver='cvxpy' must be one of center, ecos"),
    ("gavel-ftf.units=seconds", "units='seconds' must be one of muri, gavel"),
    ("gavel-ftf.overhead=maybe", "overhead='maybe' must be true or false"),
    ("gavel-ftf.iteration_factor=0", "iteration_factor=0 must be a number > 0"),
    ("gavel-ftf.lease_s=60", "bad parameters for policy 'gavel-ftf'"),
])
def test_a_bad_gavel_ftf_parameter_gets_a_clear_message(tmp_path, capsys, param, message):
    from notebookos.cli import main

    path = muri_trace(tmp_path / "t.csv")
    assert main(["simulate", "--trace", str(path), "--format", "muri", "--cluster", "1x4",
                 "--policy", "gavel-ftf", "--policy-param", param, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_solver_ecos_without_ecos_says_what_to_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ecos" else real(name, *a))
    with pytest.raises(ValueError, match="needs the ecos package"):
        GavelFTF(solver="ecos")


def test_ces_refuses_gavel_ftf_as_its_base_rather_than_run_it_without_its_engine():
    from notebookos.policies import get_policy

    with pytest.raises(ValueError, match="ces cannot wrap 'gavel-ftf': it runs in its own engine"):
        get_policy("ces", base="gavel-ftf")
