"""The one thread that serves every kernel front's sockets: an asyncio loop over epoll.

Before, each front ran a thread of its own that woke every 50 ms to poll its 17 sockets: two
threads (with its placement thread) and about 1.8 ms/s of CPU per idle notebook in the Global
Scheduler (issue 32). Here one loop serves them all, as Jupyter Server serves its kernels from
one tornado loop:

- each ZMQ socket's ``FD`` is watched with ``loop.add_reader`` (epoll): an idle front costs no
  wake-up at all, and a busy one costs only its own events, whatever the number of fronts;
- a front's timed duties (yield requests held back, IOPub waiting for a client to resubscribe,
  replies kept for an absent peer) are timers (``call_at``), set only while there are some;
- other threads hand a front work with ``call`` (``call_soon_threadsafe``): in order, on the
  loop, with the messages it routes.

A ZMQ socket's ``FD`` is edge-triggered: it signals that the socket's state *changed*, and any
operation on the socket (a send too) may consume that signal with a message still queued. So
whoever is called for an event reads ``EVENTS`` and drains, and a front, after handling
anything, checks every one of its sockets again before returning to the loop (``FrontLoop``
only runs callbacks; ``KernelFront._service`` does the draining). This is pyzmq's own rule for
``ZMQStream`` and ``zmq.asyncio``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class FrontLoop:
    """An asyncio loop on a daemon thread of its own; ``shared()`` is the process's one."""

    _shared: FrontLoop | None = None
    _shared_lock = threading.Lock()

    def __init__(self, name: str = "kernel-fronts") -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._thread.start()
        self._ready.wait()

    @classmethod
    def shared(cls) -> FrontLoop:
        """The process's front loop, started on first use (as ``zmq.Context.instance()``)."""
        with cls._shared_lock:
            if cls._shared is None or not cls._shared.alive():
                cls._shared = cls()
            return cls._shared

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.set_exception_handler(_log_exception)
        self.loop.run_forever()

    def alive(self) -> bool:
        return self._thread.is_alive() and not self.loop.is_closed()

    def on_loop(self) -> bool:
        """Whether the caller runs on the loop's thread."""
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the loop, after what was handed to it before (thread-safe)."""
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

    def threads(self) -> int:
        return 1


def _log_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    log.error("kernel front loop: %s", context.get("message"),
              exc_info=context.get("exception"))
