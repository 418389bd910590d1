"""Is a replica ready? It answers ``kernel_info_request`` on its shell socket.

The wait is a coroutine on the fronts' loop (``ready``: zmq.asyncio, its sockets watched by
epoll; issue 32), so a start waiting for its replicas holds no thread. A thread that must wait
(a recovery, a migration, a wake in the ``gs-work`` pool) calls ``wait_until_ready``: the same
coroutine run on the loop, the thread blocked on its result.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import zmq
import zmq.asyncio
from jupyter_client.session import Session

from notebookos.global_scheduler.front import GS_USERNAME, ReplicaEndpoint
from notebookos.global_scheduler.front_loop import FrontLoop

RESEND_S = 2.0  # a request sent before the replica bound its socket is lost: sent again
POLL_MS = 100  # how often ``alive`` is asked


async def ready(endpoints: list[ReplicaEndpoint], key: str, signature_scheme: str,
                timeout_s: float, alive: Callable[[int], bool] = lambda rid: True,
                replies: dict[int, dict] | None = None) -> set[int]:
    """Replica ids that answered ``kernel_info_request`` within ``timeout_s`` (on a loop).

    ``alive(replica_id)`` lets the caller stop waiting for a replica whose process exited;
    ``replies`` (when given) receives each replica's kernel_info_reply content.
    """
    session = Session(key=key.encode(), signature_scheme=signature_scheme,
                      username=GS_USERNAME)
    context = zmq.asyncio.Context.shadow(zmq.Context.instance())
    sockets: dict[zmq.asyncio.Socket, int] = {}
    answered: set[int] = set()
    poller = zmq.asyncio.Poller()
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
        while len(answered) < len(endpoints) and time.monotonic() < deadline:
            if not all(alive(rid) for rid in sockets.values() if rid not in answered):
                break
            for sock, _ in await poller.poll(POLL_MS):
                while True:  # drain: the socket's FD is edge-triggered
                    try:
                        frames = await sock.recv_multipart(flags=zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    _, msg_list = session.feed_identities(frames)
                    try:
                        msg = session.deserialize(msg_list)
                    except (ValueError, TypeError):
                        continue
                    if msg["header"]["msg_type"] == "kernel_info_reply":
                        answered.add(sockets[sock])
                        if replies is not None:
                            replies[sockets[sock]] = msg["content"]
                        poller.unregister(sock)
                        break
            if time.monotonic() - last_send > RESEND_S:
                last_send = time.monotonic()
                for sock, rid in sockets.items():
                    if rid not in answered:
                        session.send(sock, "kernel_info_request", {})
        return answered
    finally:
        for s in sockets:
            s.close(linger=0)


def wait_until_ready(endpoints: list[ReplicaEndpoint], key: str, signature_scheme: str,
                     timeout_s: float, alive: Callable[[int], bool] = lambda rid: True,
                     replies: dict[int, dict] | None = None) -> set[int]:
    """``ready`` for a thread: run on the fronts' loop, this thread blocked until it ends.
    Never call it on the loop (it would wait for itself): await ``ready`` there."""
    loop = FrontLoop.shared()
    if loop.on_loop():
        raise RuntimeError("wait_until_ready called on the fronts' loop: await ready()")
    return loop.spawn(ready(endpoints, key, signature_scheme, timeout_s, alive,
                            replies)).result()
