"""The replica's stdout/stderr (kernel/iostream.py): output still arrives, in order, and an empty
flush no longer waits for a round trip through the IOPub thread."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq
from ipykernel.iostream import IOPubThread
from jupyter_client.session import Session

from notebookos.kernel.iostream import ReplicaOutStream

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def stream() -> Iterator[tuple[ReplicaOutStream, zmq.Socket, Session, list]]:
    context = zmq.Context()
    pub = context.socket(zmq.XPUB)
    pub.linger = 0
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    session = Session(key=b"k")
    thread = IOPubThread(pub, pipe=False, session=session)
    thread.start()
    scheduled: list = []
    schedule = thread.schedule

    def counting_schedule(f) -> None:  # noqa: ANN001 - a spy: the real schedule still runs
        scheduled.append(f)
        schedule(f)

    thread.schedule = counting_schedule
    sub = context.socket(zmq.SUB)
    sub.linger = 0
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    out = ReplicaOutStream(session, thread, "stdout", watchfd=False)
    time.sleep(0.3)  # the subscription reaches the XPUB
    yield out, sub, session, scheduled
    out.close()
    thread.stop()
    thread.close()
    sub.close()
    context.term()


def _texts(sub: zmq.Socket, session: Session, timeout: float = 5) -> list[str]:
    texts = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not sub.poll(100):
            if texts:
                break
            continue
        _idents, frames = session.feed_identities(sub.recv_multipart())
        msg = session.deserialize(frames)
        if msg["msg_type"] == "stream":
            texts.append(msg["content"]["text"])
    return texts


def test_written_output_is_flushed_and_arrives_in_order(stream):
    out, sub, session, _scheduled = stream
    out.write("one\n")
    out.flush()
    out.write("two\n")
    out.flush()
    assert "".join(_texts(sub, session)) == "one\ntwo\n"


def test_an_empty_flush_does_not_wait_for_the_iopub_thread(stream):
    out, sub, session, scheduled = stream
    out.write("x\n")
    out.flush()
    before = len(scheduled)
    assert before > 0  # a flush with output goes through the IOPub thread
    for _ in range(100):
        out.flush()
    assert len(scheduled) == before  # nothing to send, nothing scheduled, no waiting
    assert "".join(_texts(sub, session)) == "x\n"


def test_a_standby_writes_nothing_to_iopub_under_a_yield_request(stream, capfd) -> None:  # noqa: ANN001
    """What a standby writes while it handles a cell that another replica runs (its parent is
    the cell's ``yield_request`` copy) goes to the replica's log, never to IOPub: the Global
    Scheduler's front takes a replica that publishes a cell's output for its executor, and the
    cell then never replied. The executor's own output still flows."""
    out, sub, session, _scheduled = stream
    out.set_parent(session.msg("yield_request", {"code": "x = 1"}))
    out.write("a warning while applying the state\n")
    out.flush()
    out.set_parent(session.msg("execute_request", {"code": "print(2)"}))
    out.write("the cell's own output\n")
    out.flush()
    assert _texts(sub, session) == ["the cell's own output\n"]
    assert "a warning while applying the state" in capfd.readouterr().err
