"""A replica's stdin socket: an ``input_request`` waits for its peer instead of being lost.

The Global Scheduler connects to a replica's stdin when it sends that replica a cell allowed to
read input, and closes the connection once idle (``global_scheduler/front_replicas.py``). The
cell can call ``input()`` before that connection is up; ipykernel's ROUTER would then drop the
request without a word and the cell would wait forever. With ``ROUTER_MANDATORY`` the send fails
while the peer is unknown, and this socket retries it until the peer has connected, for up to
``CONNECT_WAIT_S``; after that the error reaches ``input()`` (no client can answer it).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import zmq

log = logging.getLogger(__name__)

CONNECT_WAIT_S = 10.0
RETRY_EVERY_S = 0.002


class PatientStdinRouter(zmq.Socket):
    """``send_multipart`` retried while the addressed peer has not connected yet."""

    def send_multipart(self, msg_parts: Any, flags: int = 0, copy: bool = True,  # noqa: ANN401
                       track: bool = False, **kwargs: Any) -> Any:  # noqa: ANN401
        deadline = time.monotonic() + CONNECT_WAIT_S
        while True:
            try:
                return super().send_multipart(msg_parts, flags, copy, track, **kwargs)
            except zmq.ZMQError as exc:
                # the routing frame goes first: nothing of the message was sent
                if exc.errno != zmq.EHOSTUNREACH or time.monotonic() >= deadline:
                    if exc.errno == zmq.EHOSTUNREACH:
                        log.warning("input_request: no client connected to stdin within %.0f s",
                                    CONNECT_WAIT_S)
                    raise
            time.sleep(RETRY_EVERY_S)


def make_patient(sock: zmq.Socket) -> None:
    """Turn ipykernel's stdin ROUTER into a ``PatientStdinRouter``, same object and binding.
    ``ROUTER_HANDOVER`` (ipykernel sets it too): a peer reconnecting with the identity of a
    connection whose close the socket has not processed yet takes the identity over; without
    it the new connection is ignored and every send to that identity fails."""
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    sock.__class__ = PatientStdinRouter
