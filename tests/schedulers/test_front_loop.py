"""Every kernel front is served by one loop (global_scheduler/front_loop.py, issue 32): open
fronts add no threads and, idle, set no timer; cells on many fronts at once are each routed to
their own client. The replicas are the scale benchmark's stand-ins (one process for every
kernel's replicas, notebookos/testing/standin_replicas.py), so this also holds them to the
front's protocol the benchmark relies on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest
import zmq
from jupyter_client.session import Session

from notebookos.global_scheduler.front import KernelFront, ReplicaEndpoint
from notebookos.testing.standin_replicas import PlaceOnReplicaOne, kernel_id

pytestmark = pytest.mark.timeout(120)

KERNELS = 40


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.fixture
def standins() -> Iterator[tuple[str, dict]]:
    key = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-m", "notebookos.testing.standin_replicas",
                             "--kernels", str(KERNELS), "--key", key],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield key, json.loads(proc.stdout.readline())
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _open(key: str, ports: dict, k: int) -> KernelFront:
    front = KernelFront(kernel_id(k), key, "hmac-sha256", PlaceOnReplicaOne())
    front.set_replicas([ReplicaEndpoint(int(r), "127.0.0.1", p["shell"], p["iopub"][k],
                                        p["stdin"], p["control"]) for r, p in ports.items()])
    front.start()
    return front


def _client(context: zmq.Context, front: KernelFront) -> tuple[zmq.Socket, zmq.Socket]:
    shell, iopub = context.socket(zmq.DEALER), context.socket(zmq.SUB)
    for sock in (shell, iopub):
        sock.linger = 0
    iopub.setsockopt(zmq.SUBSCRIBE, b"")
    shell.connect(f"tcp://127.0.0.1:{front.ports['shell_port']}")
    iopub.connect(f"tcp://127.0.0.1:{front.ports['iopub_port']}")
    return shell, iopub


def _iopub_until_idle(session: Session, iopub: zmq.Socket, parent_id: str) -> list[str]:
    seen: list[str] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and iopub.poll(int((deadline - time.monotonic()) * 1000)):
        _, frames = session.feed_identities(iopub.recv_multipart())
        msg = session.deserialize(frames)
        if msg["parent_header"].get("msg_id") != parent_id:
            continue
        seen.append(msg["msg_type"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    return seen


def test_many_fronts_share_one_loop_and_rest_when_idle(standins) -> None:  # noqa: ANN001
    key, ports = standins
    context = zmq.Context.instance()
    session = Session(key=key.encode())
    fronts: list[KernelFront] = []
    clients: list[tuple[zmq.Socket, zmq.Socket]] = []
    try:
        fronts += [_open(key, ports, k) for k in range(10)]
        time.sleep(0.5)
        threads_at_10 = _threads()
        fronts += [_open(key, ports, k) for k in range(10, KERNELS)]
        time.sleep(0.5)
        assert _threads() <= threads_at_10, "open fronts added threads"
        assert len({id(f._loop) for f in fronts}) == 1

        for f in fronts:  # the standbys' links rest soon after the cell (front_replicas.py)
            f.lazy_link_idle_s = 0.3
        clients = [_client(context, f) for f in fronts]
        time.sleep(1.0)  # the clients' IOPub subscriptions reach the fronts
        sent = {}
        for n, (shell, _) in enumerate(clients):  # a cell on every kernel at once
            msg = session.msg("execute_request", {"code": f"{n}", "silent": False})
            session.send(shell, msg)
            sent[n] = msg["header"]["msg_id"]
        for n, (shell, iopub) in enumerate(clients):
            assert shell.poll(10_000), f"kernel {n}: no reply"
            _, frames = session.feed_identities(shell.recv_multipart())
            reply = session.deserialize(frames)
            assert reply["parent_header"]["msg_id"] == sent[n]
            assert reply["content"]["status"] == "ok"
            assert reply["metadata"]["notebookos"]["role"] == "executor"
            seen = _iopub_until_idle(session, iopub, sent[n])
            assert seen.count("execute_input") == 1 and seen[-1] == "status", seen
            assert seen.count("status") == 2, seen  # one busy, one idle: the executor's only

        # the first cell's held work is done, and the standbys' links rested: nothing left
        # to time
        time.sleep(1.0)
        assert all(f._tick is None for f in fronts), "an idle front keeps a timer"
        assert all(r.shell is None for f in fronts for rid, r in f._replicas.items()
                   if rid != f.preferred_replica), "an idle front's standbys keep their links"
    finally:
        for shell, iopub in clients:
            shell.close(linger=0)
            iopub.close(linger=0)
        for front in fronts:
            front.close()


def test_a_closed_front_stops_being_watched(standins) -> None:  # noqa: ANN001
    """Its sockets leave the loop before they close: an fd number reused by the next front's
    socket must not reach the closed one's handler (or lose the new one's)."""
    key, ports = standins
    context = zmq.Context.instance()
    session = Session(key=key.encode())
    first = _open(key, ports, 0)
    loop = first._loop
    assert loop is not None
    time.sleep(0.2)  # the loop has taken the front
    watched = set(first._watched_fds.values())
    assert len(watched) == 5 + 3 * 2  # per replica shell and IOPub (control, stdin: on demand)
    first.close()
    assert not watched & set(loop.loop._selector.get_map())  # noqa: SLF001
    second = _open(key, ports, 1)
    shell, iopub = _client(context, second)
    try:
        time.sleep(0.5)
        msg = session.msg("execute_request", {"code": "1", "silent": False})
        session.send(shell, msg)
        assert shell.poll(10_000), "the front opened after a close does not answer"
    finally:
        shell.close(linger=0)
        iopub.close(linger=0)
        second.close()
