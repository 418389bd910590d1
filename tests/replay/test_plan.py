"""What a replay plays: inputs, slices, time scale, GPUs as played, and the Sensei grouping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from notebookos.replay import plan
from notebookos.resources import ResourceSpec
from notebookos.workload.model import Session, Task, TraceError, Workload, jobs_workload
from notebookos.workload.sessionize import MIN_GAP_S, sessionize

TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"


def _template(tmp_path: Path) -> Path:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"sessions": [
        {"id": "a", "start_tick": 2, "stop_tick": 10, "trainings": [
            {"start_tick": 3, "duration_in_ticks": 1, "gpus": 1},
            {"start_tick": 6, "duration_in_ticks": 2, "gpus": 3}]},
        {"id": "b", "start_tick": 4, "stop_tick": 8, "trainings": []},
    ]}))
    return path


def test_template_sliced_rebased_and_scaled(tmp_path: Path) -> None:
    w = plan.load_input("template", _template(tmp_path), seed=0)
    w = plan.scale_time(plan.rebase_to_zero(w), 0.02)
    a, b = w.sessions
    assert (a.session_id, a.start, a.stop) == ("a", 0.0, pytest.approx(9.6))
    assert [(t.submit, t.duration) for t in a.tasks] == [pytest.approx((1.2, 1.2)),
                                                         pytest.approx((4.8, 2.4))]
    assert (b.start, b.stop) == (pytest.approx(2.4), pytest.approx(7.2))
    one = plan.first_sessions(w, 1)
    assert [s.session_id for s in one.sessions] == ["a"]


def test_window_keeps_tasks_submitted_inside_and_cuts_sessions(tmp_path: Path) -> None:
    w = plan.load_input("template", _template(tmp_path), seed=0)
    cut = plan.window(w, 300.0, 420.0)  # ticks 5 to 7: only a's second cell is submitted inside
    a, b = cut.sessions
    assert [t.task_id for t in a.tasks] == ["a/1"]
    assert a.tasks[0].submit == pytest.approx(60.0)
    # The cell runs past the window's end: its session stays open until it ends.
    assert a.start == 0.0 and a.stop == pytest.approx(180.0)
    assert (b.start, b.stop) == (pytest.approx(0.0), pytest.approx(120.0))
    with pytest.raises(TraceError, match="no session"):
        plan.window(w, 10_000.0, 20_000.0)


def test_as_played_rounds_gpus_up_to_an_offered_kernelspec(tmp_path: Path) -> None:
    w = plan.load_input("template", _template(tmp_path), seed=0)
    played = plan.as_played(w, {g: plan.kernelspec_request(g) for g in (0, 1, 2, 4, 8)})
    a = played.sessions[0]
    assert a.request == ResourceSpec(1000, 2048, 4, 0.0)
    assert {t.request for t in a.tasks} == {a.request}
    with pytest.raises(TraceError, match="at most 2"):
        plan.as_played(w, {g: plan.kernelspec_request(g) for g in (1, 2)})


def test_kernelspec_requests_are_the_provisioners() -> None:
    from notebookos.provisioner.kernelspecs import GPU_VARIANTS, kernelspec
    from notebookos.provisioner.provisioner import NotebookOSProvisioner

    traits = NotebookOSProvisioner.class_traits()
    for gpus in GPU_VARIANTS:
        config = kernelspec(gpus)["metadata"]["kernel_provisioner"]["config"]
        assert plan.kernelspec_request(config["gpus"], config) == ResourceSpec(
            traits["millicpus"].default_value, traits["memory_mb"].default_value, gpus,
            traits["vram_gb"].default_value)


@pytest.mark.parametrize(("text", "expected"), [
    ("2h:4h", (7200.0, 14400.0)), ("0:90m", (0.0, 5400.0)), ("30:1.5d", (30.0, 129600.0))])
def test_window_syntax(text: str, expected: tuple[float, float]) -> None:
    assert plan.parse_window(text) == expected


@pytest.mark.parametrize("text", ["2h", "4h:2h", "x:1h", "1h:1h"])
def test_bad_windows_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--window|duration"):
        plan.parse_window(text)


def test_bad_scale_and_session_count_are_refused(tmp_path: Path) -> None:
    w = plan.load_input("template", _template(tmp_path), seed=0)
    with pytest.raises(ValueError, match="time-scale"):
        plan.scale_time(w, 0)
    with pytest.raises(ValueError, match="--sessions"):
        plan.first_sessions(w, 0)


def _jobs() -> Workload:
    rows = []
    for i in range(200):  # bursts of 1-, 4- and 8-GPU jobs over a day
        rows.append((f"j{i}", 400.0 * i + (i % 7) * 13, 60.0 + (i % 11) * 90, (1, 4, 8)[i % 3]))
    return jobs_workload(rows, "synthetic")


def test_sessionize_puts_every_task_in_exactly_one_consistent_session() -> None:
    jobs = _jobs()
    grouped = sessionize(jobs, seed=3)
    tasks = [t for s in grouped.sessions for t in s.tasks]
    assert sorted(t.task_id for t in tasks) == sorted(t.task_id for t in jobs.tasks)
    for s in grouped.sessions:
        assert all(t.session_id == s.session_id for t in s.tasks)
        assert len({t.gpus for t in s.tasks}) <= 1
        assert s.start <= min((t.submit for t in s.tasks), default=s.start)
        assert s.stop >= max((t.submit + t.duration for t in s.tasks), default=s.start)
        for before, after in zip(s.tasks, s.tasks[1:], strict=False):
            # one cell at a time, separated by at least the shortest Sensei gap
            assert after.submit >= before.submit + before.duration + MIN_GAP_S
    idle = [s for s in grouped.sessions if not s.tasks]
    assert 0 < len(idle) < len(grouped.sessions)
    assert sessionize(jobs, seed=3) == grouped  # deterministic
    assert sessionize(jobs, seed=4) != grouped
    assert not [s for s in sessionize(jobs, seed=3, idle_sessions=False).sessions if not s.tasks]


def test_sessionize_reuses_a_session_when_the_user_is_back() -> None:
    spec = ResourceSpec(gpus=1)
    jobs = Workload((
        Session("x", 0, None, spec, (Task("x", "x", 0.0, 60.0, spec),)),
        Session("y", 400, None, spec, (Task("y", "y", 400.0, 60.0, spec),)),  # 340 s later
        Session("z", 410, None, spec, (Task("z", "z", 410.0, 60.0, spec),)),  # overlaps y
    ), job_trace=True)
    grouped = sessionize(jobs, seed=0, idle_sessions=False)
    by_task = {t.task_id: s.session_id for s in grouped.sessions for t in s.tasks}
    assert by_task["x"] == by_task["y"] != by_task["z"]


@pytest.mark.skipif(not (TRACES / "sensei").is_dir(), reason=f"no shared traces at {TRACES}")
def test_a_sensei_slice_is_sessions_of_one_gpu_count() -> None:
    w = plan.load_input("sensei", TRACES / "sensei" / "sensei_june_60sec.csv", seed=0)
    cut = plan.first_sessions(plan.window(w, 108 * 3600, 110 * 3600), 10)
    assert len(cut.sessions) == 10
    assert {s.request.gpus for s in cut.sessions} <= {1, 4, 8}
    assert all(t.gpus == s.request.gpus for s in cut.sessions for t in s.tasks)


def test_played_until_is_the_part_a_stopped_run_played() -> None:
    spec = ResourceSpec(1000, 2048, 1, 0.0)
    workload = Workload((
        Session("a", 0.0, 200.0, spec, (Task("a/0", "a", 6.0, 6.0, spec),
                                        Task("a/1", "a", 180.0, 6.0, spec))),
        Session("b", 0.0, 200.0, spec, (Task("b/0", "b", 12.0, 120.0, spec),)),
        Session("late", 50.0, 200.0, spec, ()),
    ), "test")
    part = plan.played_until(workload, 25.0)
    assert part is not None
    assert [t.task_id for s in part.sessions for t in s.tasks] == ["a/0", "b/0"]
    assert [s.session_id for s in part.sessions] == ["a", "b"]
    stops = {s.session_id: s.stop for s in part.sessions}
    assert stops == {"a": 25.0, "b": 132.0}  # b's running cell keeps its session open
    assert plan.played_until(workload, 0.0) is None


def test_the_simulation_beside_a_replay_takes_the_live_clusters_hibernation_and_cell_order():
    from notebookos.config import load_config
    from notebookos.replay.compare import settings_from_live
    from notebookos.simulator.config import SimConfig

    live = load_config(env={}, overrides={"global_scheduler.hibernate_after_s": 900.0,
                                          "global_scheduler.cell_order": "qssf"})
    from notebookos.replay.compare import LOCAL_LATENCIES

    settings = settings_from_live(live, {})
    assert settings == {"cell_order": "qssf", "hibernate_after_s": 900.0, **LOCAL_LATENCIES}
    SimConfig(**settings)  # the simulator takes them as they are
    # the default live cluster hibernates after an hour, and so does its simulation
    assert settings_from_live(load_config(env={}), {})["hibernate_after_s"] == 3600.0
    # --sim-set wins
    assert settings_from_live(live, {"hibernate_after_s": 0.0})["hibernate_after_s"] == 0.0
    assert settings_from_live(live, {"container_start_s": 5.0})["container_start_s"] == 5.0


def test_resimulating_a_run_keeps_the_settings_it_was_simulated_with():
    # --resimulate used only the --sim-set values: a run of a cluster serving waiting cells in
    # qssf order (a seed scheduler's queue sort) was re-simulated in arrival order, without the
    # live cluster's hibernation, so a calibration compared unlike with like.
    from notebookos.replay.compare import resimulate_settings
    from notebookos.simulator.config import SimConfig

    summary = {"simulated": {"settings": {
        "hosts": 4, "gpus_per_host": 4, "autoscale": False, "policy_params": {"min_hosts": 4},
        "cell_order": "qssf", "hibernate_after_s": 3600.0, "container_start_s": 5.0}}}
    settings = resimulate_settings(summary, {"container_start_s": 7.5})
    assert settings == {"cell_order": "qssf", "hibernate_after_s": 3600.0,
                        "container_start_s": 7.5}
    SimConfig(**settings)
    assert resimulate_settings({}, {"state_write_s": 0.1}) == {"state_write_s": 0.1}


def test_the_simulation_beside_a_replay_runs_the_live_schedulers_profile(tmp_path,
                                                                         monkeypatch):
    # Issue 35: the replay's simulation built its policy from policy_params alone, so a
    # plug-in's configuration section (global_scheduler.plugin_config) and the queue sort's
    # never reached it; it now runs the profile the live daemon builds from the same
    # configuration (profile_spec), and keeps it for --resimulate.
    from notebookos.config import load_config
    from notebookos.replay.compare import (
        live_policy_params,
        live_profile_spec,
        resimulate_settings,
        settings_from_live,
        simulate_played,
        simulated_profile,
    )
    from notebookos.simulator import runner

    live = load_config(env={}, overrides={
        "cluster.policy": "notebookos", "global_scheduler.cell_order": "qssf",
        "global_scheduler.plugin_config": '{"policy": {"candidate_limit": 7}, '
                                          '"queue_sort": {"default_s": 5.0}}'})
    spec = live_profile_spec(live)
    engines = []

    class Spied(runner.SessionSimulator):
        def __init__(self, *args, **kwargs):  # noqa: ANN002, ANN003
            super().__init__(*args, **kwargs)
            engines.append(self)

    monkeypatch.setattr(runner, "SessionSimulator", Spied)
    workload = plan.load_input("template", _template(tmp_path), seed=0)
    figures, _ = simulate_played(workload, "notebookos", 3, 4, live_policy_params(live),
                                 autoscale=False, max_hosts=3, seed=0,
                                 settings=settings_from_live(live, {}), profile=spec)
    (sim,) = engines
    assert sim.policy.candidate_limit == 7  # the policy's section, beyond policy_params
    assert sim.profile.policy is sim.policy and sim.mode.profile is sim.profile
    assert sim.cell_order is sim.profile.queue_sort and sim.cell_order.default_s == 5.0
    assert figures["tasks_completed"] == figures["tasks_submitted"] > 0
    assert figures["settings"]["profile"] == spec
    # --resimulate passes the stored profile apart from the simulator's settings
    assert "profile" not in resimulate_settings({"simulated": figures}, {})
    # --sim-set cell_order=... still decides the simulated order (its section dropped)
    other = simulated_profile(spec, {"cell_order": "arrival"})
    assert other["queue_sort"] == "arrival" and "queue_sort" not in other["config"]
    assert simulated_profile(spec, {"cell_order": "qssf"}) is spec


def test_the_local_clusters_jupyter_server_enables_the_notebookos_extension(tmp_path):
    # The extension is enabled for an environment by a data file that editable installs do not
    # get; without it replay --local measured no kernel-ready time (every sample a 404) and its
    # kernel websockets were not TCP_NODELAY. The server's own command line now enables it.
    from jupyter_server.serverapp import ServerApp

    from notebookos.commands._replay_local import EXTENSION, server_argv

    argv = server_argv(8888, "token", tmp_path)
    app = ServerApp()
    app.parse_command_line(argv[3:])
    assert app.jpserver_extensions == {EXTENSION: True}
    assert app.port == 8888
