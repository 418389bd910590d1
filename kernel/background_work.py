"""What a notebook left running after its cells: work that hibernation would end without a word.

Hibernation stops a kernel's replicas once no cell has come for ``hibernate_after_s``. A cell can
leave work running when it ends: a training loop in a thread of its own
(``threading.Thread(target=train).start()``), a subprocess (``subprocess.Popen([...])``, ``!cmd
&``). The notebook then looks idle, and stopping its replicas would kill that work, which no
checkpoint holds. So the executor keeps what its cells left running and reports it in its
``replica_status_reply`` (``background_work``); the Global Scheduler keeps such a kernel awake
and says why (global_scheduler/hibernation.py).

What counts:

- a thread a cell started that is still alive once the cell ended, and is not a daemon thread
  (libraries' helper threads are daemons: tqdm's monitor, torch's pin-memory thread; Python
  waits for a non-daemon thread at exit, which is what "work that must finish" means there);
- a child process of the replica that is not a zombie, except multiprocessing's own helpers
  (its resource tracker and fork server outlive the work that started them).

The cost on the cell path: one ``threading.enumerate()`` before and after each cell the replica
executes (microseconds for the handful of threads a replica has).
"""

from __future__ import annotations

import os
import threading

# multiprocessing's helper processes: they live as long as the kernel, whatever runs
HELPER_PROCESSES = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


class BackgroundWork:
    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []

    @staticmethod
    def cell_starting() -> frozenset[int | None]:
        """The threads alive as a cell starts (hand the result to ``cell_ended``)."""
        return frozenset(t.ident for t in threading.enumerate())

    def cell_ended(self, before: frozenset[int | None]) -> None:
        """Keep the non-daemon threads the cell started that are still alive."""
        for thread in threading.enumerate():
            if thread.ident not in before and not thread.daemon and thread.is_alive():
                self._threads.append(thread)

    def running(self) -> list[str]:
        """What still runs, one phrase each (empty when nothing does)."""
        self._threads = [t for t in self._threads if t.is_alive()]
        work = [f"thread {t.name!r}" for t in self._threads]
        work += [f"process {pid} ({name})" for pid, name in child_processes()]
        return work


def child_processes(pid: int | None = None) -> list[tuple[int, str]]:
    """(pid, command name) of the live children of ``pid`` (this process), multiprocessing's
    helpers left out; empty where /proc does not list children."""
    pid = os.getpid() if pid is None else pid
    children: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children.update(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    found = []
    for child in sorted(children):
        try:
            with open(f"/proc/{child}/stat") as f:
                stat = f.read()
            with open(f"/proc/{child}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        name, state = stat[stat.find("(") + 1:stat.rfind(")")], stat[stat.rfind(")") + 2:][:1]
        if state in ("Z", "X") or any(helper in cmdline for helper in HELPER_PROCESSES):
            continue
        found.append((child, name))
    return found


__all__ = ["HELPER_PROCESSES", "BackgroundWork", "child_processes"]
