"""The Global Scheduler's multipart send and receive (notebookos/zmq_frames.py) on real pyzmq
sockets: the same frames as pyzmq's own calls, the same errors, and no enum built per frame
received (issue 36: ``Socket.get(RCVMORE)`` built a ``SocketOption`` per frame, ints included)."""

from __future__ import annotations

import enum
import sys
from collections.abc import Iterator

import pytest
import zmq

from notebookos.zmq_frames import NOBLOCK, recv_frames, send_frames

MESSAGE = [b"ident", b"<IDS|MSG>", b"sig", b'{"msg_type": "status"}', b"{}", b"{}", b""]


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://frames")
    b.connect("inproc://frames")
    yield a, b
    a.close(0)
    b.close(0)
    ctx.term()


def test_frames_round_trip_as_pyzmq_sends_and_reads_them(pair):
    a, b = pair
    send_frames(a, MESSAGE)
    assert recv_frames(b) == MESSAGE
    a.send_multipart(MESSAGE)
    assert recv_frames(b) == MESSAGE
    send_frames(a, [b"one"])
    send_frames(a, [memoryview(b"two"), b"three"])
    assert b.recv_multipart() == [b"one"]
    assert recv_frames(b, NOBLOCK) == [b"two", b"three"]
    with pytest.raises(zmq.Again):
        recv_frames(b, NOBLOCK)


def test_a_received_frame_builds_no_enum(pair):
    """Fails on the code before: one ``SocketOption`` (``EnumType.__call__``) per frame."""
    a, b = pair
    send_frames(a, MESSAGE)
    calls = []

    def watch(frame, event, _arg):  # noqa: ANN001, ANN202
        if event == "call" and frame.f_code is enum.EnumType.__call__.__code__:
            calls.append(frame.f_code.co_name)

    sys.setprofile(watch)
    try:
        frames = recv_frames(b)
    finally:
        sys.setprofile(None)
    assert frames == MESSAGE
    assert calls == []
