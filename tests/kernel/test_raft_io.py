"""Raft's socket reads (kernel/raft_io.py): a message that arrives on a connected peer's socket
costs one ``recv`` and no ``getsockopt(SO_ERROR)``, and a proposal's wake-up one pipe read (issue
36: pysyncobj made two ``getsockopt`` calls and a ``recv`` that failed with EAGAIN per message,
and read its notifier pipe until EAGAIN). pysyncobj's own TcpConnection on a real socket (a
``socket.socket`` subclass that counts its calls), and a group of RaftLogs on loopback under
strace."""

from __future__ import annotations

import json
import shutil
import socket
import struct
import subprocess
import sys
import textwrap

import pytest
from pysyncobj import pickle as raft_pickle
from pysyncobj.poller import POLL_EVENT_TYPE, createPoller
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection

from notebookos.kernel import raft_io, raft_wire

MESSAGE = {"type": "next_node_idx", "next_node_idx": 122, "reset": False, "success": True}


class CountingSocket(socket.socket):
    """A real socket that counts the calls pysyncobj's connection makes on it."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.calls = {"recv": 0, "getsockopt": 0}

    def recv(self, *args):  # noqa: ANN002, ANN201
        self.calls["recv"] += 1
        return super().recv(*args)

    def getsockopt(self, *args):  # noqa: ANN002, ANN201
        self.calls["getsockopt"] += 1
        return super().getsockopt(*args)


def _connected(recv_size: int = 2 ** 16) -> tuple[TcpConnection, CountingSocket, socket.socket,
                                                  list]:
    raft_wire.install()  # a replica's codec: the plain pickles below are read as they are
    a, theirs = socket.socketpair()
    ours = CountingSocket(a.family, a.type, a.proto, fileno=a.detach())
    ours.setblocking(False)
    received: list = []
    conn = TcpConnection(createPoller("auto"), onMessageReceived=received.append, socket=ours,
                         recvBufferSize=recv_size)
    return conn, ours, theirs, received


def _frame(message: dict) -> bytes:
    payload = raft_pickle.dumps(message)
    return struct.pack("i", len(payload)) + payload


def _read_event(conn: TcpConnection) -> None:
    conn._TcpConnection__processConnection(conn.fileno(), POLL_EVENT_TYPE.READ)


def test_a_message_costs_one_recv_and_no_sockopt_query():
    """Fails on the code before: 2 recv (the second EAGAIN) and 2 getsockopt a message."""
    raft_io.install()
    conn, ours, theirs, received = _connected()
    for n in range(1, 4):
        theirs.sendall(_frame(MESSAGE))
        _read_event(conn)
        assert received == [MESSAGE] * n
    assert ours.calls == {"recv": 3, "getsockopt": 0}


def test_a_message_larger_than_a_read_arrives_whole():
    """A full read reads again, as pysyncobj does: 20 messages through a 64-byte buffer."""
    raft_io.install()
    conn, ours, theirs, received = _connected(recv_size=64)
    theirs.sendall(_frame(MESSAGE) * 20)
    _read_event(conn)
    assert received == [MESSAGE] * 20
    assert conn.state == CONNECTION_STATE.CONNECTED


def test_a_closed_or_failed_peer_still_disconnects():
    """A peer's last message, then its close: the message is read (a read shorter than the
    buffer ends the first event) and the close seen on the next event. (pysyncobj read both in
    one event and dropped the message with the buffer when it disconnected: Raft takes either.)"""
    raft_io.install()
    conn, _ours, theirs, received = _connected()
    theirs.sendall(_frame(MESSAGE))
    theirs.close()
    _read_event(conn)
    _read_event(conn)
    assert received == [MESSAGE]
    assert conn.state == CONNECTION_STATE.DISCONNECTED
    conn, _ours, theirs, _ = _connected()
    conn._TcpConnection__processConnection(conn.fileno(), POLL_EVENT_TYPE.ERROR)
    assert conn.state == CONNECTION_STATE.DISCONNECTED


GROUP = textwrap.dedent("""
    import sys, threading
    from notebookos.kernel.raft_log import RaftLog
    from notebookos.kernel.records import LEAD, Proposal
    from notebookos.ports import free_ports

    addresses = [f"127.0.0.1:{p}" for p in free_ports(3)]
    members = {i + 1: a for i, a in enumerate(addresses)}
    logs = [RaftLog(a, [b for b in addresses if b != a], members, b"key",
                    on_commit=lambda *_: None, quick_start=True, rest=None)
            for a in addresses]
    for n in range(int(sys.argv[1])):
        done = threading.Event()
        logs[0].propose(Proposal(f"e{n}", n, LEAD), on_done=lambda ok, _why: ok and done.set())
        assert done.wait(15)
    for log in logs:
        log.close()
""")


def _strace_counts(out: str) -> dict[str, tuple[int, int]]:
    counts = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[-1].isidentifier() and parts[3].isdigit():
            errors = int(parts[4]) if len(parts) == 6 else 0
            counts[parts[-1]] = (int(parts[3]), errors)
    return counts


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_groups_messages_make_no_failed_reads_or_sockopt_queries(tmp_path):
    """Three RaftLogs (one process, under strace from its start), 200 records: each is 4
    messages out of the leader and 4 answers in, and a proposal's wake-up. Fails on the code
    before: 2 getsockopt and an EAGAIN recv per message (~3000 and ~1500), an EAGAIN pipe read
    per wake-up, and a getrandom (the message's nonce) per message sent."""
    records = 200
    out = tmp_path / "strace.txt"
    subprocess.run(["strace", "-f", "-c", "-o", str(out),
                    "-e", "trace=recvfrom,getsockopt,read,sendto,getrandom",
                    sys.executable, "-c", GROUP, str(records)], check=True, timeout=120)
    counts = _strace_counts(out.read_text())
    print(json.dumps(counts))
    sends = counts["sendto"][0]
    assert sends >= 6 * records  # the messages went by these sockets
    # a few from connecting (SO_ERROR tells a refused connect) and from the start
    assert counts.get("getsockopt", (0, 0))[0] < records // 10
    assert counts["recvfrom"][1] < records // 10  # reads that failed with EAGAIN
    assert counts.get("read", (0, 0))[1] < records // 10
    # nonces drawn 64 at a time (raft_crypto.py), not a getrandom per message sent
    assert counts.get("getrandom", (0, 0))[0] < sends // 20
