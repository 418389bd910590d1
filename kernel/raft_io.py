"""pysyncobj's socket reads without the system calls a Raft message does not need.

For every message that arrives on a connected peer's socket, pysyncobj's ``TcpConnection`` asks
the socket for a pending error (``getsockopt(SO_ERROR)``), reads it, asks again, and reads once
more to learn that nothing is left (a ``recv`` that fails with EAGAIN, raised and caught as an
exception); its ``PipeNotifier`` (the wake-up a proposal writes) also reads until EAGAIN. A
trivial cell is 8 messages on the leader's and followers' tick threads together, and each call
that releases the GIL also hands it back and forth with the executor's busy main thread (issue
36; profile in ``docs/performance.md``).

``install()`` replaces, on pysyncobj's classes, the three steps that make those calls:

- a connected socket's poll event is handled as pysyncobj does, less the ``SO_ERROR`` query: a
  pending error on a connected socket makes ``poll`` report POLLERR, which pysyncobj handles by
  disconnecting, and a later ``recv`` or ``send`` raises it; a socket still connecting (where
  ``SO_ERROR`` is how a refused connect shows) gets pysyncobj's own step;
- a read stops when ``recv`` returned less than it asked for: the socket's buffer was empty then,
  and ``poll`` (level-triggered) reports anything that arrives later; a full read reads again,
  as pysyncobj does;
- the pipe notifier's read stops the same way.

What a message carries, and when Raft acts on it, is unchanged.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from pysyncobj.monotonic import monotonic
from pysyncobj.pipe_notifier import PipeNotifier
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection

_CONNECTED = CONNECTION_STATE.CONNECTED
_DISCONNECTED = CONNECTION_STATE.DISCONNECTED
_READ, _WRITE, _ERROR = POLL_EVENT_TYPE.READ, POLL_EVENT_TYPE.WRITE, POLL_EVENT_TYPE.ERROR
_AGAIN = (errno.EAGAIN, errno.EWOULDBLOCK)
_PIPE_READ = 1024  # the size pysyncobj's notifier reads


def _process_connection(self: Any, descr: int, event: int) -> None:
    """``TcpConnection.__processConnection`` for a connected socket, without ``SO_ERROR``."""
    if (self._TcpConnection__state != _CONNECTED
            or descr != self._TcpConnection__fileno or event & _ERROR):
        _ORIGINAL["process"](self, descr, event)  # connecting, stale or failed: pysyncobj's
        return
    self._TcpConnection__processConnectionTimeout()
    if self._TcpConnection__state == _DISCONNECTED:
        return
    if event & _WRITE:
        self._TcpConnection__trySendBuffer()
        if self._TcpConnection__state == _DISCONNECTED:
            return
        mask = _READ | _ERROR
        if self._TcpConnection__writeBuffer:
            mask |= _WRITE
        self._TcpConnection__poller.subscribe(descr, self._TcpConnection__processConnection, mask)
    if event & _READ:
        self._TcpConnection__tryReadBuffer()
        if self._TcpConnection__state == _DISCONNECTED:
            return
        received = self._TcpConnection__onMessageReceived
        while True:
            message = self._TcpConnection__processParseMessage()
            if message is None:
                break
            if received is not None:
                received(message)
            if self._TcpConnection__state == _DISCONNECTED:
                return


def _try_read_buffer(self: Any) -> None:
    """``TcpConnection.__tryReadBuffer``: read until a ``recv`` returns less than its size."""
    sock = self._TcpConnection__socket
    size = self._TcpConnection__recvBufferSize
    while sock is not None:
        try:
            incoming = sock.recv(size)
        except OSError as e:
            if e.errno not in _AGAIN:
                self.disconnect()
            break
        if not incoming:  # the peer closed
            self.disconnect()
            break
        self._TcpConnection__readBuffer += incoming
        if len(incoming) < size:
            break
    self._TcpConnection__lastReadTime = monotonic()


def _on_notification(self: Any, descr: int, event: int) -> None:
    """``PipeNotifier.__onNewNotification``: read until a read returns less than its size."""
    try:
        while len(os.read(self._PipeNotifier__pipeR, _PIPE_READ)) == _PIPE_READ:
            pass
    except OSError as e:
        if e.errno not in _AGAIN:
            raise
    if self._PipeNotifier__callback is not None:
        self._PipeNotifier__callback()


_ORIGINAL: dict[str, Any] = {}


def install() -> bool:
    """Put the three steps on pysyncobj's classes (idempotent). False, and pysyncobj's own
    steps kept, where its classes do not have them by those names."""
    if getattr(TcpConnection, "_TcpConnection__tryReadBuffer", None) is _try_read_buffer:
        return True
    names = ("_TcpConnection__processConnection", "_TcpConnection__tryReadBuffer")
    if (not all(hasattr(TcpConnection, n) for n in names)
            or not hasattr(PipeNotifier, "_PipeNotifier__onNewNotification")):
        return False
    _ORIGINAL["process"] = TcpConnection._TcpConnection__processConnection
    TcpConnection._TcpConnection__processConnection = _process_connection
    TcpConnection._TcpConnection__tryReadBuffer = _try_read_buffer
    PipeNotifier._PipeNotifier__onNewNotification = _on_notification
    return True

