"""Host liveness as a timer on the Global Scheduler's loop (issue 32).

A host is declared lost when its heartbeats stop for ``heartbeat_timeout_s``, when it answered
no keepalive ping for ``silent_host_timeout_s``, or when a probe finds its node gone
(``host_registry.check_hosts``). This used to be a thread that woke every 0.2-1 s to look. Now
one ``call_at`` timer on the loop is armed for the next moment a host *could* be declared lost
(``service.next_host_deadline()``: the earliest last heartbeat plus the timeout, a silent
host's deadline, a reprobe of an unreachable one), and re-armed after each check: an idle
scheduler with healthy hosts wakes only when such a deadline could pass (a heartbeat every 2 s
moves the earliest one on, so with a 10 s timeout it wakes about every 8 s), whatever the
number of hosts and kernels.

What can bring a deadline closer (a host registered, a host gone silent or unreachable, a probe
ended) calls ``poke`` (thread-safe): a check runs now and re-arms the timer. The check itself
(``check_hosts``: a host dropped closes its channel, the autoscaler hears of it, probes start)
runs in ``executor``, never on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from typing import Any

from notebookos.loop_thread import LoopThread

log = logging.getLogger(__name__)

MIN_S = 0.05  # the least time between two checks (a deadline already passed)
SLACK_S = 0.01  # a check runs this long after the deadline (``check_hosts`` compares strictly)


class HostMonitor:
    def __init__(self, service: Any, loop: LoopThread, executor: Executor) -> None:
        self.service = service
        self.loop = loop
        self.executor = executor
        self.checks = 0  # checks run (a test counts the wake-ups)
        self._timer: asyncio.TimerHandle | None = None
        self._running = False  # a check is in the executor
        self._again = False  # poked while it ran: check once more when it ends
        self._closed = False
        self._started = False

    def start(self) -> None:
        """Check now, and from then on at each deadline."""
        self._started = True
        self.loop.call(self._fire)

    def poke(self) -> None:
        """A deadline may have come closer: check now (thread-safe). Before ``start`` (the
        registry being restored, the server not listening yet) nothing: ``start`` checks."""
        if self._started and not self._closed:
            self.loop.call(self._fire)

    def close(self) -> None:
        self._closed = True
        if self.loop.alive():
            self.loop.call(self._cancel)

    # -- on the loop ----------------------------------------------------------------------------

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._cancel()
        if self._closed:
            return
        if self._running:
            self._again = True
            return
        self._running = True
        try:
            future = self.loop.loop.run_in_executor(self.executor, self._check)
        except RuntimeError:  # the executor is shut down: the scheduler stops
            self._running = False
            return
        future.add_done_callback(self._checked)

    def _checked(self, future: asyncio.Future) -> None:
        self._running = False
        if self._closed or future.cancelled():
            return
        if self._again:
            self._again = False
            self._fire()
            return
        deadline = future.result()  # _check catches what check_hosts raises
        if deadline is None:
            log.debug("host check: no host; the next registration wakes the monitor")
            return
        delay = max(MIN_S, deadline - time.time() + SLACK_S)
        log.debug("host check: next in %.2f s", delay)
        self._timer = self.loop.loop.call_at(self.loop.loop.time() + delay, self._fire)

    # -- in the executor ------------------------------------------------------------------------

    def _check(self) -> float | None:
        self.checks += 1
        try:
            self.service.check_hosts()
        except Exception:  # noqa: BLE001 - the monitor must keep running
            log.exception("host check failed")
        try:
            return self.service.next_host_deadline()
        except Exception:  # noqa: BLE001 - look again in a second
            log.exception("host check: cannot tell the next deadline")
            return time.time() + 1.0
