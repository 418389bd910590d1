"""Learning of every replica's exit: pidfds watched by one asyncio loop.

The launcher used to start a thread per replica to block in ``wait()`` (issue 32: threads that
grow with replicas), then one thread with a selector over pidfds. A pidfd (``os.pidfd_open``)
is readable once its process has exited, whoever its parent is, so one loop watches all of them
with ``loop.add_reader``: a child of ours (``Popen``: reaped by its ``wait()``, instant then) and
a replica a previous run started (``WatchedProcess``). The loop is the one that also watches the
replicas' starts (``ready_watch.py``, which the service hands this loop: ``events_loop``), so
the Local Scheduler has one owner of replica events, starts, readiness and exits, and one thread
for them whatever the number of replicas.

A replica the fork server forked is not watched here: the server reports its exit, and its
``ForkedProcess`` calls back (``add_exit_callback``), which hands the work to this loop
(``call``, which never blocks): the server's reader must never wait for the Local Scheduler's
lock, since a thread holding that lock may be waiting for the reader's answer to a fork order.
``call(fn)`` runs ``fn`` after the exits reported before it (the loop runs what it is handed in
order). The callbacks run on the loop's thread and must be short (the launcher's drops a record
and queues an event).
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from collections.abc import Callable
from typing import Any

from notebookos.loop_thread import LoopThread

log = logging.getLogger(__name__)


class ExitWatcher:
    def __init__(self, name: str = "replica-exits", loop: LoopThread | None = None) -> None:
        """Watch on ``loop`` (another's: not closed here), or on a loop of its own."""
        self._owns_loop = loop is None
        self.loop = loop if loop is not None else LoopThread(name)
        self._lock = threading.Lock()  # _closed, and handing work to the loop after a check
        self._closed = False
        self._watched: dict[int, tuple[Any, Callable[[int], None]]] = {}  # the loop's only

    def watch(self, process: Any, on_exit: Callable[[int], None]) -> None:
        """Call ``on_exit(returncode)`` (on the loop) once ``process`` (a ``Popen``, a
        ``WatchedProcess``, or anything with ``pid`` and ``wait``) has exited."""
        try:
            pidfd: int | None = os.pidfd_open(process.pid)
        except ProcessLookupError:  # gone already (a child stays a zombie: wait reaps it)
            pidfd = None
        with self._lock:
            if not self._closed:
                self.loop.call(lambda: self._add(pidfd, process, on_exit))
                return
        if pidfd is not None:
            os.close(pidfd)

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop, after the exits reported before it (never blocks)."""
        with self._lock:
            if not self._closed:
                self.loop.call(lambda: self._run_callback(fn))

    @property
    def watching(self) -> int:
        """Processes whose exit is awaited now."""
        return len(self._watched)

    def _add(self, pidfd: int | None, process: Any, on_exit: Callable[[int], None]) -> None:
        if pidfd is None:
            self._finish(process, on_exit)
            return
        if self._closed:
            os.close(pidfd)
            return
        self._watched[pidfd] = (process, on_exit)
        self.loop.loop.add_reader(pidfd, self._exited, pidfd)

    def _exited(self, pidfd: int) -> None:
        self.loop.loop.remove_reader(pidfd)
        os.close(pidfd)
        process, on_exit = self._watched.pop(pidfd)
        self._finish(process, on_exit)

    @staticmethod
    def _run_callback(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - one failing callback must not stop the others
            log.exception("exit callback failed")

    @staticmethod
    def _finish(process: Any, on_exit: Callable[[int], None]) -> None:
        try:
            code = process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # readable yet not reaped: should not happen
            log.error("process %d: its pidfd said exited, wait did not", process.pid)
            polled = process.poll()
            code = polled if polled is not None else -255
        try:
            on_exit(code)
        except Exception:  # noqa: BLE001 - one failing callback must not stop the others
            log.exception("exit callback failed for pid %d", process.pid)

    def _forget_all(self) -> None:
        for pidfd in list(self._watched):
            self.loop.loop.remove_reader(pidfd)
            os.close(pidfd)
        self._watched.clear()

    def close(self) -> None:
        """Stop watching: no pidfd is watched afterwards, nothing more is handed to the loop.
        The loop ends if it is this watcher's own."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.loop.alive():
            try:
                self.loop.run(self._forget_all)
            except (TimeoutError, RuntimeError):  # the loop is stuck or closed meanwhile
                log.warning("%s: pidfds left to the process's exit", self.loop.name)
        if self._owns_loop:
            self.loop.close()
