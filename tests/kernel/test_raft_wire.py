"""Raft's wire encoding (kernel/raft_wire.py): a replica's small Raft messages travel as the
pickle pysyncobj makes, not zlib-compressed (issue 36: compressing them cost a quarter of a
trivial cell's Raft CPU and made none smaller); large ones are still compressed, and a reader
takes both. pysyncobj's own TcpConnection over a socket pair, and a group of RaftLogs on
loopback."""

from __future__ import annotations

import socket
import struct
import threading
import zlib

from pysyncobj import pickle as raft_pickle
from pysyncobj.poller import createPoller
from pysyncobj.tcp_connection import TcpConnection

from notebookos.kernel import raft_wire
from notebookos.kernel.raft_log import RaftLog
from notebookos.kernel.records import LEAD, Completion, Proposal
from notebookos.ports import free_ports

APPEND = {"type": "append_entries", "term": 3, "commit_index": 120, "prevLogIdx": 120,
          "prevLogTerm": 3, "entries": [(b"\x01" + raft_pickle.dumps(
              Proposal("0f" * 16 + "_1_1", 0, LEAD)), 121, 3)]}


def _connected_pair() -> tuple[TcpConnection, socket.socket, list]:
    """pysyncobj's connection on one end of a socket pair (no cipher), the raw other end."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    received: list = []
    conn = TcpConnection(createPoller("auto"), onMessageReceived=received.append, socket=ours)
    return conn, theirs, received


def _frame(payload: bytes) -> bytes:
    return struct.pack("i", len(payload)) + payload


def test_a_replica_sends_a_small_raft_message_unzipped():
    """Fails on the code before: pysyncobj compressed every message with zlib."""
    addresses = [f"127.0.0.1:{p}" for p in free_ports(3)]
    log = RaftLog(addresses[0], addresses[1:], {1: addresses[0]}, b"key",
                  on_commit=lambda *_: None, rest=None)  # a replica's Raft log installs it
    try:
        conn, theirs, _ = _connected_pair()
        conn.send(APPEND)
        (length,) = struct.unpack("i", theirs.recv(4))
        payload = theirs.recv(length)
        assert payload == raft_pickle.dumps(APPEND)
        assert raft_pickle.loads(payload) == APPEND
    finally:
        log.close()


def test_a_large_message_is_still_compressed():
    raft_wire.install()
    big = {"type": "append_entries", "entries": [(b"\x01" + b"state " * 10_000, 5, 1)]}
    conn, theirs, _ = _connected_pair()
    conn.send(big)
    (length,) = struct.unpack("i", theirs.recv(4))
    payload = b""
    while len(payload) < length:
        payload += theirs.recv(length - len(payload))
    assert length < len(raft_pickle.dumps(big)) // 10
    assert raft_pickle.loads(zlib.decompress(payload)) == big


def test_a_reader_takes_compressed_and_plain_messages():
    """A message zlib-compressed (any size, as pysyncobj sends it) and a plain pickle, one
    after the other on one connection, both arrive."""
    raft_wire.install()
    conn, theirs, received = _connected_pair()
    small = {"type": "next_node_idx", "next_node_idx": 122, "reset": False, "success": True}
    theirs.sendall(_frame(zlib.compress(raft_pickle.dumps(small), 3))
                   + _frame(raft_pickle.dumps(APPEND)))
    conn._TcpConnection__processConnection(conn.fileno(), 1)  # POLL_EVENT_TYPE.READ
    assert received == [small, APPEND]


def test_the_codec_tells_pickles_from_zlib_streams():
    codec = raft_wire.WireCodec
    for level in range(10):  # whatever the level, a zlib stream never starts like a pickle
        assert zlib.compress(b"x", level)[:1] != b"\x80"
    plain = raft_pickle.dumps(APPEND)
    assert codec.compress(plain, 3) is plain
    assert codec.decompress(plain) is plain
    assert codec.decompress(zlib.compress(plain, 3)) == plain
    large = raft_pickle.dumps(b"y" * raft_wire.RAW_UP_TO)
    assert codec.decompress(codec.compress(large, 3)) == large
    assert codec.compress(large, 3) != large


def test_a_group_commits_small_and_large_records():
    addresses = [f"127.0.0.1:{p}" for p in free_ports(3)]
    members = {i + 1: a for i, a in enumerate(addresses)}
    seen: list[list] = [[], [], []]
    logs = [RaftLog(a, [b for b in addresses if b != a], members, b"key",
                    on_commit=lambda record, _a, s=s: s.append(record), quick_start=True,
                    rest=None)
            for a, s in zip(addresses, seen, strict=True)]
    try:
        records = [Proposal("e1", 1, LEAD),
                   Completion("e1", 1, "ok", b"\x00update" * 5000)]  # compressed on the wire
        for record in records:
            done = threading.Event()
            logs[0].propose(record, on_done=lambda ok, _why, d=done: ok and d.set())
            assert done.wait(15), f"{type(record).__name__} did not commit"
        deadline = threading.Event()
        for _ in range(300):
            if all(s == records for s in seen):
                break
            deadline.wait(0.02)
        assert all(s == records for s in seen), [len(s) for s in seen]
    finally:
        for log in logs:
            log.close()
