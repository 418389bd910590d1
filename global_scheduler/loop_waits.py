"""Waiting on the Global Scheduler's conditions from its loop, without a thread per waiter.

A cell waiting for GPUs, for its kernel's replicas, or for a host (a per-cell container's cell,
cell_containers.py) used to hold a thread of the placement pool for the whole wait, blocked on a
condition variable (issue 32: threads that grow with the cells waiting, which on an
oversubscribed cluster is most of them). The wait is now a coroutine on the fronts' loop: it
looks at the state, then awaits a ``LoopSignal`` that the condition fires on every
``notify_all`` (``SignallingCondition``), whichever thread notifies. Only the steps that block
(a placement try's ``CommitGpus`` calls and migrations, a per-cell container's start and commit)
go to a thread of the placement pool (``run_blocking``), and only while they run.

The rule that makes a wake-up impossible to miss: a waiter takes the signal's ``future()``
*before* it reads the state, and awaits it after. A change made after the read notifies the
condition, which resolves that future; a change made before it is seen by the read.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from notebookos.global_scheduler.placement_worker import PlacementPool

T = TypeVar("T")


class LoopSignal:
    """A broadcast to coroutines on one asyncio loop, fired from any thread."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._future: asyncio.Future[None] | None = None
        self.waits = 0  # how often a waiter went to sleep on it (tests count wake-ups)

    def future(self) -> asyncio.Future[None]:
        """The future the next ``fire`` resolves; on the loop's thread."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._future = loop, None
        if self._future is None or self._future.done():
            self._future = loop.create_future()
        return self._future

    async def wait(self, future: asyncio.Future[None], timeout: float | None) -> None:
        """Sleep until ``future`` (from ``future()``) is fired or ``timeout`` passes."""
        self.waits += 1
        if future.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            pass

    def fire(self) -> None:
        """Wake every waiter (thread-safe; nothing to do when none waits)."""
        loop, future = self._loop, self._future
        if loop is None or future is None or future.done() or loop.is_closed():
            return
        if asyncio._get_running_loop() is loop:  # noqa: SLF001 - on the loop: no self-pipe
            loop.call_soon(self._resolve, future)
            return
        try:
            loop.call_soon_threadsafe(self._resolve, future)
        except RuntimeError:  # the loop closed meanwhile
            pass

    @staticmethod
    def _resolve(future: asyncio.Future[None]) -> None:
        if not future.done():
            future.set_result(None)


class SignallingCondition(threading.Condition):
    """A condition whose ``notify_all`` also fires ``signal`` (the loop's waiters)."""

    def __init__(self, lock: Any = None, signal: LoopSignal | None = None) -> None:
        super().__init__(lock)
        self.signal = signal or LoopSignal()

    def notify_all(self) -> None:
        super().notify_all()
        self.signal.fire()


class SignallingEvent(threading.Event):
    """A ``threading.Event`` that coroutines on the loop can await too (``wait_async``): its
    ``set`` fires ``signal``, whichever thread sets it."""

    def __init__(self) -> None:
        super().__init__()
        self.signal = LoopSignal()

    def set(self) -> None:
        super().set()
        self.signal.fire()

    async def wait_async(self, timeout: float | None = None) -> bool:
        """On the loop: until it is set or ``timeout`` passes; whether it is set."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            woken = self.signal.future()  # before the look: a set after it wakes us
            if self.is_set():
                return True
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return False
            await self.signal.wait(woken, left)


async def run_blocking(fn: Callable[[], T], pool: PlacementPool | None = None) -> T:
    """Run ``fn`` on a thread of the placement pool and await its result."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, failed: bool) -> None:
        if done.done():
            return
        if failed:
            done.set_exception(result)
        else:
            done.set_result(result)

    def job() -> None:
        try:
            result, failed = fn(), False
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            result, failed = exc, True
        try:
            loop.call_soon_threadsafe(settle, result, failed)
        except RuntimeError:  # the loop closed meanwhile
            pass

    (pool or PlacementPool.shared()).submit(job)
    return await done
