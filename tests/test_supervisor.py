"""The supervisor behind `notebookos up`: a daemon that dies is restarted with a backoff, one that
crash-loops stops everything with the reason, and a stop restarts nothing (real processes)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from notebookos.supervisor import RestartPolicy, Supervisor

pytestmark = pytest.mark.timeout(60)

SLEEPER = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"]
FAILING = [sys.executable, "-c", "import sys; print('bad config', flush=True); sys.exit(3)"]


def _supervise_until(supervisor: Supervisor, predicate, timeout: float = 20) -> str | None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        why = supervisor.supervise()
        if why is not None or predicate():
            return why
        time.sleep(0.05)
    raise AssertionError("timed out supervising")


def test_a_killed_child_is_restarted_and_the_others_keep_running(tmp_path: Path) -> None:
    said: list[str] = []
    supervisor = Supervisor(tmp_path, say=said.append)
    policy = RestartPolicy(backoff_initial_s=0.2, min_uptime_s=0.5)
    try:
        victim = supervisor.start("local-scheduler-1", SLEEPER, restart=policy)
        other = supervisor.start("jupyterlab", SLEEPER, restart=policy)
        other_pid = other.proc.pid
        time.sleep(0.7)  # longer than min_uptime_s: the kill is a crash, not a failed start
        old_pid = victim.proc.pid
        os.kill(old_pid, signal.SIGKILL)
        why = _supervise_until(supervisor, lambda: victim.restarts == 1)
        assert why is None
        assert victim.proc.pid != old_pid and victim.proc.poll() is None
        assert other.proc.pid == other_pid and other.proc.poll() is None
        assert any("local-scheduler-1 exited (killed by SIGKILL)" in line
                   and "restarting it in 0.2 s" in line for line in said), said
        assert any("restarted local-scheduler-1" in line for line in said), said
        assert "restart 1 of local-scheduler-1" in victim.log_path.read_text()
        assert supervisor.supervise() is None  # nothing more to do
    finally:
        assert supervisor.stop(grace_s=2) == []


def test_a_crash_loop_stops_with_the_reason_after_backing_off(tmp_path: Path) -> None:
    said: list[str] = []
    supervisor = Supervisor(tmp_path, say=said.append)
    policy = RestartPolicy(backoff_initial_s=0.1, backoff_max_s=0.4, min_uptime_s=5,
                           max_failed_starts=4)
    try:
        child = supervisor.start("global-scheduler", FAILING, restart=policy)
        t0 = time.monotonic()
        why = _supervise_until(supervisor, lambda: False)
        elapsed = time.monotonic() - t0
    finally:
        supervisor.stop(grace_s=2)
    assert why is not None
    assert "global-scheduler crash-loops: it exited 4 times in a row" in why
    assert "exit code 3" in why and "bad config" in why  # the reason and its log
    assert child.restarts == 3
    delays = [line.rsplit("restarting it in ", 1)[1] for line in said if "restarting" in line]
    assert delays == ["0.1 s", "0.2 s", "0.4 s"]  # exponential, capped at backoff_max_s
    assert elapsed >= 0.7


def test_a_child_that_ran_long_enough_starts_over_with_the_shortest_backoff(
        tmp_path: Path) -> None:
    said: list[str] = []
    supervisor = Supervisor(tmp_path, say=said.append)
    policy = RestartPolicy(backoff_initial_s=0.1, min_uptime_s=0.3, max_failed_starts=2)
    try:
        child = supervisor.start("local-scheduler-0", SLEEPER, restart=policy)
        for n in range(1, 4):  # killed three times, each after running longer than 0.3 s
            time.sleep(0.5)
            os.kill(child.proc.pid, signal.SIGKILL)
            assert _supervise_until(supervisor, lambda n=n: child.restarts == n) is None
        assert child.failed_starts == 0
        assert sum("restarting it in 0.1 s" in line for line in said) == 3
    finally:
        supervisor.stop(grace_s=2)


def test_stop_restarts_nothing_and_leaves_no_process(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path, say=lambda _line: None)
    child = supervisor.start("local-scheduler-0", SLEEPER, restart=RestartPolicy())
    assert supervisor.stop(grace_s=2) == []
    assert child.proc.poll() is not None
    assert supervisor.supervise() is None
    assert child.restarts == 0


def test_an_essential_child_without_a_policy_still_stops_everything(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path, say=lambda _line: None)
    try:
        supervisor.start("daemon", FAILING)
        why = _supervise_until(supervisor, lambda: False)
    finally:
        supervisor.stop(grace_s=2)
    assert why is not None and why.startswith("daemon exited (exit code 3); stopping")
