"""Is a replica ready? It answers ``kernel_info_request`` on its shell socket."""

from __future__ import annotations

import time

import zmq
from jupyter_client.session import Session

from notebookos.global_scheduler.front import GS_USERNAME, ReplicaEndpoint


def wait_until_ready(endpoints: list[ReplicaEndpoint], key: str, signature_scheme: str,
                     timeout_s: float, alive=lambda rid: True,  # noqa: ANN001
                     replies: dict[int, dict] | None = None) -> set[int]:
    """Replica ids that answered ``kernel_info_request`` within ``timeout_s``.

    ``alive(replica_id)`` lets the caller stop waiting for a replica whose process exited;
    ``replies`` (when given) receives each replica's kernel_info_reply content.
    """
    session = Session(key=key.encode(), signature_scheme=signature_scheme,
                      username=GS_USERNAME)
    context = zmq.Context.instance()
    sockets: dict[zmq.Socket, int] = {}
    ready: set[int] = set()
    poller = zmq.Poller()
    try:
        for e in endpoints:
            s = context.socket(zmq.DEALER)
            s.linger = 0
            s.connect(f"tcp://{e.ip}:{e.shell_port}")
            session.send(s, "kernel_info_request", {})
            sockets[s] = e.replica_id
            poller.register(s, zmq.POLLIN)
        deadline = time.monotonic() + timeout_s
        last_send = time.monotonic()
        while len(ready) < len(endpoints) and time.monotonic() < deadline:
            if not all(alive(rid) for rid in sockets.values() if rid not in ready):
                break
            for sock, _ in poller.poll(100):
                frames = sock.recv_multipart()
                _, msg_list = session.feed_identities(frames)
                try:
                    msg = session.deserialize(msg_list)
                except (ValueError, TypeError):
                    continue
                if msg["header"]["msg_type"] == "kernel_info_reply":
                    ready.add(sockets[sock])
                    if replies is not None:
                        replies[sockets[sock]] = msg["content"]
                    poller.unregister(sock)
            if time.monotonic() - last_send > 2.0:  # a request sent before the bind is lost
                last_send = time.monotonic()
                for sock, rid in sockets.items():
                    if rid not in ready:
                        session.send(sock, "kernel_info_request", {})
        return ready
    finally:
        for s in sockets:
            s.close(linger=0)
