"""When the kernel front sends the standbys their ``yield_request``: with the replica that ran
the previous cell as executor, a short cell finishes without them; a longer cell, a lost
executor or an executor that did not run the cell still brings them in. Real ZMQ sockets stand
in for the replicas (the replicas' side of the protocol is tested in tests/kernel)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq
from fake_replicas import KEY, FakeReplica, FrontHooks
from jupyter_client.session import Session

from notebookos.global_scheduler.front import KernelFront
from notebookos.global_scheduler.placement_worker import PlacementPool

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cluster() -> Iterator[tuple[KernelFront, FakeReplica, FakeReplica, zmq.Socket, FrontHooks]]:
    context = zmq.Context.instance()
    executor, standby = FakeReplica(context, 1), FakeReplica(context, 2)
    hooks = FrontHooks()
    front = KernelFront("k-yields", KEY, "hmac-sha256", hooks)
    front.yield_hold_s = 0.5
    front.start()
    front.set_replicas([executor.endpoint(), standby.endpoint()], wait=True)
    for r in (executor, standby):
        r.wait_subscribed()
    client = context.socket(zmq.DEALER)
    client.linger = 0
    client.connect(f"tcp://127.0.0.1:{front.ports['shell_port']}")
    iopub = context.socket(zmq.SUB)  # the front sends requests once a client subscribes
    iopub.linger = 0
    iopub.setsockopt(zmq.SUBSCRIBE, b"")
    iopub.connect(f"tcp://127.0.0.1:{front.ports['iopub_port']}")
    yield front, executor, standby, client, hooks
    for sock in (client, iopub):
        sock.close(linger=0)
    front.close()
    for r in (executor, standby):
        r.close()


def _execute(client: zmq.Socket, code: str = "1") -> str:
    session = Session(key=KEY.encode())
    msg = session.msg("execute_request", {"code": code, "silent": False})
    session.send(client, msg)
    return msg["header"]["msg_id"]


def _client_reply(client: zmq.Socket, timeout_s: float = 5.0) -> dict:
    assert client.poll(timeout_s * 1000), "no reply reached the client"
    session = Session(key=KEY.encode())
    _, frames = session.feed_identities(client.recv_multipart())
    return session.deserialize(frames)


def _first_cell(executor: FakeReplica, standby: FakeReplica, client: zmq.Socket) -> None:
    """No previous executor: both replicas are asked at once."""
    msg_id = _execute(client)
    run = executor.receive()
    assert run is not None and run["header"]["msg_type"] == "execute_request"
    assert run["metadata"]["gpu_device_ids"] == [0]
    yielded = standby.receive(timeout_s=0.3)
    assert yielded is not None and yielded["header"]["msg_type"] == "yield_request"
    assert yielded["header"]["msg_id"] == msg_id
    executor.reply(run, "execute_reply", {"status": "ok", "execution_count": 1}, "executor")
    standby.reply(yielded, "execute_reply", {"status": "ok", "execution_count": 1}, "standby")
    assert _client_reply(client)["parent_header"]["msg_id"] == msg_id


def test_a_short_cell_on_the_previous_executor_never_asks_the_standby(cluster) -> None:  # noqa: ANN001
    front, executor, standby, client, hooks = cluster
    _first_cell(executor, standby, client)
    cells = []
    for n in range(2, 5):
        msg_id = _execute(client)
        cells.append(msg_id)
        run = executor.receive()
        assert run is not None and run["header"]["msg_id"] == msg_id
        executor.reply(run, "execute_reply", {"status": "ok", "execution_count": n}, "executor")
        reply = _client_reply(client)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["execution_count"] == n
    assert standby.receive(timeout_s=front.yield_hold_s + 0.5) is None
    assert hooks.released[1:] == cells  # each cell's GPUs released on its reply


def test_cells_are_placed_one_after_the_other_off_the_loop_on_a_reused_thread(cluster) -> None:  # noqa: ANN001
    """Placement can wait (GPUs, a CommitGpus call), so it runs off the fronts' loop, on the
    placement pool: a thread that is idle takes the next cell (not a new thread per cell, whose
    start the loop waited for on every cell), and no thread is kept per front."""
    front, executor, standby, client, hooks = cluster
    pool = PlacementPool.shared()
    _first_cell(executor, standby, client)
    started = pool.started
    for n in range(2, 6):
        _execute(client)
        run = executor.receive()
        assert run is not None
        executor.reply(run, "execute_reply", {"status": "ok", "execution_count": n}, "executor")
        assert _client_reply(client)["content"]["execution_count"] == n
    threads = hooks.placing_threads
    assert len(threads) == 5
    assert pool.started == started, "a placement thread started for a cell: none was reused"
    assert front._loop is not None and all(t is not front._loop._thread for t in threads)


def test_a_longer_cell_brings_the_standby_in_after_the_hold(cluster) -> None:  # noqa: ANN001
    front, executor, standby, client, _ = cluster
    _first_cell(executor, standby, client)
    sent = time.monotonic()
    msg_id = _execute(client)
    run = executor.receive()
    assert run is not None
    yielded = standby.receive(timeout_s=5)
    assert yielded is not None and yielded["header"]["msg_type"] == "yield_request"
    assert yielded["header"]["msg_id"] == msg_id
    assert time.monotonic() - sent >= front.yield_hold_s - 0.05
    executor.reply(run, "execute_reply", {"status": "ok", "execution_count": 2}, "executor")
    standby.reply(yielded, "execute_reply", {"status": "ok", "execution_count": 2}, "standby")
    assert _client_reply(client)["content"]["execution_count"] == 2
    assert not client.poll(300), "the standby's reply must not reach the client"


def test_losing_the_executor_asks_the_standby_at_once(cluster) -> None:  # noqa: ANN001
    front, executor, standby, client, _ = cluster
    front.yield_hold_s = 30  # only the loss can release the yield in time
    _first_cell(executor, standby, client)
    msg_id = _execute(client)
    assert executor.receive() is not None
    front.set_replicas([standby.endpoint()], wait=True)
    yielded = standby.receive(timeout_s=5)
    assert yielded is not None and yielded["header"]["msg_id"] == msg_id
    failed = {"status": "error", "ename": "NotebookOSExecutorFailed",
              "evalue": "the replica executing this cell stopped responding", "traceback": [],
              "execution_count": 2}
    standby.reply(yielded, "execute_reply", failed, "standby")
    reply = _client_reply(client)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["ename"] == "NotebookOSExecutorFailed"


def test_an_executor_that_did_not_run_the_cell_brings_the_standby_in(cluster) -> None:  # noqa: ANN001
    front, executor, standby, client, _ = cluster
    front.yield_hold_s = 30
    _first_cell(executor, standby, client)
    msg_id = _execute(client)
    run = executor.receive()
    assert run is not None
    executor.reply(run, "execute_reply", {"status": "ok", "execution_count": 2}, "standby")
    yielded = standby.receive(timeout_s=5)  # the front asks who ran it instead of guessing
    assert yielded is not None and yielded["header"]["msg_id"] == msg_id
    assert not client.poll(300), "nothing is forwarded before the replica that ran it answers"
