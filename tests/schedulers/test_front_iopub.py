"""The kernel front's IOPub after a Global Scheduler restart, with real ZMQ sockets standing in
for two replicas: what arrives before the client subscribes is held and delivered in order, and
for a request the previous instance routed the client sees the executor's busy, output and idle
once, never another replica's."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import zmq
from jupyter_client.session import Session

from notebookos.global_scheduler.front import KernelFront, PlacementFailed, ReplicaEndpoint

pytestmark = pytest.mark.timeout(60)
KEY = uuid.uuid4().hex


class _Hooks:
    def place_execute(self, kernel_id: str, msg_id: str, metadata: dict) -> tuple[int, list[int]]:
        raise PlacementFailed("not used here")

    def release_execute(self, kernel_id: str, msg_id: str) -> None:
        pass

    def execute_finished(self, kernel_id: str, replica_id: int, msg_id: str) -> None:
        pass

    def execute_started(self, kernel_id: str, replica_id: int, msg_id: str) -> None:
        pass


class _Replica:
    """Bound sockets where a replica's would be; IOPub is an XPUB like ipykernel's."""

    def __init__(self, context: zmq.Context, replica_id: int) -> None:
        self.replica_id = replica_id
        self.session = Session(key=KEY.encode(), username=f"replica-{replica_id}")
        self.sockets = {name: context.socket(zmq.ROUTER) for name in ("shell", "control",
                                                                      "stdin")}
        self.sockets["iopub"] = context.socket(zmq.XPUB)
        self.ports = {}
        for name, sock in self.sockets.items():
            sock.linger = 0
            self.ports[name] = sock.bind_to_random_port("tcp://127.0.0.1")

    def endpoint(self) -> ReplicaEndpoint:
        p = self.ports
        return ReplicaEndpoint(self.replica_id, "127.0.0.1", p["shell"], p["iopub"],
                               p["stdin"], p["control"])

    def wait_subscribed(self) -> None:
        assert self.sockets["iopub"].poll(10_000), "the front never subscribed"
        assert self.sockets["iopub"].recv()[:1] == b"\x01"

    def publish(self, parent: dict, msg_type: str, content: dict,
                metadata: dict | None = None) -> str:
        msg = self.session.msg(msg_type, content, parent=parent, metadata=metadata or {})
        self.session.send(self.sockets["iopub"], msg, ident=msg_type.encode())
        return msg["header"]["msg_id"]

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close(linger=0)


@pytest.fixture
def front_and_replicas() -> Iterator[tuple[KernelFront, list[_Replica]]]:
    context = zmq.Context.instance()
    replicas = [_Replica(context, 1), _Replica(context, 2)]
    front = KernelFront("k-front", KEY, "hmac-sha256", _Hooks())
    front.start()
    front.set_replicas([r.endpoint() for r in replicas], wait=True)
    for r in replicas:
        r.wait_subscribed()
    yield front, replicas
    front.close()
    for r in replicas:
        r.close()


def _client(front: KernelFront) -> zmq.Socket:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.linger = 0
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{front.ports['iopub_port']}")
    return sub


def _receive(sub: zmq.Socket, count: int, quiet_s: float = 0.5) -> list[dict]:
    """``count`` messages, then make sure nothing else arrives for ``quiet_s``."""
    session = Session(key=KEY.encode())
    got: list[dict] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not sub.poll(quiet_s * 1000 if len(got) >= count else 100):
            if len(got) >= count:
                break
            continue
        _, frames = session.feed_identities(sub.recv_multipart())
        got.append(session.deserialize(frames))
    return got


def _request() -> dict:
    """The header of an execute_request that a previous Global Scheduler routed."""
    return Session(key=KEY.encode()).msg("execute_request", {"code": "1"})


def test_iopub_waits_for_the_client_and_arrives_in_order(front_and_replicas) -> None:  # noqa: ANN001
    front, (executor, _) = front_and_replicas
    parent = _request()
    sent = [executor.publish(parent, "stream", {"name": "stdout", "text": f"{i}\n"})
            for i in range(5)]
    deadline = time.monotonic() + 10
    while len(front.iopub_held) < 5:  # no client yet: held, not dropped
        assert time.monotonic() < deadline
        time.sleep(0.02)
    sub = _client(front)
    try:
        assert [m["header"]["msg_id"] for m in _receive(sub, 5)] == sent
    finally:
        sub.close()


def test_a_previous_instances_request_shows_the_executors_busy_and_idle_once(
        front_and_replicas) -> None:  # noqa: ANN001
    """A request this front did not route (its replicas flush their backlogs after a restart):
    the replica that publishes for it first is its executor; standbys publish nothing for a
    yield_request, and the other replica's IOPub for it is not forwarded."""
    front, (executor, other) = front_and_replicas
    sub = _client(front)
    try:
        with_output = _request()
        busy = executor.publish(with_output, "status", {"execution_state": "busy"})
        out = executor.publish(with_output, "stream", {"name": "stdout", "text": "out\n"})
        time.sleep(0.3)  # the front learnt the executor from its busy
        other.publish(with_output, "stream", {"name": "stdout", "text": "not this\n"})
        idle = executor.publish(with_output, "status", {"execution_state": "idle"})
        assert [m["header"]["msg_id"] for m in _receive(sub, 3)] == [busy, out, idle]
        silent = _request()  # no output at all: busy and idle still go through, once
        busy = executor.publish(silent, "status", {"execution_state": "busy"})
        idle = executor.publish(silent, "status", {"execution_state": "idle"})
        assert [m["header"]["msg_id"] for m in _receive(sub, 2)] == [busy, idle]
    finally:
        sub.close()
