"""Learning that a starting replica is ready: one loop watches every start.

A replica is ready once its shell socket accepts connections. The Local Scheduler used to start a
thread per replica start that tried to connect every 50 ms until it did (issue 32: threads that
grow with the starts in progress). Here each start is a task on one asyncio loop
(``LoopThread``): a non-blocking connect, and on refusal a timer before the next (10 ms at
first, backing off to 100 ms, since a replica takes hundreds of milliseconds to bind). The
process's exit ends its watch at the next try; the deadline ends it at the latest.

The loop is the launcher's, which also learns of the replicas' exits (exit_watch.py; the
service passes ``Launcher.events_loop``): one thread owns every replica event. A launcher with
no such loop (Docker's) leaves the watcher a loop of its own.

``on_done(ready)`` runs on the loop's thread and must be short: the service's updates its entry
and queues an event.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable

from notebookos.loop_thread import LoopThread

log = logging.getLogger(__name__)

FIRST_RETRY_S = 0.01
MAX_RETRY_S = 0.1
CONNECT_TIMEOUT_S = 0.5


class ReadyWatcher:
    def __init__(self, name: str = "replica-ready", loop: LoopThread | None = None) -> None:
        """Watch on ``loop`` (another's: not closed here), or on a loop of its own, started
        on the first watch."""
        self._name = name
        self._shared = loop
        self._loop: LoopThread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._watching = 0  # starts handed to the loop and not ended
        self._tasks: set[concurrent.futures.Future[None]] = set()  # on a loop not ours

    def watch(self, ip: str, port: int, exited: Callable[[], bool], timeout_s: float,
              on_done: Callable[[bool], None]) -> None:
        """Call ``on_done(True)`` once ``ip:port`` accepts a connection, or ``on_done(False)``
        once ``exited()`` says the process is gone or ``timeout_s`` has passed."""
        with self._lock:
            if self._closed:
                return
            if self._shared is not None and self._shared.alive():
                loop = self._shared
            else:  # no loop to share (or it ended): one of its own
                if self._loop is None or not self._loop.alive():
                    self._loop = LoopThread(self._name)
                loop = self._loop
            self._watching += 1
            task = loop.spawn(self._watch(ip, port, exited, timeout_s, on_done))
            if loop is self._shared:
                self._tasks.add(task)
        if loop is self._shared:  # (a done callback may run at once, on this thread)
            task.add_done_callback(self._task_ended)

    def _task_ended(self, task: concurrent.futures.Future[None]) -> None:
        with self._lock:
            self._tasks.discard(task)

    @property
    def watching(self) -> int:
        """Starts being watched now."""
        with self._lock:
            return self._watching

    async def _watch(self, ip: str, port: int, exited: Callable[[], bool], timeout_s: float,
                     on_done: Callable[[bool], None]) -> None:
        try:
            ready = await self._connect(ip, port, exited, timeout_s)
        finally:
            with self._lock:
                self._watching -= 1
                closed = self._closed
        if closed:
            return
        try:
            on_done(ready)
        except Exception:  # noqa: BLE001 - one start's report must not end the others' watch
            log.exception("a replica start's readiness report failed (%s:%d)", ip, port)

    @staticmethod
    async def _connect(ip: str, port: int, exited: Callable[[], bool], timeout_s: float) -> bool:
        """Whether ``ip:port`` accepted a connection before ``exited()`` or the deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        retry = FIRST_RETRY_S
        while not exited():
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port),
                                                   min(CONNECT_TIMEOUT_S, left))
            except (OSError, TimeoutError):
                await asyncio.sleep(min(retry, max(0.0, deadline - loop.time())))
                retry = min(retry * 2, MAX_RETRY_S)
                continue
            writer.close()
            return True
        return False

    def close(self) -> None:
        """Stop watching (the daemon stops); no ``on_done`` is called afterwards."""
        with self._lock:
            self._closed = True
            loop, self._loop = self._loop, None
            tasks, self._tasks = list(self._tasks), set()
        for task in tasks:  # on the shared loop, which goes on: its watches end
            task.cancel()
        if loop is not None:
            loop.close()
