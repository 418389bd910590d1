"""``service.lock`` as the loop needs it while the state still has more than one owner (issue 32).

The Global Scheduler's state is still guarded by one RLock that pool threads (``gs-work``,
placement, ``gs-grpc``) hold, some for tens of milliseconds; a coroutine on the loop that took
it the plain way would stop the loop, every front and every call on it, for as long. A
``StateLock`` wraps that RLock (or lock_holds' timed one) and adds two things:

- ``version``: how many times the lock was let go by its outermost holder. Every change of the
  state it guards is made under it, so state read under the lock at version *v* is the state
  as of the *v*-th release; while another thread holds it and ``version`` is still *v*, that
  read is still the latest completed state (the holder's changes are in progress, not done).
  A read-only holder lets go with ``release_read`` (no new version).
- ``acquire_async``: taken on the loop without blocking it. Free, it is taken at once; held by
  another thread, the coroutine awaits the release (``released``, a ``LoopSignal`` fired by
  every outermost release) and tries again. A coroutine must never ``await`` while holding it
  (another coroutine on the loop would enter the RLock too).

``LoopChanges`` is for the fronts' hooks (a cell started, answered, released): a change made
at once when the lock is free, else queued in order for one task that awaits it.

What the lock costs per hold: two attribute updates and a ``LoopSignal.fire`` that returns at
once when no coroutine waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from notebookos.global_scheduler.loop_waits import LoopSignal

log = logging.getLogger("notebookos.global_scheduler")


class StateLock:
    """An RLock that counts its outermost releases and can be awaited on the loop."""

    def __init__(self, inner: Any = None) -> None:
        self._inner = inner if inner is not None else threading.RLock()
        self._depth = 0  # written only by the owner, while it holds the lock
        self.version = 0  # outermost releases so far (reads from any thread)
        self.released = LoopSignal()
        # called (by the releasing thread, the lock just let go) after a release that may have
        # changed the state; the status board's refresh (status.py)
        self.on_release: Callable[[], None] | None = None
        # the loop's blocking takes (``watch_loop``): which thread is the loop's, and who is
        # told how long the loop stood still because another thread held the lock
        self._loop_thread: threading.Thread | None = None
        self._loop_waited: Callable[[float], None] | None = None

    def watch_loop(self, loop_thread: threading.Thread,
                   waited: Callable[[float], None]) -> None:
        """Measure the loop's blocking takes: each time ``loop_thread`` takes the lock the
        blocking way (``with lock``, a hook not yet a coroutine) while another thread holds
        it, ``waited(seconds)`` is told how long the loop stood still (the metric
        ``notebookos_gs_loop_lock_wait_seconds``). What is left of issue 32's shared lock
        shows there: a coroutine's ``acquire_async`` never blocks the loop."""
        self._loop_thread, self._loop_waited = loop_thread, waited

    # -- the lock ---------------------------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if blocking and self._loop_thread is not None:
            got = self._take_on_loop(timeout)
        else:
            got = self._inner.acquire(blocking, timeout)
        if got:
            self._depth += 1
        return got

    def _take_on_loop(self, timeout: float = -1) -> bool:
        """A blocking take; timed when it is the loop's and the lock is held by another."""
        if self._inner.acquire(False):
            return True
        if threading.current_thread() is not self._loop_thread:
            return self._inner.acquire(True, timeout)
        started = time.perf_counter()
        got = self._inner.acquire(True, timeout)
        if self._loop_waited is not None:
            self._loop_waited(time.perf_counter() - started)
        return got

    def release(self) -> None:
        self._let_go(changed=True)

    def release_read(self) -> None:
        """Let go after a hold that changed nothing: no new version."""
        self._let_go(changed=False)

    def _let_go(self, changed: bool) -> None:
        self._depth -= 1
        if self._depth:
            self._inner.release()
            return
        if changed:
            self.version += 1
        self._inner.release()
        self.released.fire()
        if changed and self.on_release is not None:
            self.on_release()

    def __enter__(self) -> bool:
        if self._loop_thread is not None:
            self._take_on_loop()
        else:
            self._inner.acquire()
        self._depth += 1
        return True

    def __exit__(self, *exc: object) -> None:
        self._let_go(changed=True)

    async def acquire_async(self) -> None:
        """On the loop: take the lock without blocking the loop (see the module's doc)."""
        while True:
            future = self.released.future()  # before the try: a release after it wakes us
            if self.acquire(blocking=False):
                return
            await self.released.wait(future, None)

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """``async with lock.held():`` on the loop: ``acquire_async``, then the release; nothing
        may be awaited inside."""
        await self.acquire_async()
        try:
            yield
        finally:
            self.release()

    def held_by_another(self) -> bool:
        """Whether a thread other than the caller's holds it now (a hint: it may change)."""
        if self._inner.acquire(False):
            self._inner.release()
            return False
        return True

    # threading.Condition's protocol for an RLock (a wait gives the lock up entirely; the
    # state may have changed before it, so that is a new version)
    def _is_owned(self) -> bool:
        return self._inner._is_owned()  # type: ignore[attr-defined]  # noqa: SLF001

    def _release_save(self) -> Any:
        depth, self._depth = self._depth, 0
        self.version += 1
        inner = self._inner._release_save()  # type: ignore[attr-defined]  # noqa: SLF001
        self.released.fire()
        if self.on_release is not None:
            self.on_release()
        return depth, inner

    def _acquire_restore(self, state: Any) -> None:
        depth, inner = state
        self._inner._acquire_restore(inner)  # type: ignore[attr-defined]  # noqa: SLF001
        self._depth = depth


class LoopChanges:
    """Changes the loop makes under the lock for the fronts' hooks (a cell started, answered,
    released: execution.py), in the order they were asked for, without ever waiting for the
    lock on the loop. Free, the lock is taken and the change made at once (the common case:
    nothing else pending); held by another thread, the change is queued and one task on the
    loop makes the queue's changes, in order, once it has the lock (``acquire_async``). A
    change asked for while earlier ones wait is queued behind them, so a cell's release never
    overtakes its start. Off the loop (a test's thread, a stand-in) the change is made at once,
    taking the lock the blocking way. A queued change that raises is logged."""

    def __init__(self, lock: StateLock) -> None:
        self._lock = lock
        self._queue: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._maker: asyncio.Future | None = None  # the task making the queue's changes

    def make(self, change: Callable[..., Any], *args: Any) -> None:
        lock = self._lock
        if threading.current_thread() is not lock._loop_thread:  # noqa: SLF001
            with lock:
                change(*args)
            return
        if not self._queue and lock.acquire(blocking=False):
            try:
                change(*args)
            finally:
                lock.release()
            return
        self._queue.append((change, args))
        if self._maker is None:
            self._maker = asyncio.ensure_future(self._make_queued())

    def pending(self) -> int:
        """Changes waiting for the lock (tests)."""
        return len(self._queue)

    async def _make_queued(self) -> None:
        try:
            while self._queue:
                async with self._lock.held():
                    while self._queue:
                        change, args = self._queue.popleft()
                        try:
                            change(*args)
                        except Exception:
                            log.exception("a change for a front failed: %s%r",
                                          getattr(change, "__name__", change), args)
        finally:
            self._maker = None
