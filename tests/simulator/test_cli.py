"""``notebookos simulate`` and ``notebookos trace`` end to end (in process, on generated traces)."""

from __future__ import annotations

import csv
import json

import pytest

from notebookos.cli import main
from notebookos.commands.simulate_cmd import trace_label
from notebookos.simulator.progress import ProgressBar
from notebookos.workload.generator import SenseiParams, generate_sensei
from notebookos.workload.readers import read_trace
from notebookos.workload.stats import trace_stats

SUMMARY_KEYS = {
    "policy", "jobs", "avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_s", "makespan_s",
    "interactivity_p50_s", "interactivity_p90_s", "interactivity_p99_s", "immediate_fraction",
    "executor_reuse_fraction", "migrations", "gpu_hours_provisioned", "gpu_hours_used",
    "cost_usd", "revenue_usd", "wall_s",
}


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "sensei.json"
    assert main(["trace", "generate", "--kind", "sensei", "--hours", "6", "--seed", "3",
                 "--out", str(path)]) == 0
    return path


def test_generator_is_deterministic_and_calibrated():
    a = generate_sensei(SenseiParams(hours=200, seed=7))
    assert a == generate_sensei(SenseiParams(hours=200, seed=7))
    assert a != generate_sensei(SenseiParams(hours=200, seed=8))
    durations = sorted(t["duration_in_ticks"] for s in a["sessions"] for t in s["trainings"])
    median = durations[len(durations) // 2]
    p75 = durations[int(len(durations) * 0.75)]
    assert median == 2 and p75 == 5  # minutes: the Sensei CDF's 50th and 75th percentiles


def test_stats_report_the_calibration_figures(trace, capsys):
    stats = trace_stats(read_trace(trace, "template"))
    assert stats["gap_min"]["min"] >= 4 and stats["gap_min"]["p50"] == pytest.approx(5, abs=1)
    assert main(["trace", "stats", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "task_duration_min" in out and "Sensei" in out


def test_simulate_writes_summary_tasks_timeline_and_plots(trace, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(trace), "--format", "template", "--cluster", "3x8",
                 "--policy", "notebookos", "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary) and summary["policy"] == "notebookos"
    with (out / "tasks.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == summary["jobs"] and {"submit_s", "start_s", "end_s", "host"} <= set(rows[0])
    with (out / "timeline.csv").open() as handle:
        header = next(csv.reader(handle))
    assert "subscription_ratio" in header and "gpus_provisioned" in header
    assert {p.name for p in out.glob("*.png")} == {
        "cdf_interactivity_tct.png", "gpu_timeline.png", "subscription_migrations.png",
        "cost.png"}


def test_plots_name_the_trace_and_the_seed_that_generated_it(trace, tmp_path):
    # The trace's own seed decides the workload; simulate --seed does not change a session run.
    assert trace_label(trace) == "sensei.json (sensei-synthetic-6h-seed3, generated with --seed 3)"
    other = tmp_path / "jobs.csv"
    other.write_text("job_id,submit_time\n")
    assert trace_label(other) == "jobs.csv"
    assert trace_label(tmp_path / "missing.json") == "missing.json"


def test_compare_is_deterministic_across_runs(trace, tmp_path):
    args = ["simulate", "--trace", str(trace), "--format", "template", "--cluster", "3x8",
            "--compare", "notebookos,reservation,batch,lcp", "--no-plots", "--quiet", "--out"]
    assert main(args + [str(tmp_path / "a")]) == 0
    assert main(args + [str(tmp_path / "b")]) == 0

    def strip(path):
        return [{k: v for k, v in s.items() if k != "wall_s"}
                for s in json.loads((path / "compare.json").read_text())]

    first = strip(tmp_path / "a")
    assert first == strip(tmp_path / "b")
    assert [s["policy"] for s in first] == ["notebookos", "reservation", "batch", "lcp"]
    assert (tmp_path / "a" / "reservation" / "tasks.csv").read_bytes() == (
        tmp_path / "b" / "reservation" / "tasks.csv").read_bytes()


@pytest.mark.parametrize("extra, message", [
    (["--policy", "gandiva"], "unknown policy 'gandiva'"),
    (["--cluster", "8"], "HOSTSxGPUS"),
    (["--set", "warp=1"], "expected KEY=VALUE"),
])
def test_bad_arguments_get_a_clear_message(trace, capsys, extra, message):
    assert main(["simulate", "--trace", str(trace), "--format", "template", *extra]) == 2
    assert message in capsys.readouterr().err


def test_missing_trace_is_an_error_not_a_crash(tmp_path, capsys):
    assert main(["simulate", "--trace", str(tmp_path / "none.csv"), "--format", "canonical"]) == 2
    assert "no such trace file" in capsys.readouterr().err


def test_progress_bar_is_silent_unless_enabled(capsys):
    import io

    stream = io.StringIO()
    bar = ProgressBar("x", stream=stream)  # a StringIO is not a terminal: tqdm stays silent
    bar(0.5)
    bar.close()
    assert stream.getvalue() == ""
    bar = ProgressBar("x", stream=stream, enabled=True)
    bar(0.5)
    bar(1.0)
    assert "100.0%" in stream.getvalue()
    bar = ProgressBar("x", stream=stream, enabled=False)
    bar(1.0)
    assert stream.getvalue().count("100.0%") == 1


def test_generate_refuses_bad_parameters(tmp_path, capsys):
    assert main(["trace", "generate", "--hours", "0", "--out", str(tmp_path / "x.json")]) == 2
    assert "hours=0.0 must be > 0" in capsys.readouterr().err


def test_policy_parameters_and_settings_reach_the_run(trace, capsys):
    base = ["simulate", "--trace", str(trace), "--format", "template", "--cluster", "3x8",
            "--quiet", "--json"]
    assert main(base + ["--policy", "tiresias", "--policy-param", "tiresias.thresholds=[1]"]) == 0
    assert json.loads(capsys.readouterr().out)["preemptions"] > 0
    assert main(base + ["--policy", "batch", "--set", "container_start_s=100"]) == 0
    assert json.loads(capsys.readouterr().out)["interactivity_p50_s"] >= 104.3  # start + read
    assert main(base + ["--policy", "tiresias", "--policy-param", "tiresias.thresholds=[5,1]"]) == 2
    assert "strictly increasing" in capsys.readouterr().err


def test_compare_takes_the_seeds_policies_and_reports_their_own_figures(tmp_path, capsys):
    trace = tmp_path / "jobs.csv"
    rows = ["job_id,submit_time,duration,num_gpu"] + [
        f"j{i},{i * 30},{60 + (i % 7) * 200},{(1, 2, 4)[i % 3]}" for i in range(60)]
    trace.write_text("\n".join(rows) + "\n")
    out = tmp_path / "cmp"
    assert main(["simulate", "--trace", str(trace), "--format", "canonical", "--cluster", "2x4",
                 "--compare", "fifo,qssf,lucid,themis,tensorshare,ces", "--quiet", "--no-plots",
                 "--policy-param", "tensorshare.predictor=ridge",
                 "--policy-param", "lucid.profile_hosts=0", "--out", str(out)]) == 0
    summaries = {s["policy"]: s for s in json.loads((out / "compare.json").read_text())}
    assert all(s["completed"] == 60 and "p999_queue_s" in s for s in summaries.values())
    assert "max_finish_time_fairness" in summaries["themis"]
    assert "gsla_violation_fraction" in summaries["tensorshare"]
    assert {"node_hours_asleep", "wakeups_per_day", "added_avg_queue_s"} <= set(summaries["ces"])
    assert "p99.9 queue s" in capsys.readouterr().out


def test_job_types_table1_renames_the_jobs_as_tensorshare_simulated_them(tmp_path):
    # Issue 35: TensorShare's simulation drew each Philly job's type from its Table 1 (29 types).
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_time,duration,num_gpu,model_name\n" + "".join(
        f"j{i},{i * 30},{60 + i * 10},1,dqn\n" for i in range(40)))
    out = tmp_path / "run"
    for types in ("trace", "table1"):
        assert main(["simulate", "--trace", str(trace), "--format", "tiresias", "--cluster", "1x2",
                     "--policy", "tensorshare", "--policy-param", "tensorshare.predictor=oracle",
                     "--job-types", types, "--quiet", "--no-plots",
                     "--out", str(out / types)]) == 0
    summaries = {t: json.loads((out / t / "summary.json").read_text()) for t in ("trace", "table1")}
    assert all(s["completed"] == 40 for s in summaries.values())
    assert "gsla_violation_fraction_all_jobs" in summaries["table1"]
    # dqn beside dqn barely slows either; random types make different pairs
    assert summaries["trace"]["mean_shared_slowdown"] != summaries["table1"]["mean_shared_slowdown"]


def test_the_subscription_plot_is_drawn_only_for_policies_that_replicate(trace, tmp_path):
    # Issue 21: it drew flat zero SR lines for reservation, batch and lcp, which do not replicate.
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(trace), "--format", "template", "--cluster", "3x8",
                 "--compare", "reservation,batch", "--out", str(out), "--quiet"]) == 0
    assert {p.name for p in out.glob("*.png")} == {
        "cdf_interactivity_tct.png", "gpu_timeline.png", "cost.png"}


def _summary(capsys) -> dict:
    summary = json.loads(capsys.readouterr().out)
    summary.pop("wall_s")
    return summary


def test_config_simulates_the_live_schedulers_profile(trace, tmp_path, capsys):
    """``--config`` runs what a Global Scheduler started with that file would decide: its policy
    with the parameters the daemon derives (``policies.live.policy_params``), its hibernation
    and queue order; not the policy's own defaults (issue 35)."""
    from notebookos.config import load_config
    from notebookos.policies.live import policy_params

    config = tmp_path / "cluster.toml"
    config.write_text('[cluster]\npolicy = "notebookos"\nmax_subscription_ratio = 0.5\n'
                      '[global_scheduler]\nhibernate_after_s = 3600\n')
    base = ["simulate", "--trace", str(trace), "--format", "template", "--cluster", "3x8",
            "--quiet", "--json"]
    assert main([*base, "--config", str(config)]) == 0
    live = _summary(capsys)
    assert live["policy"] == "notebookos" and live["hibernations"] > 0

    spelled = [f"--policy-param=notebookos.{key}={json.dumps(value)}"
               for key, value in policy_params(load_config(config)).items()]
    assert main([*base, "--policy", "notebookos", *spelled, "--hibernate-after-s", "3600"]) == 0
    assert _summary(capsys) == live
    assert main([*base, "--policy", "notebookos"]) == 0
    assert _summary(capsys) != live  # the policy's own defaults decide otherwise

    assert main([*base, "--config", str(config), "--set", "hibernate_after_s=0"]) == 0
    assert _summary(capsys)["hibernations"] == 0  # the command line over the file


def test_a_bad_config_file_gets_a_clear_message(trace, tmp_path, capsys):
    base = ["simulate", "--trace", str(trace), "--format", "template"]
    assert main([*base, "--config", str(tmp_path / "none.toml")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text('[global_scheduler]\nhibernate_after_s = "soon"\n')
    assert main([*base, "--config", str(bad)]) == 2
    assert f"--config {bad}: " in capsys.readouterr().err
    bad.write_text('[cluster]\npolicy = "gandiva"\n')
    assert main([*base, "--config", str(bad)]) == 2
    assert "unknown policy 'gandiva'" in capsys.readouterr().err
