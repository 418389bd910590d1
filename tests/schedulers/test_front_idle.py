"""The client sees one ``idle`` per cell, after its reply (docs/kernel-protocol.md): the front
holds an executor's idle that overtakes its reply, and drops the busy/idle of an attempt whose
election failed (the cell runs again under ``<id>:retry1``). Real ZMQ sockets stand in for the
replicas; tests/schedulers/test_failures.py has the same cases on real replicas."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator

import pytest
import zmq
from fake_replicas import KEY, FakeReplica, FrontHooks
from jupyter_client.session import Session

from notebookos.global_scheduler.front import ALL_YIELDED, KernelFront

pytestmark = pytest.mark.timeout(60)


class _Client:
    def __init__(self, context: zmq.Context, front: KernelFront) -> None:
        self.session = Session(key=KEY.encode())
        self.shell = context.socket(zmq.DEALER)
        self.shell.linger = 0
        self.shell.connect(f"tcp://127.0.0.1:{front.ports['shell_port']}")
        self.iopub = context.socket(zmq.SUB)
        self.iopub.linger = 0
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self.iopub.connect(f"tcp://127.0.0.1:{front.ports['iopub_port']}")

    def execute(self, code: str = "print('hi')") -> str:
        msg = self.session.msg("execute_request", {"code": code, "silent": False})
        self.session.send(self.shell, msg)
        return msg["header"]["msg_id"]

    def _next(self, sock: zmq.Socket, timeout_s: float) -> dict | None:
        if not sock.poll(timeout_s * 1000):
            return None
        _, frames = self.session.feed_identities(sock.recv_multipart())
        return self.session.deserialize(frames)

    def reply(self, timeout_s: float = 5.0) -> dict | None:
        return self._next(self.shell, timeout_s)

    def iopub_messages(self, timeout_s: float) -> list[tuple[str, dict]]:
        """(msg_type, content) of what comes on IOPub within ``timeout_s`` of quiet."""
        seen = []
        while (msg := self._next(self.iopub, timeout_s)) is not None:
            seen.append((msg["msg_type"], msg["content"]))
        return seen

    def close(self) -> None:
        self.shell.close(linger=0)
        self.iopub.close(linger=0)


@pytest.fixture
def cluster() -> Iterator[tuple[KernelFront, FakeReplica, FakeReplica, _Client]]:
    context = zmq.Context.instance()
    executor, standby = FakeReplica(context, 1), FakeReplica(context, 2)
    front = KernelFront("k-idle", KEY, "hmac-sha256", FrontHooks())
    front.yield_hold_s = 0  # the standby gets its yield_request at once
    front.start()
    front.set_replicas([executor.endpoint(), standby.endpoint()], wait=True)
    for r in (executor, standby):
        r.wait_subscribed()
    client = _Client(context, front)
    yield front, executor, standby, client
    client.close()
    front.close()
    for r in (executor, standby):
        r.close()


def _requests(executor: FakeReplica, standby: FakeReplica) -> tuple[dict, dict]:
    run, yielded = executor.receive(), standby.receive()
    assert run is not None and run["header"]["msg_type"] == "execute_request"
    assert yielded is not None and yielded["header"]["msg_type"] == "yield_request"
    return run, yielded


def test_an_idle_that_overtakes_its_reply_reaches_the_client_after_it(cluster) -> None:  # noqa: ANN001
    _, executor, standby, client = cluster
    msg_id = client.execute()
    run, yielded = _requests(executor, standby)
    executor.publish(run, "status", {"execution_state": "busy"})
    executor.publish(run, "stream", {"name": "stdout", "text": "hi\n"})
    executor.publish(run, "status", {"execution_state": "idle"})
    seen = client.iopub_messages(0.5)
    assert ("status", {"execution_state": "idle"}) not in seen, seen  # held: no reply yet
    assert ("stream", {"name": "stdout", "text": "hi\n"}) in seen
    executor.reply(run, "execute_reply", {"status": "ok", "execution_count": 1}, "executor")
    reply = client.reply()
    assert reply is not None and reply["parent_header"]["msg_id"] == msg_id
    assert client.iopub_messages(0.5) == [("status", {"execution_state": "idle"})]
    standby.reply(yielded, "execute_reply", {"status": "ok", "execution_count": 1}, "standby")


def test_a_reply_that_overtakes_its_execute_input_still_says_the_interactivity_delay(
        cluster) -> None:  # noqa: ANN001
    """ipykernel sends IOPub from another thread: the executor's execute_input (where the front
    learns that the cell started) can reach the front after its reply. The delay then comes
    from the reply's own ``metadata.started`` (test_reply_block.py failed in CI on this)."""
    _, executor, standby, client = cluster
    client.execute()
    run, yielded = _requests(executor, standby)
    time.sleep(0.2)  # the cell waits a little before it starts
    started = datetime.datetime.now(datetime.UTC).isoformat()
    executor.reply(run, "execute_reply", {"status": "ok", "execution_count": 1}, "executor",
                   metadata={"started": started})
    reply = client.reply()
    assert reply is not None
    delay = reply["metadata"]["notebookos"]["interactivity_delay_ms"]
    assert 150 <= delay < 5000, delay
    executor.publish(run, "execute_input", {"code": "print('hi')", "execution_count": 1})
    standby.reply(yielded, "execute_reply", {"status": "ok", "execution_count": 1}, "standby")


def test_a_failed_attempts_idle_does_not_end_the_cell(cluster) -> None:  # noqa: ANN001
    """The chosen replica proposed too late: everyone answers all-yielded, the front runs the
    cell again as <id>:retry1; that replica's idle for the failed attempt arrives after the
    front resubmitted it and must not reach the client. The scheduler is told that the first
    id will never start (its arrival, kept, held the kernel busy to hibernation for ever)."""
    front, executor, standby, client = cluster
    msg_id = client.execute()
    run, yielded = _requests(executor, standby)
    executor.publish(run, "status", {"execution_state": "busy"})
    failed = {"status": "error", "ename": ALL_YIELDED, "evalue": "no replica led",
              "traceback": [], "execution_count": None}
    standby.reply(yielded, "execute_reply", failed, "none")
    executor.reply(run, "execute_reply", failed, "none")
    retry, retry_yield = _requests(executor, standby)
    assert retry["header"]["msg_id"] == f"{msg_id}:retry1"
    assert front.hooks.abandoned == [msg_id]
    executor.publish(run, "status", {"execution_state": "idle"})  # the failed attempt's
    seen = client.iopub_messages(0.5)
    assert ("status", {"execution_state": "idle"}) not in seen, seen
    assert client.reply(0.2) is None
    executor.publish(retry, "status", {"execution_state": "busy"})
    executor.publish(retry, "stream", {"name": "stdout", "text": "hi\n"})
    executor.reply(retry, "execute_reply", {"status": "ok", "execution_count": 1}, "executor")
    executor.publish(retry, "status", {"execution_state": "idle"})
    reply = client.reply()
    assert reply is not None and reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "ok"
    seen = client.iopub_messages(0.5)
    assert seen[-2:] == [("stream", {"name": "stdout", "text": "hi\n"}),
                         ("status", {"execution_state": "idle"})], seen
    standby.reply(retry_yield, "execute_reply", {"status": "ok", "execution_count": 1},
                  "standby")
    time.sleep(0.3)
    assert front.hooks.abandoned == [msg_id], "a cell that ran is not abandoned"
