"""One request/reply exchange with a replica on its control channel (membership changes)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import zmq
from jupyter_client.session import Session

from notebookos.global_scheduler.front import GS_USERNAME, ReplicaEndpoint

GIVE_UP_POLL_S = 0.25


class ControlError(Exception):
    """The replica did not answer, or answered with an error; the message says which."""


def control_request(endpoint: ReplicaEndpoint, key: str, signature_scheme: str, msg_type: str,
                    content: dict[str, Any], timeout_s: float = 30.0,
                    give_up: Callable[[], str | None] | None = None) -> dict[str, Any]:
    """Send ``msg_type`` on the replica's control socket; the reply content when status is ok.
    ``give_up`` is asked every ``GIVE_UP_POLL_S`` while waiting: a reason it returns ends the
    wait with a ControlError (the replica died meanwhile, say: no answer will come)."""
    session = Session(key=key.encode(), signature_scheme=signature_scheme,
                      username=GS_USERNAME)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(f"tcp://{endpoint.ip}:{endpoint.control_port}")
        sent = session.send(sock, msg_type, content)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            wait = max(0.0, deadline - time.monotonic())
            if give_up is not None:
                wait = min(wait, GIVE_UP_POLL_S)
            if not sock.poll(int(wait * 1000)):
                reason = give_up() if give_up is not None else None
                if reason:
                    raise ControlError(f"replica {endpoint.replica_id}: {msg_type} abandoned: "
                                       f"{reason}")
                continue
            _, msg_list = session.feed_identities(sock.recv_multipart())
            try:
                reply = session.deserialize(msg_list)
            except (ValueError, TypeError):
                continue
            if reply["parent_header"].get("msg_id") != sent["header"]["msg_id"]:
                continue
            body = reply["content"]
            if body.get("status") != "ok":
                raise ControlError(f"replica {endpoint.replica_id} refused {msg_type}: "
                                   f"{body.get('ename', '')}: {body.get('evalue', body)}")
            return body
        raise ControlError(f"replica {endpoint.replica_id} did not answer {msg_type} within "
                           f"{timeout_s:g}s")
    finally:
        sock.close(linger=0)
