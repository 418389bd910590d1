"""An asyncio loop on a daemon thread of its own, for a daemon whose other parts are threads.

The Global Scheduler's kernel fronts (global_scheduler/front_loop.py) and the Local Scheduler's
start watches (local_scheduler/ready_watch.py) each run on one: whatever their number, they
cost one thread, and their waits are epoll and timers (``call_at``), never a thread that wakes
to poll. Other threads hand the loop work with ``call`` (in order) or ``run`` (and wait for its
result).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


class LoopThread:
    def __init__(self, name: str) -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.set_exception_handler(self._log_exception)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    @property
    def thread(self) -> threading.Thread:
        """The loop's thread."""
        return self._thread

    def alive(self) -> bool:
        return self._thread.is_alive() and not self.loop.is_closed()

    def on_loop(self) -> bool:
        """Whether the caller runs on the loop's thread."""
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the loop, after what was handed to it before (thread-safe). On the
        loop's own thread this is ``call_soon``: the same queue, in the same order, without
        ``call_soon_threadsafe``'s write to the loop's self-pipe and the wake-up that reads it
        back (a front hands itself work several times per cell, issue 36)."""
        if self.on_loop():
            self.loop.call_soon(fn)
        else:
            self.loop.call_soon_threadsafe(fn)

    def run(self, fn: Callable[[], Any], timeout: float = 5.0) -> Any:
        """Run ``fn`` on the loop and wait for its result (at once when called on the loop).
        Raises ``TimeoutError`` when the loop does not get to it within ``timeout``."""
        if self.on_loop():
            return fn()
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def call() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                done.set_exception(exc)

        self.loop.call_soon_threadsafe(call)
        return done.result(timeout=timeout)

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        """Run ``coroutine`` as a task on the loop (thread-safe); its future for other threads."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def task(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coroutine`` as a task on the loop, called on the loop's thread (``spawn``
        without the hop through ``call_soon_threadsafe`` and a thread-safe future). The task
        is referenced until it ends (the loop keeps only a weak reference)."""
        task = self.loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def close(self, timeout: float = 5.0) -> None:
        """Cancel what still runs on the loop and end its thread."""
        if not self.alive():
            return

        def stop() -> None:
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.call_soon(self.loop.stop)  # after the cancelled tasks' last step

        self.loop.call_soon_threadsafe(stop)
        if not self.on_loop():
            self._thread.join(timeout)

    def threads(self) -> int:
        return 1

    def _log_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        log.error("%s loop: %s", self.name, context.get("message"),
                  exc_info=context.get("exception"))
