"""Start child processes that die with the Local Scheduler, until they become replicas.

Replicas run in their own process group (a stop reaches everything they spawn), so a killed Local
Scheduler would leave them orphaned, still voting in their Raft groups while the Global Scheduler
replaces them. So every child runs through ``notebookos.local_scheduler.child`` (or
``prewarm_main``), which first asks Linux for SIGKILL when its parent goes away
(``PR_SET_PDEATHSIG``). That signal fires when the *thread* that forked exits, so every child is
forked from one long-lived spawner thread. No Python code runs between fork and exec (gRPC's
threads make that unsafe). A process that becomes a replica (``become_replica``) clears that
signal: replicas outlive a crashed Local Scheduler, and its successor takes them back.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from concurrent.futures import Future
from typing import Any

PR_SET_PDEATHSIG = 1
PARENT_ENV = "NOTEBOOKOS_LS_PID"


def signal_group(pid: int, sig: int) -> None:
    """Signal the process group ``pid`` leads; the process alone if it has not made its group
    yet (a replica forked a moment ago, before its ``setsid``: it has started nothing). A
    process already gone, or no longer ours, is left alone."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    except PermissionError:
        pass


def die_with_parent() -> None:
    """In a child: get SIGKILL when the Local Scheduler dies; exit now if it already has."""
    parent = os.environ.pop(PARENT_ENV, "")
    if not sys.platform.startswith("linux") or not parent:
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):
        os._exit(0)


def become_replica() -> None:
    """In a process about to run a replica: outlive the Local Scheduler (and the fork server)
    that started it, watched instead by ``orphan_watch`` (a restarted Local Scheduler takes it
    back; issue 33). Prewarmed processes still waiting for their order keep dying with their
    parent: a restarted Local Scheduler fills its pool anew."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 0)
        except (OSError, AttributeError):
            pass
    from notebookos.local_scheduler import orphan_watch

    orphan_watch.start_from_environment()


class _Spawner:
    def __init__(self) -> None:
        self._orders: queue.Queue[tuple[list[str], dict[str, Any], Future]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="spawner")
                self._thread.start()
        done: Future = Future()
        self._orders.put((argv, kwargs, done))
        return done.result()

    def _run(self) -> None:
        while True:
            argv, kwargs, done = self._orders.get()
            try:
                env = dict(kwargs.pop("env", None) or os.environ)
                env[PARENT_ENV] = str(os.getpid())
                done.set_result(subprocess.Popen(argv, start_new_session=True, env=env,
                                                 **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                done.set_exception(exc)


_SPAWNER = _Spawner()


def popen(argv: list[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen`` in a new session; the child must call ``die_with_parent``."""
    return _SPAWNER.popen(argv, **kwargs)
