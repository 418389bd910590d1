"""One dispatcher step on the loop per event, instead of every waiter looking for itself.

Waiters that queue for the same thing (a per-cell container's cells waiting for a host,
cell_containers.py) used to wake all at once on each ``LoopSignal`` fire and each look at the
whole queue: one release with N cells waiting cost the loop O(N) looks of O(N) each. A
``LoopDispatcher`` is the one coroutine that wakes instead: on each fire it runs ``step`` once
(a walk over the queue, in order, that resolves the futures of just the waiters that may go
now: the Kubernetes scheduling-queue shape), then sleeps until the next fire or until the
timeout ``step`` returned (the earliest waiter's deadline). The waiters await their own future
and do not wake otherwise.

It keeps ``loop_waits``'s rule: it takes the signal's ``future()`` before ``step`` reads the
state, so a change made after the read wakes it again. It runs while something waits (``step``
returns None when nothing does) and is started again by ``kick`` when a waiter joins, on
whichever loop the waiter runs (one loop at a time: the fronts' loop; a test's own). A waiter
that looked for itself before it joined (a replicated kernel's cell waiting for its turn or for
a release, execution.py) calls ``ensure`` instead: no extra step when the dispatcher runs. A
step that returns ``math.inf`` sleeps until the next fire (nothing waits on a clock).

Users: the per-cell containers' cell queue (cell_containers.py, on ``_cell_cv``) and the
replicated kernels' cells waiting for their turn or for GPUs (execution.py, on
``_placement_cv``).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable

from notebookos.global_scheduler.loop_waits import LoopSignal
from notebookos.global_scheduler.state_lock import StateLock

log = logging.getLogger(__name__)


class LoopDispatcher:
    """Runs ``step`` on the loop once per fire of ``signal`` (fires while a step runs are
    folded into one more step). ``step`` returns how long to sleep at most before the next
    one (``math.inf``: until the next fire), or None when nothing waits any more (the
    dispatcher ends until the next ``kick``). With ``lock``, each step runs holding it, taken
    without blocking the loop (a thread holding it delays the step, not the loop)."""

    def __init__(self, signal: LoopSignal, step: Callable[[], float | None],
                 name: str = "dispatcher", lock: StateLock | None = None) -> None:
        self.signal = signal
        self._step = step
        self._name = name
        self._lock = lock  # a step runs holding it, awaited (acquire_async), when given
        self._task: asyncio.Task[None] | None = None
        self.steps = 0  # how many steps ran (tests count them)

    def kick(self) -> None:
        """A waiter joined (on the loop's thread): a step runs soon, on the running loop."""
        loop = asyncio.get_running_loop()
        task = self._task
        if task is not None and not task.done() and task.get_loop() is loop:
            self.signal.fire()  # it sleeps on the signal, or its first step is still to run
            return
        self._task = loop.create_task(self._run(), name=self._name)

    def ensure(self) -> None:
        """A waiter that has looked at the state itself joined (on the loop's thread): the
        dispatcher runs on the running loop, to serve it at the next fire; started (one step)
        when it does not, left alone when it does."""
        loop = asyncio.get_running_loop()
        task = self._task
        if task is None or task.done() or task.get_loop() is not loop:
            self._task = loop.create_task(self._run(), name=self._name)

    async def _run(self) -> None:
        while True:
            woken = self.signal.future()  # before the step reads the state
            self.steps += 1
            if self._lock is not None:  # taken without stopping the loop
                await self._lock.acquire_async()
            try:
                sleep_s = self._step()
            except Exception:  # noqa: BLE001 - the step fails its waiters itself; go on
                log.exception("%s: a step failed", self._name)
                sleep_s = 1.0
            finally:
                if self._lock is not None:
                    self._lock.release()
            if sleep_s is None:
                return
            await self.signal.wait(woken, None if math.isinf(sleep_s) else sleep_s)


__all__ = ["LoopDispatcher"]
