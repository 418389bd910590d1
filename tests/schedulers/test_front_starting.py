"""A kernel's front bound before its replicas are ready (``StartKernel`` with
``return_when_bound``, what Jupyter's provisioner asks for): it answers kernel_info at once,
holds every other request and sends them, in order, once the replicas are connected; if they
never come, each held request gets an error reply that says why. Real ZMQ sockets stand in for
the replicas and for the client (tests/jupyter covers the whole stack, in a browser too)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq
from fake_replicas import KEY, FakeReplica, FrontHooks
from jupyter_client.session import Session

from notebookos.global_scheduler.front import GS_USERNAME, START_FAILED, KernelFront

pytestmark = pytest.mark.timeout(60)


class _Client:
    """A client as jupyter_client connects one: shell DEALER and IOPub SUB."""

    def __init__(self, front: KernelFront) -> None:
        context = zmq.Context.instance()
        self.session = Session(key=KEY.encode())
        self.shell = context.socket(zmq.DEALER)
        self.iopub = context.socket(zmq.SUB)
        for sock in (self.shell, self.iopub):
            sock.linger = 0
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self.shell.connect(f"tcp://127.0.0.1:{front.ports['shell_port']}")
        self.iopub.connect(f"tcp://127.0.0.1:{front.ports['iopub_port']}")

    def send(self, msg_type: str, content: dict) -> str:
        msg = self.session.msg(msg_type, content)
        self.session.send(self.shell, msg)
        return msg["header"]["msg_id"]

    def reply(self, timeout_s: float = 5.0) -> dict | None:
        if not self.shell.poll(timeout_s * 1000):
            return None
        _, frames = self.session.feed_identities(self.shell.recv_multipart())
        return self.session.deserialize(frames)

    def iopub_messages(self, quiet_s: float = 0.3) -> list[dict]:
        """What reached the client's IOPub, until nothing more comes for ``quiet_s``."""
        got = []
        while self.iopub.poll(quiet_s * 1000):
            _, frames = self.session.feed_identities(self.iopub.recv_multipart())
            got.append(self.session.deserialize(frames))
        return got

    def close(self) -> None:
        self.shell.close(linger=0)
        self.iopub.close(linger=0)


@pytest.fixture
def starting() -> Iterator[tuple[KernelFront, FrontHooks, _Client]]:
    hooks = FrontHooks()
    front = KernelFront("k-starting", KEY, "hmac-sha256", hooks, starting=True)
    front.start()
    client = _Client(front)
    yield front, hooks, client
    client.close()
    front.close()


def test_kernel_info_is_answered_at_once_and_cells_wait_for_the_replicas(starting) -> None:  # noqa: ANN001
    front, hooks, client = starting
    sent = time.monotonic()
    info_id = client.send("kernel_info_request", {})
    info = client.reply()
    assert info is not None and info["parent_header"]["msg_id"] == info_id
    assert time.monotonic() - sent < 1.0
    assert info["content"]["status"] == "ok"
    assert info["content"]["language_info"]["name"] == "python"
    assert info["metadata"]["notebookos"]["starting"] is True

    cells = [client.send("execute_request", {"code": f"x = {n}", "silent": False})
             for n in range(3)]
    assert client.reply(timeout_s=0.5) is None, "a cell must wait for the replicas, not fail"
    assert hooks.placed == []

    replica = FakeReplica(zmq.Context.instance(), 1)
    try:
        front.set_replicas([replica.endpoint()], wait=True)
        replica.wait_subscribed()
        # What a replica held until the front subscribed: the busy and idle of the Global
        # Scheduler's readiness check (its own kernel_info_request). No client asked for it.
        probe = Session(key=KEY.encode(), username=GS_USERNAME).msg("kernel_info_request", {})
        for state in ("busy", "idle"):
            replica.publish(probe, "status", {"execution_state": state})
        front.replicas_ready()
        for n, msg_id in enumerate(cells):  # in the order the client sent them
            run = replica.receive()
            assert run is not None and run["header"]["msg_id"] == msg_id
            assert run["header"]["msg_type"] == "execute_request"
            assert run["content"]["code"] == f"x = {n}"
            replica.reply(run, "execute_reply", {"status": "ok", "execution_count": n + 1},
                          "executor")
            reply = client.reply()
            assert reply is not None and reply["parent_header"]["msg_id"] == msg_id
            assert reply["content"]["status"] == "ok"
            # The reply says the cell waited for the replicas to start (issue 16).
            block = reply["metadata"]["notebookos"]
            assert block["waited_for"] == "replicas starting", block
            assert block["waited_ms"] >= 400 and "starting" in block["wait_reason"]
            assert block["gpu_device_ids"] == [0]
        assert hooks.placed == cells
        parents = {m["parent_header"].get("msg_id") for m in client.iopub_messages()}
        assert probe["header"]["msg_id"] not in parents
        assert info_id in parents
        # Once ready, kernel_info goes to a replica like any other request.
        later = client.send("kernel_info_request", {})
        asked = replica.receive()
        assert asked is not None and asked["header"]["msg_id"] == later
    finally:
        replica.close()


def test_held_requests_fail_with_the_reason_when_the_replicas_never_come(starting) -> None:  # noqa: ANN001
    front, hooks, client = starting
    cell = client.send("execute_request", {"code": "1", "silent": False})
    complete = client.send("complete_request", {"code": "im", "cursor_pos": 2})
    assert client.reply(timeout_s=0.3) is None
    front.start_failed("no host could start a replica: host-1: out of memory")
    replies = {r["parent_header"]["msg_id"]: r for r in (client.reply(), client.reply())}
    assert set(replies) == {cell, complete}
    for reply in replies.values():
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == START_FAILED
        assert "host-1: out of memory" in reply["content"]["evalue"]
    assert replies[cell]["header"]["msg_type"] == "execute_reply"
    # A request after the failure is answered the same way, never left hanging.
    again = client.send("execute_request", {"code": "2", "silent": False})
    reply = client.reply()
    assert reply is not None and reply["parent_header"]["msg_id"] == again
    assert reply["content"]["ename"] == START_FAILED
    assert hooks.placed == []


def test_a_client_attaching_is_seen_and_a_close_releases_whoever_waits_for_one() -> None:
    """The replicas of a kernel started behind its front wait for ``client_attached``."""
    for attach in ("iopub", "shell", None):
        front = KernelFront(f"k-attach-{attach}", KEY, "hmac-sha256", FrontHooks(),
                            starting=True)
        front.start()
        sock = None
        try:
            assert not front.client_attached.wait(0.3)
            if attach is None:
                front.close()
            else:
                sock = zmq.Context.instance().socket(zmq.SUB if attach == "iopub" else zmq.DEALER)
                sock.linger = 0
                sock.connect(f"tcp://127.0.0.1:{front.ports[f'{attach}_port']}")
                if attach == "iopub":
                    sock.setsockopt(zmq.SUBSCRIBE, b"")
                else:
                    Session(key=KEY.encode()).send(sock, "kernel_info_request", {})
            assert front.client_attached.wait(5), attach
        finally:
            if sock is not None:
                sock.close(linger=0)
            front.close()
