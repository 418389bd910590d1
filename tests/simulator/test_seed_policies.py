"""The seeds' schedulers (qssf, ces, lucid, tensorshare, themis) on tiny traces worked out by hand."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from notebookos.policies import get_policy
from notebookos.policies.base import QueuedJob
from notebookos.policies.ces import CESPolicy, NodeForecast
from notebookos.policies.themis import knapsack, knapsack_milp
from notebookos.simulator.config import SimConfig
from notebookos.simulator.runner import job_engine_for, simulate
from notebookos.testing.optional import require_torch
from notebookos.workload.interference import slowdown
from notebookos.workload.model import jobs_workload


def run(rows, policy, hosts=1, gpus=4, **params):
    workload = jobs_workload(rows, "hand")
    policy_obj = policy if not isinstance(policy, str) else get_policy(policy, **params)
    engine = job_engine_for(policy_obj)
    record = engine(workload, policy_obj, SimConfig(hosts=hosts, gpus_per_host=gpus)).run()
    return {t.task_id: (t.start, t.end) for t in record.tasks}, record


# -- qssf ---------------------------------------------------------------------------------------


def test_qssf_orders_by_gpu_time_and_never_backfills():
    # 4 GPUs. A (t=0, 3 GPUs, 10 s) runs. B (t=1, 4 GPUs, 1 s: GPU time 4) and C (t=2, 1 GPU,
    # 5 s: GPU time 5) wait. C fits beside A at t=2 but B is ahead of it (4 < 5) and QSSF has no
    # backfill: B 10-11, then C 11-16. SJF (with backfill) runs C at once.
    rows = [("A", 0, 10, 3), ("B", 1, 1, 4), ("C", 2, 5, 1)]
    result, _ = run(rows, "qssf", estimator="oracle")
    assert result == {"A": (0, 10), "B": (10, 11), "C": (11, 16)}
    sjf, _ = run(rows, "sjf")
    assert sjf["C"] == (2, 7)


def test_qssf_rolling_estimate_learns_from_finished_jobs_of_the_same_name():
    # Two "long" jobs finish first and teach the estimate that "long" runs 100 s; then at t=300 two
    # 1-GPU jobs wait behind a 4-GPU blocker: "long" (estimate 100 s) and "new" (unknown name:
    # the per-GPU-count mean, 100 s too); a third name "short" was seen at 5 s and goes first.
    rows = [("l1", 0, 100, 1, "long"), ("s1", 0, 5, 1, "short"), ("block", 200, 200, 4, "x"),
            ("l2", 300, 100, 1, "long"), ("s2", 301, 5, 1, "short")]
    result, _ = run(rows, "qssf", estimator="rolling")
    assert result["s2"][0] == 400 and result["l2"][0] == 400  # both fit after the blocker
    policy = get_policy("qssf", estimator="rolling")
    rows2 = [("l1", 0, 100, 1, "long"), ("s1", 0, 5, 1, "short"), ("block", 200, 200, 4, "x"),
             ("l2", 300, 100, 3, "long"), ("s2", 301, 5, 3, "short")]
    result, _ = run(rows2, policy)
    # 3-GPU jobs cannot run together on 4 GPUs: the one estimated shorter ("short") goes first.
    assert result["s2"] == (400, 405) and result["l2"] == (405, 505)


def test_qssf_refuses_an_unknown_estimator():
    with pytest.raises(ValueError, match="estimator='psychic' must be one of"):
        get_policy("qssf", estimator="psychic")


# -- ces ----------------------------------------------------------------------------------------


class TrendOnlyCES(CESPolicy):
    """CES with the forecast replaced by "the recent trend continues": the engine's sleep and wake
    mechanics under a decision that can be worked out by hand."""

    def hosts_to_sleep(self, now, running_history, awake):
        if now - self.last_wake < self.keep_awake_s or len(running_history) <= self.history_bins:
            return 0
        if running_history[-1 - self.history_bins] - running_history[-1] < self.his_threshold:
            return 0
        surplus = awake - (int(running_history[-1]) + self.wake_buffer)
        return surplus if surplus >= self.de_threshold else 0


def test_ces_sleeps_idle_hosts_on_a_falling_trend_and_wakes_them_for_arrivals():
    # 4 hosts x 1 GPU, checks every 100 s, a 1-check history window, no buffer. Four 1-GPU jobs run
    # 0-150: at the check at t=200 running fell 4 -> 0, so all 4 hosts sleep. A job arriving at
    # t=1000 wakes one host (300 s): it starts at 1300.
    policy = TrendOnlyCES(check_interval_s=100, history_bins=1, wake_buffer=0, wake_s=300,
                          keep_awake_s=0)
    rows = [(f"j{i}", 0, 150, 1) for i in range(4)] + [("late", 1000, 50, 1)]
    result, record = run(rows, policy, hosts=4, gpus=1)
    assert result["late"] == (1300, 1350)
    extra = record.extra
    assert extra["nodes_put_to_sleep"] == 4 and extra["wakeups"] == 1
    assert extra["nodes_woken_per_wakeup"] == 1.0
    # Asleep: 4 hosts from 200 to 1300 (one wakes), then 3 until the end at 1350.
    assert extra["node_hours_asleep"] == pytest.approx((4 * 1100 + 3 * 50) / 3600, abs=1e-3)


def test_ces_forecast_learns_a_daily_pattern():
    # Running hosts: 10 from 08:00 to 20:00, 2 otherwise, for 5 days, sampled every 10 minutes.
    bins = [10.0 if 48 <= (i % 144) < 120 else 2.0 for i in range(144 * 5)]
    forecast = NodeForecast(600.0, 18)
    history = bins[: 144 * 4 + 110]  # day 5, 18:20: the next 3 h are mostly night
    forecast.maybe_fit(history, now=len(history) * 600.0)
    assert forecast.fits == 1
    predicted = forecast.predict(history)
    # The next 18 bins: 10 more day bins at 10, then 8 night bins at 2: mean 6.44, a drop of 3.6.
    assert predicted == pytest.approx((10 * 10 + 8 * 2) / 18, abs=0.5)


def test_ces_wraps_any_job_policy_and_refuses_bad_bases():
    assert get_policy("ces", base="sjf").backfill is True
    assert get_policy("ces", base="fifo").backfill is False
    with pytest.raises(ValueError, match="needs a job policy"):
        get_policy("ces", base="notebookos")


# -- lucid --------------------------------------------------------------------------------------


def test_lucid_packs_two_medium_jobs_and_not_two_jumbo_ones():
    # One GPU, no profiling pool. dqn (t=0, 100 s) runs; a2c (t=10, 100 s) joins it (Medium +
    # Medium = 2 <= G_SS). From t=10 both run at 1/delta; dqn has 90 s of work left.
    d_dqn, d_a2c = slowdown("dqn", "a2c"), slowdown("a2c", "dqn")
    rows = [("A", 0, 100, 1, "dqn"), ("B", 10, 100, 1, "a2c")]
    result, record = run(rows, "lucid", gpus=1, profile_hosts=0)
    first_end = min(10 + 90 * d_dqn, 10 + 100 * d_a2c)
    assert result["B"][0] == 10 and record.extra["shared_jobs"] == 2
    if 10 + 90 * d_dqn <= 10 + 100 * d_a2c:  # dqn ends first, a2c finishes alone at full speed
        assert result["A"][1] == pytest.approx(first_end)
        assert result["B"][1] == pytest.approx(first_end + 100 - (first_end - 10) / d_a2c)
    # Two Jumbo jobs (vgg16, vgg19) never share: the second waits.
    rows = [("A", 0, 100, 1, "vgg16"), ("B", 10, 100, 1, "vgg19")]
    result, record = run(rows, "lucid", gpus=1, profile_hosts=0)
    assert result["B"] == (100, 200) and record.extra["shared_jobs"] == 0


def test_lucid_profiler_finishes_short_jobs_and_restarts_the_others_in_the_main_pool():
    # 2 hosts x 4 GPUs: host 1 profiles (T_prof = 200 s). A 100-s job ends in the profiler; a 300-s
    # job is profiled 0-200, then starts over on the main host: 200-500.
    rows = [("short", 0, 100, 1, "resnet18"), ("long", 0, 300, 1, "resnet50")]
    result, record = run(rows, "lucid", hosts=2, gpus=4)
    assert result["short"] == (0, 100)
    assert result["long"] == (0, 500)  # start = its profiling run; end = 200 + 300
    assert record.extra["finished_in_profiling"] == 1 and record.extra["profiled_jobs"] == 1
    assert record.integrals.host_s == pytest.approx(2 * 500)  # the profiling host is paid for too


def test_lucid_starvation_guard_promotes_a_job_that_waited_too_long():
    # 4 GPUs, aging 50 s. A 4-GPU job B waits behind 1-GPU jobs that keep arriving (each smaller
    # in GPU time, so normally ahead of it). After 50 s of waiting B goes first.
    rows = ([("A", 0, 60, 4, "vgg16")] + [("B", 1, 10, 4, "vgg19")]
            + [(f"s{i}", 2 + i, 30, 1, "vgg11") for i in range(40)])  # Jumbo: nobody shares
    result, _ = run(rows, "lucid", profile_hosts=0, aging_s=50)
    assert result["B"][0] == 60  # promoted at 51, first when A ends


def test_lucid_has_no_starvation_guard_by_default_so_a_short_job_is_not_queued_behind_old_ones():
    # 4 GPUs, no profiler, true durations. A (4 GPUs) runs 0-8 h. B (4 GPUs, 10 h) arrives at 1 s,
    # C (1 GPU, 100 s) at 7 h. When A ends B has waited 8 h: the old 6-h guard put it first
    # (C ended at 18 h); Algorithm 4 orders by GPUs x estimate alone, so C goes first.
    hour = 3600
    rows = [("A", 0, 8 * hour, 4, "vgg16"), ("B", 1, 10 * hour, 4, "vgg19"),
            ("C", 7 * hour, 100, 1, "vgg11")]
    result, record = run(rows, "lucid", profile_hosts=0, estimator="oracle")
    assert result["C"] == (8 * hour, 8 * hour + 100)
    assert result["B"][0] == 8 * hour + 100
    assert record.extra["starvation_promotions"] == 0


def test_lucid_oracle_estimate_puts_a_short_big_job_before_a_long_small_one():
    # 4 GPUs held by A until 100 s. Waiting: L (1 GPU, 1,000 s: GPU time 1,000) and S (4 GPUs,
    # 10 s: GPU time 40). With the true duration S goes first even though it asks for more GPUs;
    # the default (blind, before any job has finished) estimate orders by GPUs: L first.
    rows = [("A", 0, 100, 4, "vgg16"), ("L", 1, 1000, 1, "vgg19"), ("S", 2, 10, 4, "vgg11")]
    oracle, _ = run(rows, "lucid", profile_hosts=0, estimator="oracle")
    assert oracle["S"] == (100, 110) and oracle["L"][0] == 110
    blind, _ = run(rows, "lucid", profile_hosts=0)
    assert blind["L"][0] == 100 and blind["S"][0] == 1100
    with pytest.raises(ValueError):
        get_policy("lucid", estimator="psychic")


# -- tensorshare ----------------------------------------------------------------------------------


def test_tensorshare_pairs_a_queued_job_within_both_slas():
    # One GPU, gSLA = 2 for every job, oracle predictor. A (dqn) runs 0-100 dedicated (the queue
    # asked for no more than was free). At 100 B (a2c) and C (ppo) wait: B starts and picks C as
    # its partner (both slowdowns <= 2), so both start at 100.
    rows = [("A", 0, 100, 1, "dqn"), ("B", 1, 100, 1, "a2c"), ("C", 2, 100, 1, "ppo")]
    result, record = run(rows, "tensorshare", gpus=1, predictor="oracle", gsla_low=2.0,
                         gsla_high=2.0)
    assert result["A"] == (0, 100)
    assert result["B"][0] == result["C"][0] == 100
    d_b, d_c = slowdown("a2c", "ppo"), slowdown("ppo", "a2c")
    first = 100 + 100 * min(d_b, d_c)
    ends = sorted([result["B"][1], result["C"][1]])
    assert ends[0] == pytest.approx(first)
    assert record.extra["gsla_violation_fraction"] == 0.0
    # Interference-blind sharing pairs them whatever the SLA says (here 1.0: a violation).
    result, record = run(rows, "tensorshare", gpus=1, predictor="blind", gsla_low=1.0,
                         gsla_high=1.0)
    assert result["C"][0] == 100 and record.extra["gsla_violation_fraction"] > 0
    # With gSLA = 1.0 (no slowdown tolerated) nobody shares: C waits for B.
    result, record = run(rows, "tensorshare", gpus=1, predictor="oracle", gsla_low=1.0,
                         gsla_high=1.0)
    assert result["C"] == (200, 300) and record.extra["shared_jobs"] == 0


def hand_tensorshare(pairs, sens, selection):
    """TensorShare whose predictions and sensitivities are set by hand (its caches filled)."""
    policy = get_policy("tensorshare", predictor="oracle", selection=selection, gsla_low=1.5,
                        gsla_high=1.5)
    policy._pairs.update(pairs)
    policy._sens.update(sens)
    return policy


def test_tensorshare_s2_weighs_slowdowns_by_sensitivity_and_s1_does_not():
    # J_R = dqn (gSLA 1.5 for all). Partners: a2c predicted (1.2, 1.2), ppo (1.3, 1.3), and
    # resnet18 (1.1, 1.6: over its gSLA, dropped). Sens: dqn 0.5, a2c 0.1, ppo 1.0.
    # S1: min dR + dJ: a2c 2.4 < ppo 2.6. S2: min dR/Sens(R) + dJ/Sens(J):
    # a2c 1.2/0.5 + 1.2/0.1 = 14.4, ppo 1.3/0.5 + 1.3/1.0 = 3.9: ppo, the less sensitive one.
    pairs = {("dqn", "a2c"): (1.2, 1.2), ("dqn", "ppo"): (1.3, 1.3),
             ("dqn", "resnet18"): (1.1, 1.6)}
    sens = {"dqn": 0.5, "a2c": 0.1, "ppo": 1.0}
    jr = QueuedJob("R", 0.0, 1, 100.0, 100.0, seq=0, name="dqn")
    queue = [QueuedJob(f"Q{i}", 1.0, 1, 100.0, 100.0, seq=i + 1, name=n)
             for i, n in enumerate(("a2c", "ppo", "resnet18"))]
    picks = {}
    for selection in ("s1", "s2"):
        policy = hand_tensorshare(pairs, sens, selection)
        picks[selection] = policy.partner_from_queue(jr, queue, 1.0).name
        assert policy.rejected_by_sla == 1  # resnet18 would pass its gSLA
    assert picks == {"s1": "a2c", "s2": "ppo"}
    # Only the over-SLA candidate: no partner, J_R runs dedicated.
    assert hand_tensorshare(pairs, sens, "s2").partner_from_queue(jr, queue[2:], 1.0) is None


@pytest.fixture(scope="module")
def mlp_tensorshare():
    require_torch()
    return get_policy("tensorshare")


def test_tensorshare_mlp_predictor_is_trained_and_accurate(mlp_tensorshare):
    policy = mlp_tensorshare
    assert 100_000 < policy.predictor.parameters < 130_000  # the paper's ~110K (Table 4)
    assert policy.predictor.test_smape < 10.0  # the paper: 4.8%
    d_r, d_j = policy.predict("vgg19", "resnet50")
    assert abs(d_r - slowdown("vgg19", "resnet50")) < 0.3


def test_tensorshare_counts_violations_over_shared_and_over_all_jobs():
    # One GPU, gSLA 1.0, interference-blind: A (dqn) runs 0-100 dedicated; at 100 B (vgg16) starts
    # and takes C (dqn) as its partner; both are slowed (1.08, 1.21), so both violate. Over the
    # jobs that shared: 2/2; over all jobs (the paper's denominator, sec. 4.1): 2/3.
    rows = [("A", 0, 100, 1, "dqn"), ("B", 1, 100, 1, "vgg16"), ("C", 2, 100, 1, "dqn")]
    result, record = run(rows, "tensorshare", gpus=1, predictor="blind", gsla_low=1.0,
                         gsla_high=1.0)
    assert result["A"] == (0, 100) and result["B"][0] == result["C"][0] == 100
    assert record.extra["gsla_violation_fraction"] == 1.0
    assert record.extra["gsla_violation_fraction_all_jobs"] == pytest.approx(2 / 3, abs=1e-6)


def test_tensorshare_mlp_predicts_each_jobs_own_delta(mlp_tensorshare):
    # The two outputs are the two jobs' slowdowns, not the pair's mean twice: where the truth is
    # lopsided (a light job beside a heavy one suffers more than it inflicts), so is the
    # prediction. Trained on delta itself the net gave both jobs the same value (spread 0.002).
    from notebookos.workload.interference import TYPES, K, P, contention, profile

    def model(a, b):
        return 1.0 + K * contention(profile(a), profile(b)) ** P

    predicted, truth = [], []
    for i, a in enumerate(TYPES):
        for b in TYPES[i + 1:]:
            d_a, d_b = mlp_tensorshare.predict(a, b)
            predicted.append(d_a - d_b)
            truth.append(model(a, b) - model(b, a))
    assert np.std(predicted) > 0.02
    assert np.corrcoef(predicted, truth)[0, 1] > 0.5  # seed 0: 0.69 (the old net: 0.0)
    d_light, d_heavy = mlp_tensorshare.predict("a2c", "vgg19")
    assert d_light > d_heavy  # truth: 1.19 against 1.05


def test_tensorshare_oracle_error_is_a_fixed_per_pair_error():
    exact = get_policy("tensorshare", predictor="oracle")
    noisy = get_policy("tensorshare", predictor="oracle", oracle_error=0.06)
    assert exact.predictor.test_smape == 0.0
    assert 4.0 < noisy.predictor.test_smape < 5.5  # about the paper's 4.8%
    assert noisy.predict("vgg16", "dqn") != exact.predict("vgg16", "dqn")
    assert noisy.predict("vgg16", "dqn") == get_policy(
        "tensorshare", predictor="oracle", oracle_error=0.06).predict("vgg16", "dqn")
    assert noisy.predict("vgg16", "dqn")[1] == noisy.predictor.predict("dqn", "vgg16")[0]
    with pytest.raises(ValueError):
        get_policy("tensorshare", predictor="ridge", oracle_error=0.06)


def test_job_types_table1_gives_every_job_one_of_the_29_types():
    from notebookos.workload.interference import TYPES
    from notebookos.workload.job_types import assign_types

    rows = [(f"J{i}", float(i), 10.0, 1, "dqn") for i in range(300)]
    workload = jobs_workload(rows, "hand")
    assert assign_types(workload, "trace") is workload
    names = [t.name for t in assign_types(workload, "table1").tasks]
    assert set(names) <= set(TYPES) and len(set(names)) == len(TYPES)
    assert names == [t.name for t in assign_types(workload, "table1").tasks]  # deterministic
    assert names != [t.name for t in assign_types(workload, "table1", seed=1).tasks]
    assert [t.submit for t in assign_types(workload, "table1").tasks] == \
        [t.submit for t in workload.tasks]
    with pytest.raises(ValueError):
        assign_types(workload, "table2")


def test_tensorshare_without_torch_says_what_to_do():
    code = ("import importlib.abc, sys\n"
            "class NoTorch(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] == 'torch':\n"
            "            raise ImportError('no torch here')\n"
            "sys.meta_path.insert(0, NoTorch())\n"
            "from notebookos.policies import get_policy\n"
            "try:\n    get_policy('tensorshare')\n"
            "except ValueError as exc:\n    print(exc)\n"
            "print(type(get_policy('tensorshare', predictor='ridge').predictor).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "needs torch" in out.stdout and "predictor=ridge" in out.stdout
    assert "RidgePredictor" in out.stdout


# -- themis -------------------------------------------------------------------------------------


def test_knapsack_dp_and_milp_agree():
    rng = np.random.default_rng(3)
    for _ in range(25):
        n = int(rng.integers(1, 9))
        values = [float(v) for v in rng.random(n)]
        weights = [int(w) for w in rng.choice([1, 2, 4, 8], size=n)]
        capacity = int(rng.integers(0, 20))
        dp_value, dp_items = knapsack(values, weights, capacity)
        milp_value, milp_items = knapsack_milp(values, weights, capacity)
        assert dp_value == pytest.approx(milp_value, abs=1e-9)
        assert sum(weights[i] for i in dp_items) <= capacity


def test_themis_gives_the_worst_off_job_the_gpus_at_the_lease_boundary():
    # 2 GPUs, leases of 10 s. A (t=0, 2 GPUs, 100 s) holds them. B (t=5, 2 GPUs, 10 s) waits.
    # At t=10 A's lease ends: N_avg(A) = (1x5 + 2x5)/10 = 1.5, N_avg(B) = 2; with nothing
    # rho_A = (10 + 90 + 10)/(1.5 x 100) = 0.73, rho_B = (5 + 10 + 10)/(2 x 10) = 1.25: B is the
    # worst-off 20% (one bidder of two), wins the 2 GPUs (no other bidder: no hidden payment), A is
    # preempted. B 10-20, then A resumes 20-110.
    rows = [("A", 0, 100, 2), ("B", 5, 10, 2)]
    for solver in ("dp", "milp"):
        result, record = run(rows, "themis", gpus=2, lease_s=10, solver=solver)
        assert result["B"] == (10, 20) and result["A"] == (0, 110)
        assert record.tasks[0].preemptions == 1


def test_themis_reports_finish_time_fairness_for_every_job_policy():
    rows = [("A", 0, 100, 2), ("B", 5, 10, 2)]
    config = SimConfig(hosts=1, gpus_per_host=2, policy_params={"themis": {"lease_s": 10}})
    summaries = {p: simulate(jobs_workload(rows, "hand"), p, config)[0] for p in ("fifo", "themis")}
    # FIFO: B waits 95 s: JCT 105; two jobs active for 95 s of its life, one for 10 s:
    # N_avg(B) = 200 / 105, rho_B = 105 / (N_avg x 10) = 5.5125.
    assert summaries["fifo"]["max_finish_time_fairness"] == pytest.approx(5.5125)
    assert summaries["themis"]["max_finish_time_fairness"] < 2.0


def test_per_user_finish_time_fairness_and_themis_over_users():
    # One GPU, user u's two 10-s jobs at t=0 under FIFO: 0-10 (N_avg 2) and 10-20 (N_avg
    # 30/20 = 1.5): the user's rho = (10 + 20) / (2 x 10 + 1.5 x 10) = 30/35.
    rows = [("j1", 0, 10, 1, "", "u"), ("j2", 0, 10, 1, "", "u")]
    _, record = run(rows, "fifo", gpus=1)
    assert record.extra["max_user_finish_time_fairness"] == pytest.approx(30 / 35, abs=1e-4)
    # Themis over users with short leases: a user whose cells keep waiting outranks one served
    # already, so the second user's cell does not wait for all of the first user's.
    rows = [("a1", 0, 100, 1, "", "a"), ("a2", 0, 100, 1, "", "a"), ("b1", 1, 10, 1, "", "b")]
    result, record = run(rows, "themis", gpus=1, apps="user", lease_s=10)
    assert result["b1"][1] < 200  # not behind both of a's cells
    assert "max_user_finish_time_fairness" in record.extra
    with pytest.raises(ValueError, match="apps='team' must be job or user"):
        get_policy("themis", apps="team")
