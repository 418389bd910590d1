"""The one thread that serves every kernel front's sockets: an asyncio loop over epoll
(``notebookos.loop_thread.LoopThread``).

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

import threading

from notebookos.loop_thread import LoopThread


class FrontLoop(LoopThread):
    """The fronts' loop; ``shared()`` is the process's one."""

    _shared: FrontLoop | None = None
    _shared_lock = threading.Lock()

    def __init__(self, name: str = "kernel-fronts") -> None:
        super().__init__(name)

    @classmethod
    def shared(cls) -> FrontLoop:
        """The process's front loop, started on first use (as ``zmq.Context.instance()``)."""
        with cls._shared_lock:
            if cls._shared is None or not cls._shared.alive():
                cls._shared = cls()
            return cls._shared
