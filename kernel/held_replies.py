"""Executor replies that found no scheduler to take them, kept and sent once it is back.

A replica's shell is an ipykernel ROUTER whose one peer is the Global Scheduler's front (same ZMQ
identity across scheduler restarts). A plain ROUTER silently drops a message for a peer that is
not connected, so a cell finishing while the Global Scheduler restarts used to lose its
``execute_reply``: the notebook showed the cell running forever although its output and ``idle``
arrived (the IOPub side is kept by ``iopub.BufferedIOPubThread``).

``HeldReplies`` keeps them with ``notebookos.unrouted.UnroutedReplies`` (``ROUTER_MANDATORY``
on the shell socket, so such a send fails instead of vanishing): the shell stream's send callback
hands a failed message here, and an executor's ``execute_reply`` is kept (bounded, for up to an
hour) and retried every ``retry_s`` on the kernel's loop until the peer is back. The restarted
front forwards it to the client session that sent the request (global_scheduler/front.py, ``_orphan_reply``). Other replies are not kept: a
standby's reply matters to no one after a restart, and a client retries ``kernel_info`` and
completion requests itself.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import zmq

from notebookos.unrouted import UnroutedReplies

log = logging.getLogger(__name__)

DELIMITER = b"<IDS|MSG>"


class HeldReplies:
    def __init__(self, socket: zmq.Socket, call_later: Callable[[float, Callable[[], None]], Any],
                 *, max_replies: int = 256, max_age_s: float = 3600.0,
                 retry_s: float = 0.25) -> None:
        self._replies = UnroutedReplies(socket, keep_s=max_age_s, max_replies=max_replies)
        self._call_later = call_later
        self.retry_s = retry_s
        self._retrying = False

    def __len__(self) -> int:
        return len(self._replies)

    @property
    def delivered_late(self) -> int:
        return self._replies.delivered_late

    def on_send(self, frames: list[Any], status: Any) -> None:
        """ZMQStream send callback: keep an executor reply that found no peer."""
        if not (isinstance(status, zmq.ZMQError) and status.errno == zmq.EHOSTUNREACH):
            return
        frames = [bytes(f.bytes if isinstance(f, zmq.Frame) else f) for f in frames]
        if not _is_executor_reply(frames):
            return
        self._replies.keep(frames)
        log.info("execute_reply held: no scheduler connected (%d held)", len(self._replies))
        self._schedule()

    def _schedule(self) -> None:
        if not self._retrying:
            self._retrying = True
            self._call_later(self.retry_s, self.retry)

    def retry(self) -> None:
        """Send what is held, in order, while the scheduler takes it; try again later if not."""
        self._retrying = False
        if self._replies.retry():
            self._schedule()


def _is_executor_reply(frames: list[bytes]) -> bool:
    try:
        i = frames.index(DELIMITER)
        header = json.loads(frames[i + 2])
        metadata = json.loads(frames[i + 4])
    except (ValueError, IndexError, TypeError):
        return False
    role = ((metadata or {}).get("notebookos") or {}).get("role")
    return header.get("msg_type") == "execute_reply" and role == "executor"
