"""An executor's execute_reply sent while no scheduler is connected to the replica's shell is
kept and delivered once a peer with the scheduler's identity connects again (real ZMQ sockets;
the end-to-end case is tests/schedulers/test_failures.py)."""

from __future__ import annotations

import json
import time

import zmq

from notebookos.kernel.held_replies import DELIMITER, HeldReplies

FRONT = b"notebookos-gs-k1"


def _reply(role: str, msg_type: str = "execute_reply", n: int = 1) -> list[bytes]:
    header = {"msg_id": f"r{n}", "msg_type": msg_type, "session": "s", "username": "u",
              "date": "2026-01-01T00:00:00Z", "version": "5.3"}
    metadata = {"notebookos": {"role": role, "replica_id": 1}}
    return [FRONT, DELIMITER, b"sig", json.dumps(header).encode(),
            json.dumps({"msg_id": f"req{n}"}).encode(), json.dumps(metadata).encode(),
            json.dumps({"status": "ok", "execution_count": n}).encode()]


def _send(router: zmq.Socket, held: HeldReplies, frames: list[bytes]) -> None:
    """What the shell ZMQStream does: send, and hand the outcome to its send callback."""
    try:
        status = router.send_multipart(frames)
    except zmq.ZMQError as exc:
        status = exc
    held.on_send(frames, status)


def test_replies_for_an_absent_scheduler_are_delivered_in_order_when_it_connects() -> None:
    context = zmq.Context.instance()
    router = context.socket(zmq.ROUTER)
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    retries: list = []
    held = HeldReplies(router, lambda _delay, call: retries.append(call), retry_s=0.01)
    dealer = context.socket(zmq.DEALER)
    dealer.linger = 0
    try:
        _send(router, held, _reply("executor", n=1))
        _send(router, held, _reply("standby", n=2))  # nobody needs a standby's reply later
        _send(router, held, _reply("executor", msg_type="kernel_info_reply", n=3))
        _send(router, held, _reply("executor", n=4))
        assert len(held) == 2 and len(retries) == 1
        retries.pop()()  # still nobody there: kept, tried again later
        assert len(held) == 2 and len(retries) == 1

        dealer.setsockopt(zmq.IDENTITY, FRONT)
        dealer.connect(f"tcp://127.0.0.1:{port}")
        deadline = time.monotonic() + 10
        while len(held) and time.monotonic() < deadline:
            if retries:
                retries.pop()()
            time.sleep(0.02)
        assert len(held) == 0 and held.delivered_late == 2
        got = []
        while dealer.poll(1000):
            frames = dealer.recv_multipart()
            got.append(json.loads(frames[2])["msg_id"])
        assert got == ["r1", "r4"]
    finally:
        dealer.close(linger=0)
        router.close(linger=0)


def test_replies_that_reached_the_scheduler_are_not_kept() -> None:
    context = zmq.Context.instance()
    router = context.socket(zmq.ROUTER)
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = context.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.setsockopt(zmq.IDENTITY, FRONT)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    retries: list = []
    held = HeldReplies(router, lambda _delay, call: retries.append(call))
    try:
        dealer.send(b"hello")  # the ROUTER learns the peer once it hears from it
        assert router.poll(5000)
        router.recv_multipart()
        _send(router, held, _reply("executor"))
        assert len(held) == 0 and not retries
        assert dealer.poll(5000)
    finally:
        dealer.close(linger=0)
        router.close(linger=0)


def test_a_retry_sooner_than_retry_every_s_sends_nothing() -> None:
    # the front calls retry() on every pass of its loop; the sends are tried once per interval
    from notebookos.unrouted import UnroutedReplies

    context = zmq.Context.instance()
    router = context.socket(zmq.ROUTER)
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    kept = UnroutedReplies(router, keep_s=60, retry_every_s=0.3)
    dealer = context.socket(zmq.DEALER)
    dealer.linger = 0
    try:
        kept.send(_reply("executor"))
        assert len(kept) == 1
        assert kept.retry() is True  # first try: the peer is still absent
        dealer.setsockopt(zmq.IDENTITY, FRONT)
        dealer.connect(f"tcp://127.0.0.1:{port}")
        time.sleep(0.1)  # connected, but the interval has not passed
        assert kept.retry() is True and kept.delivered_late == 0
        time.sleep(0.25)
        assert kept.retry() is False and kept.delivered_late == 1
        assert dealer.poll(1000)
    finally:
        dealer.close(linger=0)
        router.close(linger=0)
