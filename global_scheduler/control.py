"""One request/reply exchange with a replica on its control channel (membership changes)."""

from __future__ import annotations

import time
from typing import Any

import zmq
from jupyter_client.session import Session

from notebookos.global_scheduler.front import GS_USERNAME, ReplicaEndpoint


class ControlError(Exception):
    """The replica did not answer, or answered with an error; the message says which."""


def control_request(endpoint: ReplicaEndpoint, key: str, signature_scheme: str, msg_type: str,
                    content: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
    """Send ``msg_type`` on the replica's control socket; the reply content when status is ok."""
    session = Session(key=key.encode(), signature_scheme=signature_scheme,
                      username=GS_USERNAME)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(f"tcp://{endpoint.ip}:{endpoint.control_port}")
        sent = session.send(sock, msg_type, content)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not sock.poll(int(max(0.0, deadline - time.monotonic()) * 1000)):
                break
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
