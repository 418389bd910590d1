"""IOPub that keeps what it publishes while nobody subscribes, and flushes it on subscription.

ipykernel 7 publishes IOPub on an XPUB socket from its ``IOPubThread``; a PUB/XPUB socket drops
every message that no subscriber matches. A replica's only subscriber is the Global Scheduler's
front, so while the Global Scheduler restarts (DESIGN section 4) everything a running cell prints
would be lost. ``BufferedIOPubThread`` tracks subscriptions from the XPUB's (un)subscribe frames
(``b"\\x01topic"`` when a topic gets its first subscriber, ``b"\\x00topic"`` when its last
subscriber goes, which libzmq also sends when the subscriber's connection dies) and, while no
topic is subscribed, appends messages to a bounded ``Backlog`` (oldest dropped, counted, warned)
that it sends in order as soon as a subscription arrives, right after ipykernel's
``iopub_welcome``. This also covers the time before the first subscriber ever connects (the
``starting`` status is kept, then delivered).

Everything here runs on the IOPub thread (sends are scheduled onto it, and subscriptions are read
there), so no locks are needed. Limit: a message already handed to the operating system when the
subscriber died (in the TCP send buffer, or sent before libzmq noticed the dead connection) is
lost; see docs/kernel-protocol.md.
"""

from __future__ import annotations

import logging
from typing import Any

import zmq
from ipykernel.iostream import CHILD, IOPubThread

from notebookos.backlog import DEFAULT_MAX_BYTES, DEFAULT_MAX_MESSAGES, Backlog

log = logging.getLogger(__name__)

SUBSCRIBE = 1
UNSUBSCRIBE = 0

# How a subscriber whose host vanished (no FIN/RST) is found: TCP keepalive on an idle link,
# TCP_USER_TIMEOUT (libzmq's ZMQ_TCP_MAXRT on Linux) while sent data is unacknowledged.
DEAD_PEER_KEEPALIVE_IDLE_S = 2
DEAD_PEER_KEEPALIVE_INTVL_S = 2
DEAD_PEER_KEEPALIVE_CNT = 2
DEAD_PEER_USER_TIMEOUT_MS = 6000


def set_dead_peer_timeouts(socket: zmq.Socket) -> None:
    """Drop a connection whose peer's host is gone within about 6 s, with timers that run in
    the operating system's TCP stack: unlike ZMTP heartbeats they never wake the process while
    the kernel is idle (issue 36). Set before ``bind``: libzmq applies them to each new
    connection. A peer process that is alive but stopped (SIGSTOP) is not dropped: its host's
    TCP stack still acknowledges, and what it is sent waits in its receive buffer."""
    socket.tcp_keepalive = 1
    socket.tcp_keepalive_idle = DEAD_PEER_KEEPALIVE_IDLE_S
    socket.tcp_keepalive_intvl = DEAD_PEER_KEEPALIVE_INTVL_S
    socket.tcp_keepalive_cnt = DEAD_PEER_KEEPALIVE_CNT
    socket.setsockopt(zmq.TCP_MAXRT, DEAD_PEER_USER_TIMEOUT_MS)


class BufferedIOPubThread(IOPubThread):
    """An ``IOPubThread`` that holds messages while its XPUB socket has no subscriber."""

    def __init__(self, socket: zmq.Socket, pipe: bool = False, session: Any = None, *,
                 max_messages: int = DEFAULT_MAX_MESSAGES,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.backlog = Backlog(max_messages, max_bytes)
        self.topics: set[bytes] = set()  # topics with at least one subscriber
        self.flushed = 0  # messages sent from the backlog (tests, logs)
        super().__init__(socket, pipe=pipe, session=session)

    @property
    def subscribed(self) -> bool:
        return bool(self.topics)

    # -- subscriptions (IO thread) ----------------------------------------------------------

    def _handle_subscription(self, frames: list[bytes]) -> None:
        for frame in frames:
            frame = bytes(frame)
            if not frame:
                continue
            if frame[0] == SUBSCRIBE:
                self.topics.add(frame[1:])
            elif frame[0] == UNSUBSCRIBE:
                self.topics.discard(frame[1:])
        super()._handle_subscription(frames)  # ipykernel's iopub_welcome first
        self._flush()

    def _read_subscriptions(self) -> None:
        """Take pending (un)subscriptions now instead of when the IO loop polls for them: reading
        makes libzmq process a dead subscriber's pipe termination, so its unsubscribe is seen
        before the next message goes nowhere."""
        socket = self.socket
        if socket is None or not hasattr(socket, "recv_multipart"):
            return
        while True:
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return
            self._handle_subscription(frames)

    # -- sending (IO thread) ----------------------------------------------------------------

    def _really_send(self, msg: list[Any], *args: Any, **kwargs: Any) -> None:
        if self.closed or self._check_mp_mode() == CHILD:
            super()._really_send(msg, *args, **kwargs)
            return
        self._read_subscriptions()
        if self.subscribed and not self.backlog:
            super()._really_send(msg, *args, **kwargs)
            return
        dropped = self.backlog.append(msg, (args, kwargs))
        if dropped:
            log.warning("IOPub: no subscriber; dropped %d oldest held message(s) (%d so far, "
                        "bound %d messages / %d bytes)", dropped, self.backlog.dropped,
                        self.backlog.max_messages, self.backlog.max_bytes)
        self._flush()

    def _flush(self) -> None:
        while self.backlog and self.subscribed and not self.closed:
            frames, (args, kwargs) = self.backlog.popleft()
            super()._really_send(frames, *args, **kwargs)
            self.flushed += 1
