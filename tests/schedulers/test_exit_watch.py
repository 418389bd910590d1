"""The Local Scheduler learns of every replica's exit on one thread (local_scheduler/exit_watch.py,
issue 32): real processes, their real exit codes, no thread per process."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from notebookos.local_scheduler.exit_watch import ExitWatcher
from notebookos.local_scheduler.pid_watch import UNKNOWN_EXIT_CODE, WatchedProcess

pytestmark = pytest.mark.timeout(60)


def test_one_thread_reports_each_process_exit_with_its_code() -> None:
    watcher = ExitWatcher()
    exits: dict[int, int] = {}
    done = threading.Event()
    count = 20
    try:
        threads_before = threading.active_count()
        procs = [subprocess.Popen([sys.executable, "-c",
                                   f"import time, sys; time.sleep({0.2 + i * 0.02}); "
                                   f"sys.exit({i})"]) for i in range(count)]

        def exited(index: int) -> object:
            def record(code: int) -> None:
                exits[index] = code
                if len(exits) == count:
                    done.set()
            return record

        for i, proc in enumerate(procs):
            watcher.watch(proc, exited(i))
        assert threading.active_count() == threads_before, "a thread per process"
        assert done.wait(30), f"only {len(exits)} of {count} exits reported"
        assert exits == {i: i for i in range(count)}
        assert all(p.returncode == i for i, p in enumerate(procs))  # reaped
    finally:
        watcher.close()


def test_a_process_that_is_not_our_child_and_one_already_gone() -> None:
    watcher = ExitWatcher()
    got: list[int] = []
    try:
        # a grandchild: its parent exits at once, so it is not ours to wait for
        launcher = subprocess.run(
            [sys.executable, "-c", "import subprocess, sys; p = subprocess.Popen([sys.executable,"
             " '-c', 'import time; time.sleep(0.5)']); print(p.pid)"],
            capture_output=True, text=True, check=True)
        adopted = WatchedProcess(int(launcher.stdout))
        watcher.watch(adopted, got.append)
        gone = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
        gone.wait()
        watcher.watch(gone, got.append)  # reported at once
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(got) == sorted([3, UNKNOWN_EXIT_CODE]), got
    finally:
        watcher.close()


def test_a_recorded_replica_that_is_a_zombie_is_not_taken_back(tmp_path) -> None:  # noqa: ANN001
    """A replica that died while no Local Scheduler ran may still be a zombie (nobody reaped it
    yet) when the next one starts: same pid, same start time. It is gone, not taken back; the
    chaos campaign found one taken back, its exit reported before its entry existed and dropped,
    and the Global Scheduler counting it live for good (issue 33)."""
    from notebookos.local_scheduler import replica_records
    from notebookos.local_scheduler.launcher import LaunchedReplica, ProcessLauncher, ReplicaSpec
    from notebookos.local_scheduler.pid_watch import pid_alive, start_ticks

    child = subprocess.Popen([sys.executable, "-c", "pass"])  # a zombie until waited for
    ticks = start_ticks(child.pid)
    deadline = time.monotonic() + 10
    while pid_alive(child.pid):
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.01)
    try:
        spec = ReplicaSpec("k", 1, "127.0.0.1:1", (), "", "key", "hmac-sha256")
        replica = LaunchedReplica(spec, child.pid, "127.0.0.1", {"shell": 1}, "127.0.0.1:1",
                                  False, None, child)
        records = replica_records.ReplicaRecords(tmp_path)
        records.put(spec.owner, replica_records.record_of(replica, None, ticks))
        records.save()
        exits: list[int] = []
        launcher = ProcessLauncher(tmp_path, lambda _r, code: exits.append(code))
        try:
            assert launcher.recover() == []
        finally:
            launcher.close()
    finally:
        child.wait()
