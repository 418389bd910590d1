"""A front's turn on the process's front loop (front_loop.py): the sockets it watches, the
commands other threads queue for it, and its timed duties.

Every socket's fd is in the loop's epoll set; a ZMQ fd signals edges, so a front woken by any
of its sockets reads ``EVENTS`` on all of them (one ``zmq_poll``) until none has a message, and
hands each message to ``_dispatch`` (the handler table, front.py). Commands from other threads
(``_run_on_loop``) run in order with the messages. Timed duties (yield requests held back,
IOPub held for a resubscribing client, replies kept for an absent peer, deferred requests) are
one ``call_at`` timer set only while there are some: an idle front costs no wake-up.

Mixed into ``KernelFront``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from notebookos.global_scheduler.front_loop import FrontLoop
from notebookos.global_scheduler.front_replicas import _ReplicaSockets
from notebookos.zmq_frames import NOBLOCK, recv_frames

log = logging.getLogger(__name__)

# How often a front retries what waits for a client (kept replies, IOPub held for a resubscribing
# client, requests deferred until IOPub is subscribed): only while there is such a thing.
RETRY_S = 0.05
# At most this many rounds over a front's sockets per turn on the loop: a front flooded with
# messages lets the other fronts in between.
MAX_ROUNDS = 64


class SocketPump:
    def _init_pump(self) -> None:
        # commands for the front's loop (deque: appends and pops are atomic, and an empty
        # check costs nothing on the hot path, unlike Queue.get_nowait's exception)
        self._commands: deque[Callable[[], None]] = deque()
        # The loop serving this front once started (front_loop.py), the sockets it watches
        # (socket -> (name, replica id), socket -> fd) and the front's next timed duty.
        self._loop: FrontLoop | None = None
        self._watched: dict[zmq.Socket, tuple[str, int | None]] = {}
        self._watched_fds: dict[zmq.Socket, int] = {}
        self._watched_replicas: dict[int, _ReplicaSockets] | None = None
        # the same sockets in one zmq_poll: reading every socket's EVENTS in one C call
        self._poller = zmq.Poller()
        self._tick: Any = None  # asyncio.TimerHandle
        self._tick_due = 0.0
        self._closed = False

    @property
    def _started(self) -> bool:
        return self._loop is not None and not self._closed

    def _run_on_loop(self, command: Callable[[], None]) -> None:
        """Run ``command`` on the front's loop (in order with the messages it routes), or
        here when the front is not served by a loop."""
        if not self._started:
            command()
            return
        assert self._loop is not None
        self._commands.append(command)
        self._loop.call(self._service)

    def _apply_commands(self) -> None:
        while self._commands:
            self._commands.popleft()()

    def _watch_sockets(self) -> None:
        """Watch the client sockets and the replicas' (once the replica set changed)."""
        if self._loop is None or self._closed or self._watched_replicas == self._replicas:
            return
        wanted: dict[zmq.Socket, tuple[str, int | None]] = {}
        for name in ("shell", "control", "stdin", "hb", "iopub"):
            wanted[self._sockets[name]] = (name, None)
        for rid, r in self._replicas.items():
            for name, sock in r.sockets():
                wanted[sock] = (f"replica-{name}", rid)
        for sock in [s for s in self._watched if s not in wanted]:
            self._unwatch(sock)
        for sock, role in wanted.items():
            if sock not in self._watched:
                fd = sock.getsockopt(zmq.FD)
                self._loop.loop.add_reader(fd, self._service, sock)
                self._watched_fds[sock] = fd
                self._poller.register(sock, zmq.POLLIN)
            self._watched[sock] = role
        self._watched_replicas = dict(self._replicas)

    def _unwatch(self, sock: zmq.Socket) -> None:
        if self._watched.pop(sock, None) is not None:
            self._poller.unregister(sock)
        fd = self._watched_fds.pop(sock, None)
        if fd is not None and self._loop is not None:
            self._loop.loop.remove_reader(fd)

    def _service(self, fired: zmq.Socket | None = None) -> None:
        """The front's turn on the loop: apply commands, then read every socket that has a
        message until none has (a ZMQ fd signals edges, and any send or receive on a socket
        may consume its signal: each socket's ``EVENTS`` is read again after every round),
        then the timed duties, then the next timer.

        ``fired``: the socket whose fd woke the loop. Its message is read first, straight
        away: the round that would only have found it costs a ``zmq_poll`` of every socket of
        the front (17 with three replicas: a mailbox poll and a ``getpid`` per socket, ~11 us,
        twice per wake-up, issue 36). The rounds after it check every socket as before."""
        if self._closed:
            return
        try:
            self._apply_commands()
            self._watch_sockets()
            if fired is not None:
                self._read_one(fired)
            for _ in range(MAX_ROUNDS):
                if not self._service_round() or self._closed:
                    break
            else:  # still busy: the other fronts get a turn first
                assert self._loop is not None
                self._loop.loop.call_soon(self._service)
            if not self._closed:
                self._timed_duties()
        except Exception:  # noqa: BLE001 - a dead front would leave the kernel unanswered
            log.exception("kernel %s: front loop pass failed; carrying on", self.kernel_id)
            self._watched_replicas = None  # watch the sockets again from scratch
        if not self._closed:
            self._schedule_tick()

    def _service_round(self) -> bool:
        """One message from each socket that has one; whether there was any."""
        try:
            ready = self._poller.poll(0)
        except zmq.ZMQError as exc:  # a socket closed under us: watch afresh
            log.debug("kernel %s: polling its sockets: %s", self.kernel_id, exc)
            self._watched_replicas = None
            return False
        for sock, _ in ready:
            if self._closed:
                break
            self._read_one(sock)
        return bool(ready)

    def _read_one(self, sock: zmq.Socket) -> None:
        """Read one message from ``sock`` (if it has one) and hand it to its handler."""
        role = self._watched.get(sock)
        if role is None or sock.closed:  # dropped earlier in this round
            return
        name, rid = role
        try:
            frames = recv_frames(sock, NOBLOCK)
        except zmq.Again:
            return
        except zmq.ZMQError as exc:  # closed under us
            log.debug("kernel %s: %s socket gone: %s", self.kernel_id, name, exc)
            return
        try:
            self._dispatch(name, rid, frames)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            self._dropped("malformed")
            log.warning("kernel %s: dropped a malformed message on %s: %s",
                        self.kernel_id, name, str(exc)[:200])
        except Exception:  # noqa: BLE001 - one bad message must not stop the kernel
            self._dropped("malformed")
            log.exception("kernel %s: dropping a message on %s", self.kernel_id, name)
        if self._commands:
            self._apply_commands()
        self._watch_sockets()

    def _timed_duties(self) -> None:
        self._release_deferred()
        if self.iopub_held and self._iopub_topics:
            self._flush_iopub()
        if self._holding:
            self._send_due_yields()
        if self._unrouted:
            self._unrouted.retry()
        self._close_idle_lazy_links()  # returns at once when none is due

    def _next_duty(self) -> float | None:
        """When the front next has something timed to do (monotonic, the loop's clock)."""
        due: float | None = None
        if self._holding:
            due = min(p.yields_due for p in self._holding.values())
        if self._deferred or (self.iopub_held and self._iopub_topics) or self._unrouted:
            soon = time.monotonic() + RETRY_S
            due = soon if due is None else min(due, soon)
        lazy_due = self._lazy_links_due()
        if lazy_due is not None:
            due = lazy_due if due is None else min(due, lazy_due)
        return due

    def _schedule_tick(self) -> None:
        due = self._next_duty()
        if due is None:
            self._cancel_tick()
            return
        if self._tick is not None and self._tick_due <= due:
            return  # an earlier (or the same) turn is set: it sets the next one
        self._cancel_tick()
        assert self._loop is not None
        self._tick_due = due
        self._tick = self._loop.loop.call_at(due, self._on_tick)

    def _on_tick(self) -> None:
        self._tick = None
        self._service()

    def _cancel_tick(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None

