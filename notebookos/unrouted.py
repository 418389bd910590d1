"""Replies a ROUTER socket could not route yet, kept and sent once their peer is back.

A plain ROUTER silently drops a message for a peer that is not connected. Around a Global
Scheduler restart that loses replies twice over: a replica's ``execute_reply`` to a front that
is not back yet, and the restarted front's forward of it to a client whose socket has not
reconnected yet. ``UnroutedReplies`` sets ``ROUTER_MANDATORY`` on the socket, so such a send
fails (``EHOSTUNREACH``, or ``EAGAIN`` when the peer's queue is full) instead of vanishing; the
frames are kept, oldest first and bounded, and ``retry`` sends them in order once the peer takes
them. Used by the replica's shell (kernel/held_replies.py) and the front's shell
(global_scheduler/front.py). Everything runs on the socket's own thread.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import zmq

from notebookos.zmq_frames import NOBLOCK, send_frames

log = logging.getLogger(__name__)

NOT_ROUTED = (zmq.EHOSTUNREACH, zmq.EAGAIN)


class UnroutedReplies:
    def __init__(self, socket: zmq.Socket, *, keep_s: float, max_replies: int = 256,
                 retry_every_s: float = 0.0) -> None:
        self.socket = socket
        self.keep_s = keep_s
        self.retry_every_s = retry_every_s  # ``retry`` calls sooner than this after one do nothing
        self._next_retry = 0.0
        self._kept: deque[tuple[float, list[bytes]]] = deque(maxlen=max_replies)
        self.delivered_late = 0  # kept replies sent later (tests, logs)
        socket.setsockopt(zmq.ROUTER_MANDATORY, 1)

    def __len__(self) -> int:
        return len(self._kept)

    def send(self, frames: list[bytes]) -> None:
        """Send now, or keep the frames when their peer is not there."""
        try:
            send_frames(self.socket, frames, NOBLOCK)
        except zmq.ZMQError as exc:
            if exc.errno not in NOT_ROUTED:
                raise
            self.keep(frames)

    def keep(self, frames: list[bytes]) -> None:
        """Keep frames whose send failed for want of their peer."""
        if len(self._kept) == self._kept.maxlen:
            log.warning("%d replies kept for absent peers: dropping the oldest", len(self._kept))
        self._kept.append((time.monotonic() + self.keep_s, list(frames)))

    def retry(self) -> bool:
        """Send what is kept, in order, while the peers take it; drop what outlived ``keep_s``.
        Whether anything is still kept."""
        now = time.monotonic()
        if not self._kept or now < self._next_retry:
            return bool(self._kept)
        self._next_retry = now + self.retry_every_s
        for _ in range(len(self._kept)):
            keep_until, frames = self._kept.popleft()
            try:
                send_frames(self.socket, frames, NOBLOCK)
            except zmq.ZMQError as exc:
                if exc.errno in NOT_ROUTED and now < keep_until:
                    self._kept.append((keep_until, frames))
                else:
                    log.warning("dropped a reply kept for a peer that did not come back: %s", exc)
                continue
            self.delivered_late += 1
        return bool(self._kept)
