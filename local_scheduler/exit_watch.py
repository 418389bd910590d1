"""One thread that learns of every replica's exit: pidfds in one selector.

The launcher used to start a thread per replica to block in ``wait()`` (issue 32: threads that
grow with replicas). A pidfd (``os.pidfd_open``) is readable once its process has exited,
whoever its parent is, so one thread waits on all of them: a child of ours (``Popen``: reaped
by its ``wait()``, instant then) and a replica a previous run started (``WatchedProcess``). A
replica the fork server forked is not watched here: the server reports its exit, and its
``ForkedProcess`` calls back (``add_exit_callback``), which hands the work to this thread
(``call``): the server's reader must never wait for the Local Scheduler's lock, since a thread
holding that lock may be waiting for the reader's answer to a fork order. The callbacks run on
the watcher's thread and must be short (the launcher's drops a record and queues an event).
"""

from __future__ import annotations

import logging
import os
import selectors
import subprocess
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class ExitWatcher:
    def __init__(self, name: str = "replica-exits") -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._added: list[tuple[int, Any, Callable[[int], None]]] = []
        self._calls: list[Callable[[], None]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._thread.start()

    def watch(self, process: Any, on_exit: Callable[[int], None]) -> None:
        """Call ``on_exit(returncode)`` once ``process`` (a ``Popen``, a ``WatchedProcess``, or
        anything with ``pid`` and ``wait``) has exited."""
        try:
            pidfd = os.pidfd_open(process.pid)
        except ProcessLookupError:  # gone already (a child stays a zombie: wait reaps it)
            self._finish(process, on_exit)
            return
        with self._lock:
            if self._closed:
                os.close(pidfd)
                return
            self._added.append((pidfd, process, on_exit))
        os.write(self._wake_w, b"\0")

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the watcher's thread, after the exits reported before it."""
        with self._lock:
            if self._closed:
                return
            self._calls.append(fn)
        os.write(self._wake_w, b"\0")

    def _run(self) -> None:
        while True:
            for key, _ in self._selector.select():
                if key.data is None:
                    self._take_added()
                    continue
                self._selector.unregister(key.fd)
                os.close(key.fd)
                process, on_exit = key.data
                self._finish(process, on_exit)
            if self._closed:
                return

    def _take_added(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            added, self._added = self._added, []
            calls, self._calls = self._calls, []
        for pidfd, process, on_exit in added:
            self._selector.register(pidfd, selectors.EVENT_READ, (process, on_exit))
        for fn in calls:
            try:
                fn()
            except Exception:  # noqa: BLE001 - one failing callback must not stop the watcher
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
        except Exception:  # noqa: BLE001 - one failing callback must not stop the watcher
            log.exception("exit callback failed for pid %d", process.pid)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        os.write(self._wake_w, b"\0")
        self._thread.join(timeout=5)
        for key in list(self._selector.get_map().values()):
            if key.data is not None:
                os.close(key.fd)
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
