"""The thread a kernel's front places its cells on, one at a time.

Placing a cell can wait (for GPUs, a ``CommitGpus`` call, a migration), so it never runs on the
front's loop. One thread per front, started with its first cell and kept until the front closes:
a new thread per cell cost the loop a thread start on every cell (``Thread.start`` waits until
the new thread runs, a scheduling round trip on a busy host) and the process a thread's setup.
Not a ``ThreadPoolExecutor(1)``: its workers are joined at interpreter exit, and a placement
waiting for GPUs would hold the Global Scheduler's exit; this thread is a daemon, and a job that
raises is logged here rather than kept in a future nobody reads.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class PlacementWorker:
    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the worker thread after the jobs submitted before it."""
        with self._lock:
            if self._closed:  # its front closed: the kernel is gone, nobody waits for this
                log.debug("%s: closed, a placement dropped", self._name)
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name=self._name)
                self._thread.start()
            self._jobs.put(job)

    def close(self) -> None:
        """Let the thread end after the job it runs (a placement ends once its kernel stops)."""
        with self._lock:
            self._closed = True
            if self._thread is not None:
                self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except Exception:  # noqa: BLE001 - the worker outlives one bad job
                log.exception("%s: a placement job failed", self._name)
