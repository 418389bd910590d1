"""A cell waiting for placement (GPUs, CommitGpus, a migration's backoff) does not freeze its
kernel's front: placement runs off the front's loop, so kernel_info, the heartbeat and IOPub keep
flowing, and an interrupt withdraws the waiting cells with an ``aborted`` reply (they never run).
The scheduler's side is a hook whose placement blocks until the test lets it go; real ZMQ
sockets stand in for a replica and the client (tests/schedulers/test_gpu_wait.py runs cells that
wait for GPUs on a real cluster)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import zmq
from fake_replicas import KEY, FakeReplica, FrontHooks
from jupyter_client.session import Session

from notebookos.global_scheduler.front import KernelFront

pytestmark = pytest.mark.timeout(60)


class _BlockingHooks(FrontHooks):
    """Placement waits on ``gate`` (as a cell waiting for GPUs does), then picks replica 1."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.placing: list[str] = []
        self.cancelled: list[str] = []

    def place_execute(self, kernel_id: str, msg_id: str, metadata: dict) -> tuple[int, list[int]]:
        self.placing.append(msg_id)
        assert self.gate.wait(30)
        return super().place_execute(kernel_id, msg_id, metadata)

    def cancel_execute(self, kernel_id: str, msg_id: str) -> None:
        self.cancelled.append(msg_id)


class _Client:
    def __init__(self, front: KernelFront) -> None:
        context = zmq.Context.instance()
        self.session = Session(key=KEY.encode())
        self.sockets = {name: context.socket(kind) for name, kind in (
            ("shell", zmq.DEALER), ("control", zmq.DEALER), ("iopub", zmq.SUB),
            ("hb", zmq.REQ))}
        for name, sock in self.sockets.items():
            sock.linger = 0
            sock.connect(f"tcp://127.0.0.1:{front.ports[f'{name}_port']}")
        self.sockets["iopub"].setsockopt(zmq.SUBSCRIBE, b"")

    def send(self, channel: str, msg_type: str, content: dict) -> str:
        msg = self.session.msg(msg_type, content)
        self.session.send(self.sockets[channel], msg)
        return msg["header"]["msg_id"]

    def receive(self, channel: str, timeout_s: float = 5.0) -> dict | None:
        sock = self.sockets[channel]
        if not sock.poll(timeout_s * 1000):
            return None
        _, frames = self.session.feed_identities(sock.recv_multipart())
        return self.session.deserialize(frames)

    def iopub_for(self, parent_id: str, quiet_s: float = 0.5) -> list[dict]:
        got = []
        while (msg := self.receive("iopub", quiet_s)) is not None:
            if msg["parent_header"].get("msg_id") == parent_id:
                got.append(msg)
        return got

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close(linger=0)


@pytest.fixture
def setup() -> Iterator[tuple[KernelFront, _BlockingHooks, FakeReplica, _Client]]:
    hooks = _BlockingHooks()
    replica = FakeReplica(zmq.Context.instance(), 1)
    front = KernelFront("k-waiting", KEY, "hmac-sha256", hooks)
    front.start()
    front.set_replicas([replica.endpoint()], wait=True)
    replica.wait_subscribed()
    client = _Client(front)
    yield front, hooks, replica, client
    hooks.gate.set()
    client.close()
    front.close()
    replica.close()


def test_a_waiting_cell_leaves_the_front_responsive_and_an_interrupt_withdraws_it(setup) -> None:  # noqa: ANN001
    front, hooks, replica, client = setup
    first = client.send("shell", "execute_request", {"code": "train()", "silent": False})
    second = client.send("shell", "execute_request", {"code": "evaluate()", "silent": False})
    deadline = time.monotonic() + 5
    while not hooks.placing and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hooks.placing == [first]  # one at a time, in order: the second waits behind it

    # kernel_info reaches the replica and its reply and IOPub reach the client.
    info = client.send("shell", "kernel_info_request", {})
    asked = replica.receive(timeout_s=2)
    assert asked is not None and asked["header"]["msg_id"] == info
    replica.publish(asked, "status", {"execution_state": "busy"})
    replica.reply(asked, "kernel_info_reply", {"status": "ok"}, "executor")
    reply = client.receive("shell", timeout_s=2)
    assert reply is not None and reply["parent_header"]["msg_id"] == info
    assert [m["content"] for m in client.iopub_for(info)] == [{"execution_state": "busy"}]
    # The heartbeat echoes.
    client.sockets["hb"].send(b"ping")
    assert client.sockets["hb"].poll(2000) and client.sockets["hb"].recv() == b"ping"

    # An interrupt: both waiting cells are answered "aborted" and the replica is interrupted
    # too (a cell may be running there).
    interrupt = client.send("control", "interrupt_request", {})
    aborted = {}
    for _ in range(2):
        reply = client.receive("shell", timeout_s=2)
        assert reply is not None
        aborted[reply["parent_header"]["msg_id"]] = reply
    assert set(aborted) == {first, second}
    for reply in aborted.values():
        assert reply["header"]["msg_type"] == "execute_reply"
        assert reply["content"]["status"] == "aborted"
        assert reply["metadata"]["notebookos"]["withdrawn"] is True
    note = [m for m in client.iopub_for(first) if m["msg_type"] == "stream"]
    assert note and "withdrawn" in note[0]["content"]["text"]
    forwarded = replica.receive("control", timeout_s=2)
    assert forwarded is not None and forwarded["header"]["msg_id"] == interrupt
    assert hooks.cancelled == [first]

    # The withdrawn placement ends later: its GPUs go back, nothing reaches the replica.
    hooks.gate.set()
    deadline = time.monotonic() + 5
    while first not in hooks.released and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hooks.released == [first]
    assert replica.receive(timeout_s=0.5) is None

    # The next cell is placed and sent as usual.
    third = client.send("shell", "execute_request", {"code": "1", "silent": False})
    run = replica.receive(timeout_s=5)
    assert run is not None and run["header"]["msg_id"] == third
    assert run["header"]["msg_type"] == "execute_request"
    assert second not in hooks.placing


class _LostFirstHooks(FrontHooks):
    """The first placement picks replica 2, which the front is not connected to (it was lost
    between the placement and the send); later ones pick replica 1."""

    def place_execute(self, kernel_id: str, msg_id: str, metadata: dict) -> tuple[int, list[int]]:
        self.placed.append(msg_id)
        return (2, [1]) if len(self.placed) == 1 else (1, [0])


def test_a_cell_placed_on_a_replica_lost_meanwhile_is_placed_again() -> None:
    hooks = _LostFirstHooks()
    replica = FakeReplica(zmq.Context.instance(), 1)
    front = KernelFront("k-lost", KEY, "hmac-sha256", hooks)
    front.start()
    client = None
    try:
        front.set_replicas([replica.endpoint()], wait=True)
        replica.wait_subscribed()
        client = _Client(front)
        cell = client.send("shell", "execute_request", {"code": "x + 1", "silent": False})
        run = replica.receive(timeout_s=5)
        assert run is not None and run["header"]["msg_type"] == "execute_request"
        assert run["header"]["msg_id"] == f"{cell}:retry1"
        assert run["metadata"]["gpu_device_ids"] == [0]
        assert hooks.released == [cell]  # replica 2's GPUs went back
        replica.reply(run, "execute_reply", {"status": "ok", "execution_count": 1}, "executor")
        reply = client.receive("shell", timeout_s=5)
        assert reply is not None and reply["content"]["status"] == "ok"
        assert reply["parent_header"]["msg_id"] == cell  # the client sees its own request
    finally:
        if client is not None:
            client.close()
        front.close()
        replica.close()


def test_a_cell_sent_while_the_kernel_has_no_replica_waits_for_the_new_ones() -> None:
    """Every replica lost (a rebuild from the checkpoint, a Global Scheduler restart): the cell
    waits in placement instead of an error reply, and runs on the replicas that come;
    kernel_info is answered meanwhile (the kernel is alive)."""
    hooks = _BlockingHooks()
    replica = FakeReplica(zmq.Context.instance(), 1)
    front = KernelFront("k-rebuilt", KEY, "hmac-sha256", hooks,
                        kernel_info={"implementation": "ipython", "status": "ok"})
    front.start()
    client = None
    try:
        client = _Client(front)
        info = client.send("shell", "kernel_info_request", {})
        reply = client.receive("shell", timeout_s=5)
        assert reply is not None and reply["parent_header"]["msg_id"] == info
        assert reply["content"]["implementation"] == "ipython"
        assert reply["metadata"]["notebookos"] == {"replicas": 0}

        cell = client.send("shell", "execute_request", {"code": "sorted(data)", "silent": False})
        deadline = time.monotonic() + 5
        while not hooks.placing and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hooks.placing == [cell]
        assert client.receive("shell", timeout_s=0.3) is None  # no error: it waits

        front.set_replicas([replica.endpoint()], wait=True)  # the rebuilt group is ready
        replica.wait_subscribed()
        hooks.gate.set()
        run = replica.receive(timeout_s=5)
        assert run is not None and run["header"]["msg_id"] == cell
        assert run["header"]["msg_type"] == "execute_request"
    finally:
        hooks.gate.set()
        if client is not None:
            client.close()
        front.close()
        replica.close()
