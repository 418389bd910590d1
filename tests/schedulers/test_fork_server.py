"""The fork server: replicas forked from one preloaded interpreter behave as cold ones do (their
own session, their environment, argv and log, their exit code, their own random numbers);
they outlive the server and the Local Scheduler, for a restarted one to take back. Real
processes throughout."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from notebookos.local_scheduler.fork_server import ForkServer, ForkServerError
from notebookos.local_scheduler.launcher import ProcessLauncher, ReplicaSpec
from notebookos.local_scheduler.pid_watch import UNKNOWN_EXIT_CODE
from notebookos.local_scheduler.replica_records import (
    ENV_LS_PID,
    ENV_ORPHAN_GRACE_S,
    ENV_STATE_FILE,
)
from notebookos.testing.processes import pid_alive

pytestmark = pytest.mark.timeout(120)

PROBE = textwrap.dedent("""
    import json, os, sys, time
    import numpy
    out = {"pid": os.getpid(), "sid": os.getsid(0), "argv": sys.argv[1:],
           "env": os.environ.get("PROBE_VALUE"), "draw": float(numpy.random.rand())}
    print(json.dumps(out), flush=True)
    if "--sleep" in sys.argv:
        time.sleep(600)
    sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
""")


@pytest.fixture
def probe_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "fork_probe.py").write_text(PROBE)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return "fork_probe"


def _output(log: Path, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        if text.strip():
            return json.loads(text.strip().splitlines()[0])
        time.sleep(0.05)
    raise AssertionError(f"{log} stayed empty")


def test_a_forked_replica_runs_as_a_cold_one_would(tmp_path: Path, probe_module: str) -> None:
    server = ForkServer(sys.executable, probe_module, tmp_path / "server.log")
    server.start()
    try:
        first = server.fork(["--a", "1"], {"PROBE_VALUE": "x"}, tmp_path / "one.log")
        second = server.fork([], {"PROBE_EXIT": "3"}, tmp_path / "two.log")
        assert first.wait(30) == 0
        assert second.wait(30) == 3
        one, two = _output(tmp_path / "one.log"), _output(tmp_path / "two.log")
        assert one["pid"] == first.pid and one["sid"] == first.pid  # a session of its own
        assert one["argv"] == ["--a", "1"] and one["env"] == "x" and two["env"] is None
        assert one["draw"] != two["draw"]  # NumPy's global random state is not shared
    finally:
        server.close()


def test_a_replica_killed_by_a_signal_reports_it_and_a_stop_reaches_its_group(
        tmp_path: Path, probe_module: str) -> None:
    server = ForkServer(sys.executable, probe_module, tmp_path / "server.log")
    server.start()
    try:
        child = server.fork(["--sleep"], {}, tmp_path / "child.log")
        _output(tmp_path / "child.log")
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(0.2)
        assert child.poll() is None
        os.killpg(child.pid, signal.SIGTERM)
        assert child.wait(30) == -signal.SIGTERM
    finally:
        server.close()


def test_replicas_outlive_the_server_and_are_still_watched(tmp_path: Path,
                                                          probe_module: str) -> None:
    """A replica forked by the server outlives it (issue 33: a Local Scheduler's restart, which
    takes its fork server along, loses no replica); its exit is still reported, its code
    unknown (it is no longer the server's child)."""
    server = ForkServer(sys.executable, probe_module, tmp_path / "server.log")
    server.start()
    child = server.fork(["--sleep"], {}, tmp_path / "child.log")
    _output(tmp_path / "child.log")
    server.close()
    time.sleep(0.5)
    assert pid_alive(child.pid) and child.poll() is None
    os.killpg(child.pid, signal.SIGKILL)
    assert child.wait(30) == UNKNOWN_EXIT_CODE
    with pytest.raises(ForkServerError, match="not running"):
        server.fork([], {}, tmp_path / "late.log")


def test_a_forked_replica_outlives_its_local_scheduler_then_ends_unclaimed(
        tmp_path: Path, probe_module: str) -> None:
    """SIGKILL the process that holds the fork server (as a Local Scheduler would be): the
    replica lives on for its grace, waiting for a restarted Local Scheduler to take it back
    (orphan_watch.py); none does, so it ends."""
    records = tmp_path / "replicas.json"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        from notebookos.local_scheduler.fork_server import ForkServer
        server = ForkServer(sys.executable, {probe_module!r}, Path({str(tmp_path)!r}) / "s.log")
        server.start()
        env = {{"{ENV_LS_PID}": str(os.getpid()), "{ENV_STATE_FILE}": {str(records)!r},
               "{ENV_ORPHAN_GRACE_S}": "2"}}
        child = server.fork(["--sleep"], env, Path({str(tmp_path)!r}) / "child.log")
        time.sleep(600)
    """)], start_new_session=True)
    try:
        pid = _output(tmp_path / "child.log", timeout=60)["pid"]
        assert pid_alive(pid)
        holder.kill()
        holder.wait(10)
        killed = time.monotonic()
        time.sleep(0.5)
        assert pid_alive(pid), "the replica died with its Local Scheduler"
        deadline = time.monotonic() + 30
        while pid_alive(pid):
            assert time.monotonic() < deadline, "an unclaimed replica outlived its grace"
            time.sleep(0.05)
        assert time.monotonic() - killed >= 1.5
        assert "none took this replica back" in (tmp_path / "child.log").read_text()
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait(10)
        with contextlib.suppress(NameError, ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _wait_for(what: str, check, timeout: float = 60) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_the_launcher_forks_when_the_pool_is_empty_and_starts_cold_while_the_server_is_down(
        tmp_path: Path, probe_module: str) -> None:
    exits: dict[int, int] = {}
    launcher = ProcessLauncher(tmp_path / "work", lambda r, code: exits.update({r.pid: code}),
                               module=probe_module, fork_server=True)
    spec = ReplicaSpec("k1", 1, "127.0.0.1:0", (), "file:///nowhere", "key", "hmac-sha256",
                       env={"PROBE_VALUE": "from-spec"})
    server = launcher.fork_server
    assert server is not None
    try:
        _wait_for("the fork server did not start", lambda: server.alive)
        server_pid = server._process.pid  # noqa: SLF001 - whose child a replica is
        forked = launcher.launch(spec)
        assert not forked.from_prewarm_pool and _parent(forked.pid) == server_pid
        assert forked.log_path is not None
        assert _output(forked.log_path)["env"] == "from-spec"

        os.killpg(server_pid, signal.SIGKILL)  # the server dies; its replica exits by itself
        _wait_for("the forked replica was not reported dead", lambda: forked.pid in exits)
        assert exits[forked.pid] in (0, UNKNOWN_EXIT_CODE)  # reaped by the server, or not
        cold = launcher.launch(spec)  # meanwhile: cold, and the server starts again
        assert _parent(cold.pid) == os.getpid()
        assert _output(cold.log_path)["env"] == "from-spec"
        _wait_for("the fork server did not start again", lambda: server.alive)
        again = launcher.launch(spec)
        assert _parent(again.pid) == server._process.pid != server_pid  # noqa: SLF001
        for replica in (cold, again):
            assert replica.process.wait(30) == 0  # the probe exits by itself
            assert launcher.stop(replica, grace_period_s=5) == 0
        _wait_for("stops not reported", lambda: {cold.pid, again.pid} <= exits.keys(), 10)
    finally:
        launcher.close()


def test_the_pool_keeps_forked_replicas_that_wait_for_their_order(tmp_path: Path,
                                                                 probe_module: str) -> None:
    launcher = ProcessLauncher(tmp_path / "work", lambda r, code: None, module=probe_module,
                               fork_server=True)
    spec = ReplicaSpec("k1", 1, "127.0.0.1:0", (), "file:///nowhere", "key", "hmac-sha256",
                       env={"PROBE_VALUE": "promoted"})
    try:
        waiting = launcher.start_prewarmed()  # waits for the fork server's start
        assert launcher.fork_server is not None
        assert _parent(waiting.process.pid) == launcher.fork_server._process.pid  # noqa: SLF001
        time.sleep(0.3)
        assert waiting.alive  # waits for its order
        replica = launcher.launch(spec, waiting)
        assert replica.from_prewarm_pool and replica.pid == waiting.process.pid
        assert replica.log_path is not None
        out = _output(replica.log_path)
        assert out["pid"] == replica.pid == out["sid"] and out["env"] == "promoted"
        assert replica.process.wait(30) == 0

        discarded = launcher.start_prewarmed()
        discarded.discard()
        assert not discarded.alive and not pid_alive(discarded.process.pid)
        with pytest.raises(ForkServerError, match="no waiting child"):
            launcher.fork_server.promote(discarded.process.pid, [], {}, tmp_path / "x.log")
    finally:
        launcher.close()


def test_an_exit_reported_while_a_fork_waits_for_the_callbacks_lock_does_not_stall_the_fork(
        tmp_path: Path, probe_module: str) -> None:
    """The Local Scheduler launches under its lock and waits for the fork server's answer; an
    exit callback that takes that lock must not run on the server's reader (which would then
    never read the answer: a 10 s stall, missed heartbeats, the host dropped; found by
    benchmarks/hibernate.py)."""
    import threading

    lock = threading.Lock()
    exits: list[int] = []

    def on_exit(replica, code: int) -> None:  # noqa: ANN001
        with lock:  # as LocalSchedulerService._replica_exited takes its lock
            exits.append(code)

    launcher = ProcessLauncher(tmp_path / "work", on_exit, module=probe_module, fork_server=True)
    server = launcher.fork_server
    assert server is not None

    def spec(n: int, exit_code: str) -> ReplicaSpec:
        return ReplicaSpec(f"k{n}", 1, "127.0.0.1:0", (), "file:///nowhere", "key",
                           "hmac-sha256", env={"PROBE_EXIT": exit_code})

    try:
        _wait_for("the fork server did not start", lambda: server.alive)
        first = launcher.launch(spec(1, "0"))
        assert first.log_path is not None
        _output(first.log_path)
        with lock:  # held across the exit of the first and the fork of the second
            time.sleep(0.5)  # the first has exited: its callback waits for the lock
            started = time.monotonic()
            launcher.launch(spec(2, "0"))
            took = time.monotonic() - started
        assert took < 3, f"the fork waited {took:.1f} s for an exit callback"
        _wait_for("the exits were not reported", lambda: len(exits) == 2)
    finally:
        launcher.close()


def test_a_launch_while_the_fork_server_imports_a_learned_package_does_not_wait_for_it(
        tmp_path: Path, probe_module: str) -> None:
    """The server imports learned packages on its one thread (torch: seconds). A launch then
    (a woken notebook's replica) holds the host's service lock, which its heartbeats need: it
    starts a new interpreter instead of waiting (found by benchmarks/hibernate.py: two hosts
    missed their heartbeats behind a torch import and were dropped)."""
    import threading

    launcher = ProcessLauncher(tmp_path / "work", lambda r, code: None, module=probe_module,
                               fork_server=True)
    server = launcher.fork_server
    assert server is not None
    spec = ReplicaSpec("k1", 1, "127.0.0.1:0", (), "file:///nowhere", "key", "hmac-sha256",
                       env={"PROBE_EXIT": "0"})
    try:
        _wait_for("the fork server did not start", lambda: server.alive)
        importer = threading.Thread(target=server.import_modules, args=(["torch"],))
        importer.start()
        _wait_for("the import was not ordered", lambda: server.importing, timeout=10)
        started = time.monotonic()
        replica = launcher.launch(spec)
        took = time.monotonic() - started
        still_importing = server.importing
        importer.join(120)
        assert took < 1.0, f"the launch waited {took:.1f} s behind the import"
        if still_importing:  # (torch imported in under the launch's time: nothing to tell)
            assert not replica.forked
        assert replica.log_path is not None and _output(replica.log_path)
    finally:
        launcher.close()
