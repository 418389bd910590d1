"""Watching a process that is not this one's child: a replica a previous run of this Local
Scheduler started, or one whose fork server died.

Linux's pidfd (``os.pidfd_open``) is readable once the process has exited, whoever its parent is:
a thread blocks on it (no polling). The exit code of a process that is not our child cannot be
read: such an exit is reported as ``UNKNOWN_EXIT_CODE``. A pid is taken for the same process only
when its start time (``/proc/<pid>/stat``, field 22, in clock ticks since boot) is the one
recorded when it started: a pid reused by another process is never adopted.
"""

from __future__ import annotations

import os
import select
import subprocess
import threading

UNKNOWN_EXIT_CODE = -255  # an adopted replica exited; its code went to its real parent


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces: split after it
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return int(fields[19])  # field 22 overall
    except (IndexError, ValueError):
        return None


def same_process(pid: int, ticks: int | None) -> bool:
    """``pid`` is alive and is the process that started at ``ticks`` (not a reused pid)."""
    current = start_ticks(pid)
    return current is not None and (ticks is None or current == ticks)


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``, or None when it is gone (or pidfds are not available)."""
    try:
        return os.pidfd_open(pid)
    except (ProcessLookupError, OSError, AttributeError):
        return None


class WatchedProcess:
    """A process that is not our child, as the launcher sees a ``subprocess.Popen``."""

    def __init__(self, pid: int, pidfd: int | None = None) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._fd = pidfd if pidfd is not None else open_pidfd(pid)
        self._done = threading.Event()
        if self._fd is None:
            self._finish()

    def poll(self) -> int | None:
        if self.returncode is None and self._fd is not None and _readable(self._fd, 0):
            self._finish()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and self._fd is not None:
            if not _readable(self._fd, timeout):
                raise subprocess.TimeoutExpired(f"replica pid {self.pid}", timeout or 0.0)
            self._finish()
        self._done.wait()
        assert self.returncode is not None
        return self.returncode

    def _finish(self) -> None:
        # the pidfd stays open until this object goes (another thread may be waiting on it)
        if self.returncode is None:
            self.returncode = UNKNOWN_EXIT_CODE
            self._done.set()

    def __del__(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass


def _readable(fd: int, timeout: float | None) -> bool:
    ready, _, _ = select.select([fd], [], [], timeout)
    return bool(ready)
