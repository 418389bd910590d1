"""The records a front keeps of the requests it routes: ``_Waiting`` (an execute request not
sent to a replica yet) and ``_Pending`` (a request sent, until its client has the reply), and
the ids a cell runs under when it is placed again."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

MAX_RESUBMISSIONS = 3


@dataclass
class _Pending:
    channel: str
    idents: list[bytes]
    msg_type: str
    source: int | None  # replica whose reply and IOPub the client sees (None: first to answer)
    asked: set[int] = field(default_factory=set)
    answered: set[int] = field(default_factory=set)
    last_reply: list[bytes] | None = None
    sent_unix: float = field(default_factory=time.time)
    client_msg: dict | None = None  # the client's request (resubmission, error replies)
    frames: list[bytes] = field(default_factory=list)  # its signed frames (re-routing)
    client_msg_id: str = ""  # the client's msg_id when this is a resubmission under a new id
    attempt: int = 0
    gpu_device_ids: list[int] = field(default_factory=list)  # committed for the executor
    held_yields: list[int] = field(default_factory=list)  # standbys not sent yield_request yet
    yields_due: float = 0.0  # monotonic time the held yield_request copies go out
    placement: _Waiting | None = None  # an execute request's arrival and wait for GPUs
    started: float = 0.0  # when its executor published execute_input (monotonic)
    # The executor's ``idle`` when it came before its execute_reply: (parent id, idents, frames)
    held_idle: tuple[str, list[bytes], list[bytes]] | None = None


@dataclass
class _Waiting:
    """An ``execute_request`` not sent to a replica yet: queued, or being placed (off the
    front's loop, which keeps routing everything else meanwhile)."""

    idents: list[bytes]
    msg: dict  # the client's request
    msg_id: str  # the client's msg_id, or a resubmission's
    attempt: int
    arrived: float = field(default_factory=time.monotonic)  # at the front (its first attempt)
    withdrawn: bool = False  # interrupted while waiting: answered ``aborted``, never sent
    wait_reason: str = ""  # why it waits for GPUs, once the scheduler said so (cell_waiting)
    placed_at: float = 0.0


def _retry_id(msg_id: str, attempt: int) -> str:
    """The id a request runs under when it is placed again (``<client id>:retry<attempt>``)."""
    return f"{msg_id.rsplit(':retry', 1)[0]}:retry{attempt}"

