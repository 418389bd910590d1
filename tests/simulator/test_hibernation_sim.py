"""Hibernation in the session engine (issue 34): real runs on small hand-worked session traces.

An idle session kernel stops its replicas after ``hibernate_after_s``; its next cell pays the
wake and needs its replicas placed again; 0 changes nothing.
"""

from __future__ import annotations

import json

import pytest

from notebookos.cli import main
from notebookos.policies import get_policy
from notebookos.resources import ResourceSpec
from notebookos.simulator.config import SimConfig
from notebookos.simulator.runner import summarize_run
from notebookos.simulator.sessionsim import SessionSimulator
from notebookos.workload.model import Session, Task, Workload

NO_PATH = {"request_overhead_s": 0.0, "election_s": 0.0}


def session(sid: str, start: float, stop: float, gpus: int, tasks: list[tuple[float, float]]):
    spec = ResourceSpec(millicpus=1000, memory_mb=1000, gpus=gpus, vram_gb=1.0)
    ts = tuple(Task(f"{sid}/{i}", sid, t, d, spec) for i, (t, d) in enumerate(tasks))
    return Session(sid, start, stop, spec, ts)


def run(sessions, policy: str, hosts: int, gpus: int, **settings):
    config = SimConfig(hosts=hosts, gpus_per_host=gpus, autoscale=False, **{**NO_PATH, **settings})
    record = SessionSimulator(Workload(tuple(sessions)), get_policy(policy), config).run()
    return {t.task_id: t for t in record.tasks}, summarize_run(record, config), record


# One notebook: a cell at 100 s, nothing until 5000 s, a cell then, the session ends at 10000 s.
GAP = [session("A", 0, 10_000, 1, [(100, 10), (5000, 10)])]


def test_an_idle_kernel_hibernates_and_its_next_cell_pays_the_wake():
    # The kernel is up at 2.24 s; its first cell ends at 110 and it hibernates at 1110 (three
    # replicas stopped). The cell at 5000 wakes it: three replicas from the hosts' prewarm pools,
    # 4.85 s, so the cell starts at 5004.85 and ends at 5014.85; the kernel hibernates again at
    # 6014.85 and the session ends asleep at 10000.
    tasks, summary, record = run(GAP, "notebookos", 3, 8, hibernate_after_s=1000)
    assert tasks["A/0"].start == pytest.approx(100)
    assert tasks["A/1"].start == pytest.approx(5004.85)
    assert tasks["A/1"].end == pytest.approx(5014.85)
    assert (summary["hibernations"], summary["wakes"]) == (2, 1)
    assert summary["wake_delay_p50_s"] == summary["wake_delay_p99_s"] == pytest.approx(4.85)
    held = 3 * 1110 + 3 * (6014.85 - 5000)
    assert summary["replica_hours"] == pytest.approx(held / 3600, abs=1e-3)
    assert summary["replica_hours_without_hibernation"] == pytest.approx(3 * 10_000 / 3600,
                                                                         abs=1e-3)
    assert summary["replica_hours_saved"] == pytest.approx((30_000 - held) / 3600, abs=1e-3)
    assert summary["standby_replica_hours"] < 3 * 10_000 / 3600 / 3  # standbys stopped too
    # Every host is given back while the kernel sleeps: nothing is subscribed at the end.
    assert record.integrals.replicas == record.integrals.hibernated_replicas == 0


def test_the_same_run_without_hibernation_holds_the_replicas_all_along():
    tasks, summary, _ = run(GAP, "notebookos", 3, 8)
    assert tasks["A/1"].start == pytest.approx(5000)
    assert (summary["hibernations"], summary["wakes"], summary["wake_delay_p50_s"]) == (0, 0, None)
    assert summary["replica_hours"] == pytest.approx(3 * 10_000 / 3600, abs=1e-3)
    assert summary["replica_hours_saved"] == 0


@pytest.mark.parametrize("policy", ["notebookos", "reservation", "batch", "lcp"])
def test_a_zero_timeout_or_one_longer_than_every_gap_changes_nothing(policy):
    sessions = [*GAP, session("B", 50, 8000, 2, [(60, 500), (700, 30), (4000, 10)])]
    base_tasks, base, _ = run(sessions, policy, 2, 8)
    for timeout in (0.0, 50_000.0):
        tasks, summary, _ = run(sessions, policy, 2, 8, hibernate_after_s=timeout)
        assert [t.row() for t in tasks.values()] == [t.row() for t in base_tasks.values()]
        summary.pop("wall_s"), base.pop("wall_s", None)
        assert summary == base  # the same figures, the same simulated end


def test_a_reservation_gives_its_gpus_back_while_it_sleeps_and_a_wake_waits_for_them():
    # One host of 8 GPUs and two 8-GPU reservations. A's first cell ends at 117.5 (the 7.5 s
    # persist) and A hibernates at 1117.5, giving its 8 GPUs back: B, arriving at 2000, gets them
    # at once. A's cell at 2500 must wait for them: B hibernates at 3117.5, then A's replica is
    # placed again and starts cold (no prewarm pool for a reservation: 4.85 + 2.24 - 1.0 s).
    sessions = [session("A", 0, 9000, 8, [(100, 10), (2500, 10)]),
                session("B", 2000, 9000, 8, [(2100, 10)])]
    tasks, summary, _ = run(sessions, "reservation", 1, 8, hibernate_after_s=1000)
    assert tasks["B/0"].start == pytest.approx(2100)
    assert tasks["A/1"].start == pytest.approx(3117.5 + 4.85 + 1.24)
    assert summary["wakes"] == 1
    assert summary["wake_delay_p99_s"] == pytest.approx(3117.5 + 6.09 - 2500)
    # Without hibernation B's kernel waits for A's session to end.
    tasks, _, _ = run(sessions, "reservation", 1, 8)
    assert tasks["B/0"].start > 9000


def test_per_cell_containers_never_hibernate():
    _, summary, _ = run(GAP, "batch", 3, 8, hibernate_after_s=1000)
    assert (summary["hibernations"], summary["replica_hours"]) == (0, 0)


def test_simulate_takes_hibernate_after_s(tmp_path, capsys):
    trace = tmp_path / "sensei.json"
    assert main(["trace", "generate", "--kind", "sensei", "--hours", "6", "--seed", "3",
                 "--out", str(trace)]) == 0
    capsys.readouterr()
    base = ["simulate", "--trace", str(trace), "--format", "template", "--cluster", "3x8",
            "--policy", "notebookos", "--quiet", "--json"]
    assert main(base) == 0
    off = json.loads(capsys.readouterr().out)
    assert main(base + ["--hibernate-after-s", "600"]) == 0
    on = json.loads(capsys.readouterr().out)
    assert off["hibernations"] == 0 and on["hibernations"] > 0 and on["wakes"] > 0
    assert on["replica_hours"] < off["replica_hours"]
    assert on["replica_hours_without_hibernation"] == pytest.approx(off["replica_hours"], rel=0.05)
    assert main(base[:-1] + ["--hibernate-after-s", "600"]) == 0
    assert "wake p99 s" in capsys.readouterr().out
