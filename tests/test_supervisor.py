"""The supervisor behind `notebookos up` (real processes): a daemon that dies is restarted with a
capped exponential backoff that never gives up and never stops a sibling, a daemon that became
ready or stayed up starts over with the shortest backoff, the state file says what it does, and
a stop (SIGTERM) ends everything at once even while a restart waits out a long backoff."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from notebookos.ports import free_ports
from notebookos.supervisor import RestartPolicy, Supervisor, describe, port_probe, read_state

pytestmark = pytest.mark.timeout(60)

SLEEPER = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"]
FAILING = [sys.executable, "-c", "import sys; print('bad config', flush=True); sys.exit(3)"]


def _serving_then_exiting(port: int, serve_s: float) -> list[str]:
    """A daemon that opens ``port`` (is ready), serves ``serve_s``, then exits with code 1."""
    return [sys.executable, "-c", textwrap.dedent(f"""
        import socket, sys, time
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", {port}))
        s.listen()
        time.sleep({serve_s})
        sys.exit(1)
    """)]


def _supervise_until(supervisor: Supervisor, predicate, timeout: float = 20) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert supervisor.supervise() is None, "the supervisor wants to stop everything"
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("timed out supervising")


def _delays(said: list[str], name: str) -> list[str]:
    return [line.split("restarting it in ", 1)[1].split(" (", 1)[0] for line in said
            if f"{name} exited" in line]


def test_a_killed_child_is_restarted_and_the_others_keep_running(tmp_path: Path) -> None:
    said: list[str] = []
    supervisor = Supervisor(tmp_path, say=said.append)
    policy = RestartPolicy(backoff_initial_s=0.2, healthy_after_s=0.5)
    try:
        victim = supervisor.start("local-scheduler-1", SLEEPER, restart=policy)
        other = supervisor.start("jupyterlab", SLEEPER, restart=policy)
        other_pid = other.proc.pid
        time.sleep(0.7)
        old_pid = victim.proc.pid
        os.kill(old_pid, signal.SIGKILL)
        _supervise_until(supervisor, lambda: victim.restarts == 1)
        assert victim.proc.pid != old_pid and victim.proc.poll() is None
        assert other.proc.pid == other_pid and other.proc.poll() is None
        assert any("local-scheduler-1 exited (killed by SIGKILL)" in line
                   and "restarting it in 0.2 s (attempt 1)" in line for line in said), said
        assert any("restarted local-scheduler-1" in line for line in said), said
        assert "restart 1 of local-scheduler-1" in victim.log_path.read_text()
        assert supervisor.supervise() is None  # nothing more to do
    finally:
        assert supervisor.stop(grace_s=2) == []


def test_a_failing_daemon_backs_off_exponentially_forever_and_its_siblings_keep_running(
        tmp_path: Path) -> None:
    """CrashLoopBackOff: 1x, 2x, 4x ... the base, capped, with no end; the others untouched."""
    said: list[str] = []
    state_path = tmp_path / "run" / "supervisor.json"
    supervisor = Supervisor(tmp_path / "logs", say=said.append, state_path=state_path,
                            facts={"global_scheduler": "127.0.0.1:1"})
    policy = RestartPolicy(backoff_initial_s=0.05, backoff_max_s=0.4, healthy_after_s=30)
    try:
        lab = supervisor.start("jupyterlab", SLEEPER, restart=policy)
        ls = supervisor.start("local-scheduler-0", SLEEPER, restart=policy)
        siblings = {lab.proc.pid, ls.proc.pid}
        gs = supervisor.start("global-scheduler", FAILING, restart=policy)
        starts = [time.monotonic()]
        seen = 0

        def restarted() -> bool:
            nonlocal seen
            if gs.restarts > seen:
                seen = gs.restarts
                starts.append(time.monotonic())
            return gs.restarts >= 8

        _supervise_until(supervisor, restarted)
        # still going after 8 exits in a row (the old supervisor gave up after 5)
        assert _delays(said, "global-scheduler")[:8] == [
            "0.05 s", "0.1 s", "0.2 s", "0.4 s", "0.4 s", "0.4 s", "0.4 s", "0.4 s"]
        gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
        for gap, delay in zip(gaps, [0.05, 0.1, 0.2, 0.4, 0.4, 0.4, 0.4], strict=False):
            assert gap >= delay - 0.01, (gaps, said)
        assert {lab.proc.pid, ls.proc.pid} == siblings
        assert lab.proc.poll() is None and ls.proc.poll() is None
        assert lab.restarts == ls.restarts == 0

        # the state file says so, for `notebookos status` and JupyterLab
        _supervise_until(supervisor, lambda: gs.state == "restarting")
        doc = read_state(state_path)
        assert doc is not None and doc["global_scheduler"] == "127.0.0.1:1"
        entry = next(d for d in doc["daemons"] if d["name"] == "global-scheduler")
        assert entry["state"] == "restarting" and entry["attempt"] >= 8
        assert 0 <= entry["next_try_at"] - time.time() <= 0.4
        assert entry["last_exit"].startswith("exit code 3 after ")
        text = describe(entry)
        assert text.startswith(f"global-scheduler: restarting, attempt {entry['attempt']}, "
                               "next try in 0 s"), text
        assert [d["state"] for d in doc["daemons"] if d["name"] != "global-scheduler"] == [
            "starting", "starting"]  # up 30 s (healthy_after_s) only later
    finally:
        assert supervisor.stop(grace_s=2) == []
    assert not state_path.exists()


def test_a_daemon_that_became_ready_starts_over_with_the_shortest_backoff(
        tmp_path: Path) -> None:
    """Ready (its port answered) and served, then exited: each exit is attempt 1 again, while
    the same exits without readiness back off."""
    said: list[str] = []
    supervisor = Supervisor(tmp_path, say=said.append)
    policy = RestartPolicy(backoff_initial_s=0.05, backoff_max_s=10, healthy_after_s=30)
    (port,) = free_ports(1)
    try:
        serving = supervisor.start("global-scheduler", _serving_then_exiting(port, 0.4),
                                   restart=policy, ready=port_probe("127.0.0.1", port))
        _supervise_until(supervisor, lambda: serving.restarts >= 4)
        assert _delays(said, "global-scheduler")[:4] == ["0.05 s"] * 4, said
        assert any("global-scheduler is ready again" in line for line in said), said

        unready = supervisor.start("local-scheduler-0", FAILING, restart=policy)
        _supervise_until(supervisor, lambda: unready.restarts >= 4)
        assert _delays(said, "local-scheduler-0")[:4] == ["0.05 s", "0.1 s", "0.2 s", "0.4 s"]
    finally:
        assert supervisor.stop(grace_s=2) == []


def test_a_daemon_that_stayed_up_past_the_reset_period_starts_over(tmp_path: Path) -> None:
    said: list[str] = []
    supervisor = Supervisor(tmp_path, say=said.append)
    policy = RestartPolicy(backoff_initial_s=0.1, healthy_after_s=0.3)
    try:
        child = supervisor.start("local-scheduler-0", SLEEPER, restart=policy)
        for n in range(1, 4):  # killed three times, each after running longer than 0.3 s
            _supervise_until(supervisor, lambda: child.healthy)
            time.sleep(0.1)
            os.kill(child.proc.pid, signal.SIGKILL)
            _supervise_until(supervisor, lambda n=n: child.restarts == n)
        assert _delays(said, "local-scheduler-0") == ["0.1 s"] * 3, said
        assert child.attempt == 1  # the last exit's; 0 again once this start is healthy
        _supervise_until(supervisor, lambda: child.attempt == 0)
    finally:
        assert supervisor.stop(grace_s=2) == []


DRIVER = textwrap.dedent("""
    import signal, sys, threading
    from pathlib import Path
    from notebookos.supervisor import RestartPolicy, Supervisor

    workdir = Path(sys.argv[1])
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # as `notebookos up` does
        signal.signal(sig, lambda *_: stop.set())
    supervisor = Supervisor(workdir / "logs", state_path=workdir / "run" / "supervisor.json")
    policy = RestartPolicy(backoff_initial_s=600, backoff_max_s=600)
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    supervisor.start("jupyterlab", sleeper, restart=policy)
    supervisor.start("local-scheduler-0", sleeper, restart=policy)
    supervisor.start("global-scheduler", [sys.executable, "-c", "raise SystemExit(3)"],
                     restart=policy)
    try:
        print("why:", supervisor.serve(stop), flush=True)
    finally:
        print("leftovers:", supervisor.stop(grace_s=5), flush=True)
""")


def test_sigterm_stops_everything_promptly_during_a_long_backoff(tmp_path: Path) -> None:
    state_path = tmp_path / "run" / "supervisor.json"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        doc = None
        while time.monotonic() < deadline:
            doc = read_state(state_path)
            states = {d["name"]: d["state"] for d in doc["daemons"]} if doc else {}
            if states.get("global-scheduler") == "restarting":
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the daemon never waited for its restart: {doc}")
        gs = next(d for d in doc["daemons"] if d["name"] == "global-scheduler")
        assert gs["next_try_at"] - time.time() > 500  # a 10-minute wait is pending
        pids = [d["pid"] for d in doc["daemons"] if d["name"] != "global-scheduler"]
        t0 = time.monotonic()
        driver.send_signal(signal.SIGTERM)
        out, _ = driver.communicate(timeout=10)
        took = time.monotonic() - t0
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert driver.returncode == 0, out
    assert "why: None" in out and "leftovers: []" in out, out
    assert took < 3, f"SIGTERM took {took:.1f} s to stop everything"
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not state_path.exists()


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
        deadline = time.monotonic() + 20
        why = None
        while why is None and time.monotonic() < deadline:
            why = supervisor.supervise()
            time.sleep(0.05)
    finally:
        supervisor.stop(grace_s=2)
    assert why is not None and why.startswith("daemon exited (exit code 3); stopping")


def test_a_dead_supervisors_state_file_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "supervisor.json"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path.write_text(json.dumps({"supervisor_pid": dead.pid, "daemons": []}))
    assert read_state(path) is None
    path.write_text(json.dumps({"supervisor_pid": os.getpid(), "daemons": []}))
    assert read_state(path) == {"supervisor_pid": os.getpid(), "daemons": []}
    assert read_state(tmp_path / "absent.json") is None


def _slow_to_stop(marks: Path, name: str) -> list[str]:
    """A daemon that, on SIGTERM, notes when it got it and takes 1 s to stop."""
    return [sys.executable, "-c", textwrap.dedent(f"""
        import signal, sys, time
        def stop(*_):
            with open({str(marks)!r}, "a") as f:
                f.write("{name} %f\\n" % time.time())
            time.sleep(1)
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        print("up", flush=True)
        while True:
            time.sleep(1)
    """)]


def test_children_of_one_stop_group_are_stopped_together_after_those_started_later(
        tmp_path: Path) -> None:
    """Local Schedulers stop together (one stopping alone drains its replicas onto the others,
    global_scheduler/host_drain.py); the order between groups stays reverse start order."""
    marks = tmp_path / "marks"
    supervisor = Supervisor(tmp_path, say=lambda _line: None)
    first = supervisor.start("global-scheduler", _slow_to_stop(marks, "gs"))
    group = [supervisor.start(f"local-scheduler-{i}", _slow_to_stop(marks, f"ls{i}"),
                              stop_group="local-schedulers") for i in range(3)]
    for child in (first, *group):  # each has its SIGTERM handler in place
        _supervise_until(supervisor, lambda c=child: "up" in c.tail())
    started = time.monotonic()
    supervisor.stop(grace_s=10)
    took = time.monotonic() - started
    got = dict(line.split() for line in marks.read_text().splitlines())
    ls_times = [float(got[f"ls{i}"]) for i in range(3)]
    assert max(ls_times) - min(ls_times) < 0.5, got  # not one after another (1 s each)
    assert float(got["gs"]) >= max(ls_times) + 0.9, got  # after the group had stopped
    assert took < 3.5, f"stopping took {took:.1f} s"
