"""The threads kernel fronts place their cells on: one pool for every front of the process.

Placing a cell can wait (for GPUs, a ``CommitGpus`` call, a migration), so it never runs on the
fronts' loop (front_loop.py). Each front places one cell at a time, in order (``_placing``), so
the pool only needs a thread per placement *in progress*: threads grow with the cells being
placed at once, not with open notebooks (issue 32: a thread kept per front made two threads per
idle notebook). A worker left idle for ``IDLE_S`` ends; one that is idle takes the next job, so
a notebook running cell after cell reuses a thread (a new thread per cell cost the loop a
thread start on every cell).
Not a ``ThreadPoolExecutor``: its workers are joined at interpreter exit, and a placement
waiting for GPUs would hold the Global Scheduler's exit; these are daemons, and a job that
raises is logged here rather than kept in a future nobody reads.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

IDLE_S = 30.0  # an idle worker ends after this long


class PlacementPool:
    _shared: PlacementPool | None = None
    _shared_lock = threading.Lock()

    def __init__(self, name: str = "place", idle_s: float = IDLE_S) -> None:
        self._name = name
        self._idle_s = idle_s
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # workers waiting for a job
        self._workers = 0
        self._started = 0

    @classmethod
    def shared(cls) -> PlacementPool:
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    @property
    def workers(self) -> int:
        """Workers alive now."""
        return self._workers

    @property
    def started(self) -> int:
        """Workers ever started."""
        return self._started

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on a worker: an idle one, else a new one."""
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
            else:
                self._workers += 1
                self._started += 1
                threading.Thread(target=self._run, daemon=True,
                                 name=f"{self._name}-{self._started}").start()
            self._jobs.put(job)

    def _run(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():  # nobody counted on this worker: it ends
                        self._idle -= 1
                        self._workers -= 1
                        return
                continue  # a job came as the wait ended: it is this worker's
            try:
                job()
            except Exception:  # noqa: BLE001 - the worker outlives one bad job
                log.exception("%s: a placement job failed", self._name)
            with self._lock:
                self._idle += 1
