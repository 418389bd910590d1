"""Multipart send and receive without pyzmq's Python layer, for the hot paths that route every
message of every cell (the Global Scheduler's kernel fronts).

``Socket.send_multipart`` type-checks every frame, then ORs ``SNDMORE`` into the flags of each
one (``IntFlag`` arithmetic: two enum constructions per frame); ``recv_multipart`` reads
``RCVMORE`` through ``getsockopt``, which builds an enum per frame. For the ~7 frames of a
Jupyter message that was half of the call (measured: 16 us vs 9 us for one 6-frame send on
loopback TCP; a trivial cell makes the front send 6 messages and receive 6, issue 36). These
call the Cython socket's ``send``/``recv``/``get`` with plain ints: the same libzmq calls, the
same errors (``zmq.Again``, ``zmq.ZMQError``), the same frames. (pyzmq 27's Cython ``get`` still
builds a ``SocketOption`` per call, ints included, about 1 us a frame; receiving ``Frame``
objects instead, whose ``more`` the receive reads, measured no cheaper in the Global Scheduler,
issue 36.) Anything that is not a pyzmq
socket (a test's stand-in) goes through its own ``send_multipart``/``recv_multipart``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import zmq
from zmq.backend import Socket as _BaseSocket

_send = _BaseSocket.send
_recv = _BaseSocket.recv
_get = _BaseSocket.get
SNDMORE = int(zmq.SNDMORE)
NOBLOCK = int(zmq.NOBLOCK)
_RCVMORE = int(zmq.RCVMORE)


def send_frames(sock: Any, frames: Sequence[Any], flags: int = 0) -> None:
    """``sock.send_multipart(frames, flags)`` (copying, untracked) for bytes-like frames."""
    if not isinstance(sock, _BaseSocket):
        sock.send_multipart(frames, flags)
        return
    more = flags | SNDMORE
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        _send(sock, frame, more if i < last else flags)


def recv_frames(sock: Any, flags: int = 0) -> list[bytes]:
    """``sock.recv_multipart(flags)`` (copying): the frames of one message as bytes."""
    if not isinstance(sock, _BaseSocket):
        return sock.recv_multipart(flags)
    frames = [_recv(sock, flags)]
    while _get(sock, _RCVMORE):
        frames.append(_recv(sock, flags))
    return frames
