"""Is a replica ready? It answers ``kernel_info_request`` on its shell socket.

The wait is a coroutine on the fronts' loop (``ready``: zmq.asyncio, its sockets watched by
epoll; issue 32), so a start, a restart, a wake, a replacement, a rebuild, a migration or a
cell's container waiting for its replicas holds no thread. A thread that must wait (a test's
client) calls ``wait_until_ready``: the same coroutine run on the loop, the thread blocked on
its result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import zmq
import zmq.asyncio
from jupyter_client.session import Session

from notebookos.global_scheduler.front import GS_USERNAME, ReplicaEndpoint
from notebookos.global_scheduler.front_loop import FrontLoop
from notebookos.global_scheduler.loop_waits import LoopSignal

RESEND_S = 2.0  # a request sent before the replica bound its socket is lost: sent again


async def ready(endpoints: list[ReplicaEndpoint], key: str, signature_scheme: str,
                timeout_s: float, alive: Callable[[int], bool] = lambda rid: True,
                replies: dict[int, dict] | None = None,
                exits: LoopSignal | None = None) -> set[int]:
    """Replica ids that answered ``kernel_info_request`` within ``timeout_s`` (on a loop).

    ``alive(replica_id)`` lets the caller stop waiting for a replica whose process exited: it
    is asked when the wait begins, at each resend and whenever ``exits`` fires (the caller
    fires it when a Local Scheduler reports a replica's exit), never on a timer of its own;
    ``replies`` (when given) receives each replica's kernel_info_reply content. The wait wakes
    for a reply, an exit, a resend or the deadline, nothing else.
    """
    loop = asyncio.get_running_loop()
    session = Session(key=key.encode(), signature_scheme=signature_scheme,
                      username=GS_USERNAME)
    context = zmq.asyncio.Context.shadow(zmq.Context.instance())
    sockets: dict[zmq.asyncio.Socket, int] = {}
    receiving: dict[asyncio.Future, zmq.asyncio.Socket] = {}
    answered: set[int] = set()
    try:
        for e in endpoints:
            s = context.socket(zmq.DEALER)
            s.linger = 0
            s.connect(f"tcp://{e.ip}:{e.shell_port}")
            session.send(s, "kernel_info_request", {})
            sockets[s] = e.replica_id
            receiving[asyncio.ensure_future(s.recv_multipart())] = s
        deadline = loop.time() + timeout_s
        next_send = loop.time() + RESEND_S
        while receiving:
            now = loop.time()
            if now >= deadline:
                break
            exited = exits.future() if exits is not None else None  # before ``alive`` is read
            if not all(alive(sockets[sock]) for sock in receiving.values()):
                break
            if now >= next_send:
                next_send = now + RESEND_S
                for sock in receiving.values():
                    session.send(sock, "kernel_info_request", {})
            waits = [*receiving] + ([exited] if exited is not None else [])
            done, _ = await asyncio.wait(waits, timeout=min(deadline, next_send) - now,
                                         return_when=asyncio.FIRST_COMPLETED)
            for received in done:
                sock = receiving.pop(received, None)
                if sock is None:  # the exit signal
                    continue
                reply = _kernel_info_reply(session, received.result())
                if reply is None:  # not the answer: listen on
                    receiving[asyncio.ensure_future(sock.recv_multipart())] = sock
                    continue
                answered.add(sockets[sock])
                if replies is not None:
                    replies[sockets[sock]] = reply
        return answered
    finally:
        for received in receiving:
            received.cancel()
        for s in sockets:
            s.close(linger=0)


def _kernel_info_reply(session: Session, frames: list[bytes]) -> dict | None:
    """The content of a ``kernel_info_reply`` in ``frames``; None for anything else."""
    _, msg_list = session.feed_identities(frames)
    try:
        msg = session.deserialize(msg_list)
    except (ValueError, TypeError):
        return None
    if msg["header"]["msg_type"] != "kernel_info_reply":
        return None
    return msg["content"]


def wait_until_ready(endpoints: list[ReplicaEndpoint], key: str, signature_scheme: str,
                     timeout_s: float, alive: Callable[[int], bool] = lambda rid: True,
                     replies: dict[int, dict] | None = None,
                     exits: LoopSignal | None = None) -> set[int]:
    """``ready`` for a thread: run on the fronts' loop, this thread blocked until it ends.
    Never call it on the loop (it would wait for itself): await ``ready`` there."""
    loop = FrontLoop.shared()
    if loop.on_loop():
        raise RuntimeError("wait_until_ready called on the fronts' loop: await ready()")
    return loop.spawn(ready(endpoints, key, signature_scheme, timeout_s, alive,
                            replies, exits)).result()
