"""Execute requests a kernel's Global Scheduler may have lost, and their resending.

A client's shell DEALER writes a request into its TCP connection to the kernel's front (in the
Global Scheduler). If the Global Scheduler dies before it has routed the request, the request
dies with it: ZMQ has no acknowledgements, and Jupyter has no retransmission, so the notebook
would wait for that cell forever. The front comes back on the same ports (the supervisor
restarts the Global Scheduler and it restores its kernels), and the DEALER reconnects.

So Jupyter Server keeps every execute_request it forwarded until its execute_reply comes back,
and when the shell connection comes back after a drop it sends the unanswered ones again, with
their own msg_ids. Running a cell twice is prevented on the other side: the replicas answer a
request they answered before with the same reply (they never run a second election for one
msg_id). A second reply for a request already answered is dropped here, so the notebook sees
exactly one reply per cell.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import zmq
from zmq.eventloop.zmqstream import ZMQStream
from zmq.utils.monitor import parse_monitor_message

KEPT = 1024  # unanswered requests kept per connection (and answered ids remembered)

Frames = list[Any]


class UnansweredExecutes:
    """A connection's execute_requests without an execute_reply yet, in the order they went."""

    def __init__(self, limit: int = KEPT) -> None:
        self._limit = limit
        self._unanswered: OrderedDict[str, Frames | dict] = OrderedDict()
        self._answered: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._unanswered)

    def sent(self, msg_id: str, request: Frames | dict) -> None:
        """``request`` (its ws-v1 frames or its message dict) went out under ``msg_id``."""
        if not msg_id or msg_id in self._answered:
            return
        self._unanswered[msg_id] = request
        while len(self._unanswered) > self._limit:
            self._unanswered.popitem(last=False)

    def reply(self, parent_msg_id: str) -> bool:
        """An execute_reply to ``parent_msg_id`` came: whether it is the first one (forward it)
        rather than a second one (drop it)."""
        if parent_msg_id in self._answered:
            return False
        self._unanswered.pop(parent_msg_id, None)
        self._answered[parent_msg_id] = None
        while len(self._answered) > self._limit:
            self._answered.popitem(last=False)
        return True

    def to_resend(self) -> list[tuple[str, Frames | dict]]:
        """What to send again after the connection came back, oldest first."""
        return list(self._unanswered.items())

    def clear(self) -> None:
        """The kernel restarted: what it had not answered died with it."""
        self._unanswered.clear()


class ShellResender:
    """Watches one shell stream's connection and sends its unanswered execute_requests again
    when it comes back after a drop. It lives as long as the stream (Jupyter Server keeps a
    kernel's streams across a browser's reconnects, buffering in between), so a request sent
    before the browser reconnected is still resent."""

    ATTRIBUTE = "_notebookos_resender"

    def __init__(self, stream: Any, session: Any, log: Any) -> None:
        self.stream = stream
        self.session = session
        self.log = log
        self.executes = UnansweredExecutes()
        self.resent = 0
        self._dropped = False
        self.noted: set[str] = set()  # msg_ids told that they wait for the scheduler
        monitor = stream.socket.get_monitor_socket(
            zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_MONITOR_STOPPED)
        self._monitor = ZMQStream(monitor)
        self._monitor.on_recv(self._on_event)

    @classmethod
    def of(cls, stream: Any, session: Any, log: Any) -> ShellResender:
        """The stream's resender, made on first use."""
        resender = getattr(stream, cls.ATTRIBUTE, None)
        if resender is None:
            resender = cls(stream, session, log)
            setattr(stream, cls.ATTRIBUTE, resender)
        return resender

    @property
    def dropped(self) -> bool:
        """The shell connection dropped and has not come back (the Global Scheduler is down)."""
        return self._dropped

    def _on_event(self, frames: list[bytes]) -> None:
        event = parse_monitor_message(frames)["event"]
        if event == zmq.EVENT_DISCONNECTED:
            self._dropped = True
        elif event == zmq.EVENT_CONNECTED and self._dropped:
            self._dropped = False
            self._resend()
        elif event == zmq.EVENT_MONITOR_STOPPED:  # the shell socket closed
            self._monitor.close()

    def _resend(self) -> None:
        if self.stream.closed():
            return
        requests = self.executes.to_resend()
        if requests:
            self.log.warning("the kernel's connection came back: sending %d unanswered "
                             "execute request(s) again", len(requests))
        for _, request in requests:
            self.resent += 1
            if isinstance(request, dict):
                self.session.send(self.stream, dict(request))
            else:
                self.session.send_raw(self.stream, list(request))
