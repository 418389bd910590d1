"""What a notebook's cells left running (kernel/background_work.py): the threads a cell started
that are still alive and are not daemons, and the live child processes, multiprocessing's own
helpers left out; hibernation keeps such a kernel awake."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
import time

from notebookos.kernel.background_work import BackgroundWork, child_processes


def test_a_cells_live_non_daemon_thread_counts_until_it_ends() -> None:
    work = BackgroundWork()
    before = work.cell_starting()
    stop = threading.Event()
    kept = threading.Thread(target=stop.wait, name="train")
    helper = threading.Thread(target=stop.wait, name="monitor", daemon=True)
    done = threading.Thread(target=lambda: None, name="quick")
    for t in (kept, helper, done):
        t.start()
    done.join()
    work.cell_ended(before)
    assert work.running() == ["thread 'train'"]
    stop.set()
    kept.join()
    helper.join()
    assert work.running() == []


def test_a_threads_started_before_the_cell_are_not_the_cells() -> None:
    stop = threading.Event()
    earlier = threading.Thread(target=stop.wait, name="kernel-own")
    earlier.start()
    try:
        work = BackgroundWork()
        before = work.cell_starting()
        work.cell_ended(before)
        assert work.running() == []
    finally:
        stop.set()
        earlier.join()


def test_live_child_processes_count_but_zombies_and_multiprocessing_helpers_do_not() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        quick_pid = quick.pid
        time.sleep(0.5)  # quick exits: a zombie until waited for
        found = dict(child_processes())
        assert child.pid in found and quick_pid not in found
        from multiprocessing import resource_tracker
        resource_tracker.ensure_running()  # a helper that lives as long as its parent
        assert all("resource_tracker" not in name for name in found.values())
        tracker = resource_tracker._resource_tracker._pid  # noqa: SLF001
        assert tracker not in dict(child_processes())
    finally:
        child.kill()
        child.wait()
        quick.wait()
    assert child.pid not in dict(child_processes())
    assert multiprocessing.active_children() == []
