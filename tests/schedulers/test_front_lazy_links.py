"""A front connects to a replica's control and stdin only when a request needs them, and closes
them once unused: an idle kernel holds two connections per replica in the Global Scheduler, not
four (issue 32: each costs libzmq about 26 KB and two file descriptors). What goes over them
works the same: a control request and its reply, an ``input()`` and its answer, before and after
the links were closed. Real ZMQ sockets stand in for the replicas; the real replica's side of
``input()`` is tested in test_stdin.py."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import psutil
import pytest
import zmq
from fake_replicas import KEY, FakeReplica, FrontHooks
from jupyter_client.session import Session

from notebookos.global_scheduler.front import KernelFront
from notebookos.kernel.stdin_socket import make_patient

pytestmark = pytest.mark.timeout(60)

IDLE_S = 1.5


class Client:
    def __init__(self, context: zmq.Context, front: KernelFront) -> None:
        self.session = Session(key=KEY.encode())
        self.sockets: dict[str, zmq.Socket] = {}
        for name, kind in (("shell", zmq.DEALER), ("control", zmq.DEALER),
                           ("stdin", zmq.DEALER), ("iopub", zmq.SUB)):
            sock = context.socket(kind)
            sock.linger = 0
            if kind == zmq.SUB:
                sock.setsockopt(zmq.SUBSCRIBE, b"")
            else:  # one identity on every channel, as jupyter_client's (stdin is routed by it)
                sock.setsockopt(zmq.IDENTITY, self.session.bsession)
            sock.connect(f"tcp://127.0.0.1:{front.ports[f'{name}_port']}")
            self.sockets[name] = sock

    def send(self, channel: str, msg_type: str, content: dict, parent: dict | None = None
             ) -> str:
        msg = self.session.msg(msg_type, content, parent=parent)
        self.session.send(self.sockets[channel], msg)
        return msg["header"]["msg_id"]

    def receive(self, channel: str, timeout_s: float = 5.0) -> dict:
        sock = self.sockets[channel]
        assert sock.poll(timeout_s * 1000), f"nothing reached the client on {channel}"
        _, frames = self.session.feed_identities(sock.recv_multipart())
        return self.session.deserialize(frames)

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close(linger=0)


@pytest.fixture
def cluster() -> Iterator[tuple[KernelFront, FakeReplica, FakeReplica, Client]]:
    context = zmq.Context.instance()
    # on a loopback address of their own: only this test's front connects there (a socket
    # another test left reconnecting to a port of 127.0.0.1 would be counted otherwise)
    ip = f"127.0.{random.randint(1, 250)}.{random.randint(2, 250)}"
    executor, standby = FakeReplica(context, 1, ip), FakeReplica(context, 2, ip)
    for r in (executor, standby):
        make_patient(r.sockets["stdin"])  # as a real replica's (kernel/app.py)
    front = KernelFront("k-lazy", KEY, "hmac-sha256", FrontHooks())
    front.lazy_link_idle_s = IDLE_S
    front.yield_hold_s = 0
    front.start()
    front.set_replicas([executor.endpoint(), standby.endpoint()], wait=True)
    for r in (executor, standby):
        r.wait_subscribed()
    client = Client(context, front)
    time.sleep(0.3)  # the client's IOPub subscription reaches the front
    yield front, executor, standby, client
    client.close()
    front.close()
    for r in (executor, standby):
        r.close()


def connections_to(replica: FakeReplica, channel: str) -> int:
    """This process's established TCP connections to the replica's ``channel`` port (the front
    runs in this process)."""
    port = replica.ports[channel]
    return sum(1 for c in psutil.Process().net_connections(kind="tcp")
               if c.raddr and (c.raddr.ip, c.raddr.port) == (replica.ip, port)
               and c.status == psutil.CONN_ESTABLISHED)


def wait_connections(replica: FakeReplica, channel: str, count: int, timeout_s: float = 5
                     ) -> None:
    deadline = time.monotonic() + timeout_s
    while connections_to(replica, channel) != count:
        assert time.monotonic() < deadline, \
            f"{channel} of replica {replica.replica_id}: {connections_to(replica, channel)} " \
            f"connections, not {count}"
        time.sleep(0.05)


def test_an_idle_kernel_holds_shell_and_iopub_connections_only(cluster) -> None:  # noqa: ANN001
    _, executor, standby, _ = cluster
    for r in (executor, standby):
        wait_connections(r, "shell", 1)
        wait_connections(r, "iopub", 1)
        assert connections_to(r, "control") == 0
        assert connections_to(r, "stdin") == 0


def _control_round_trip(replicas: tuple[FakeReplica, ...], client: Client) -> None:
    msg_id = client.send("control", "kernel_info_request", {})
    poller = zmq.Poller()
    for r in replicas:
        poller.register(r.sockets["control"], zmq.POLLIN)
    ready = dict(poller.poll(5000))
    assert ready, "no replica got the control request"
    replica = next(r for r in replicas if r.sockets["control"] in ready)
    request = replica.receive("control")
    assert request is not None
    assert request["header"]["msg_id"] == msg_id
    replica.session.send(replica.sockets["control"], "kernel_info_reply",
                         {"status": "ok", "protocol_version": "5.3"}, parent=request,
                         ident=request["idents"])
    reply = client.receive("control")
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["msg_type"] == "kernel_info_reply"


def test_a_control_request_connects_control_and_the_idle_link_is_closed_then_reopened(
        cluster) -> None:  # noqa: ANN001
    _, executor, standby, client = cluster
    _control_round_trip((executor, standby), client)
    assert connections_to(executor, "control") + connections_to(standby, "control") == 1
    for r in (executor, standby):  # nothing in flight, unused for IDLE_S: closed
        wait_connections(r, "control", 0, timeout_s=IDLE_S + 3)
    _control_round_trip((executor, standby), client)  # and opened again when needed


def _cell_reading_input(executor: FakeReplica, standby: FakeReplica, client: Client,
                        answer: str) -> None:
    msg_id = client.send("shell", "execute_request",
                         {"code": "input()", "silent": False, "allow_stdin": True})
    run = executor.receive("shell")
    assert run is not None and run["header"]["msg_type"] == "execute_request"
    # the executor asks at once: its stdin send waits for the front's connection
    executor.session.send(executor.sockets["stdin"], "input_request",
                          {"prompt": "? ", "password": False}, parent=run, ident=run["idents"])
    request = client.receive("stdin")
    assert request["msg_type"] == "input_request"
    client.send("stdin", "input_reply", {"value": answer}, parent=request)
    got = executor.receive("stdin")
    assert got is not None and got["content"]["value"] == answer
    assert connections_to(standby, "stdin") == 0  # only the executor can ask for input
    executor.reply(run, "execute_reply", {"status": "ok", "execution_count": 1}, "executor")
    yielded = standby.receive("shell")
    assert yielded is not None and yielded["header"]["msg_type"] == "yield_request"
    standby.reply(yielded, "execute_reply", {"status": "ok", "execution_count": 1}, "standby")
    assert client.receive("shell")["parent_header"]["msg_id"] == msg_id


def test_input_reaches_the_client_through_a_stdin_link_made_for_the_cell(cluster) -> None:  # noqa: ANN001
    _, executor, standby, client = cluster
    _cell_reading_input(executor, standby, client, "ada")
    assert connections_to(executor, "stdin") == 1
    wait_connections(executor, "stdin", 0, timeout_s=IDLE_S + 3)
    _cell_reading_input(executor, standby, client, "grace")


def test_links_stay_while_a_request_is_in_flight(cluster) -> None:  # noqa: ANN001
    _, executor, standby, client = cluster
    client.send("control", "interrupt_request", {})  # to every replica
    for r in (executor, standby):
        assert r.receive("control") is not None  # asked, not answered
    time.sleep(IDLE_S + 0.8)
    assert connections_to(executor, "control") == 1
    assert connections_to(standby, "control") == 1


def _plain_cell(front: KernelFront, executor: FakeReplica, standby: FakeReplica,
                client: Client, output: str | None = None) -> None:
    """A cell run by ``executor`` (the placement's choice), yielded by ``standby``; with
    ``output``, the executor prints it and the client must see it."""
    msg_id = client.send("shell", "execute_request", {"code": "print()", "silent": False})
    run = executor.receive("shell")
    assert run is not None and run["header"]["msg_type"] == "execute_request"
    if output is not None:
        # A real replica holds its IOPub until the front's subscription arrives
        # (kernel/iopub.py); this one's XPUB may not report it (the old connection's end and
        # the new one's subscription can cancel out), so it gives the subscription time.
        time.sleep(0.3)
        executor.publish(run, "stream", {"name": "stdout", "text": output})
    executor.reply(run, "execute_reply", {"status": "ok", "execution_count": 1}, "executor")
    yielded = standby.receive("shell")
    assert yielded is not None and yielded["header"]["msg_type"] == "yield_request"
    standby.reply(yielded, "execute_reply", {"status": "ok", "execution_count": 1}, "standby")
    seen = []
    while True:
        if output is not None and output not in seen:
            msg = client.receive("iopub")
            if msg["msg_type"] == "stream":
                seen.append(msg["content"]["text"])
            continue
        reply = client.receive("shell")
        assert reply["parent_header"]["msg_id"] == msg_id
        return


def test_an_idle_kernels_standbys_rest_and_link_again_for_the_next_cell(cluster) -> None:  # noqa: ANN001
    front, executor, standby, client = cluster
    _plain_cell(front, executor, standby, client)
    # idle: the standby's shell and IOPub close; the executor keeps its own (the output of a
    # thread its cell started still reaches the client)
    wait_connections(standby, "shell", 0, timeout_s=IDLE_S + 3)
    wait_connections(standby, "iopub", 0)
    assert connections_to(executor, "shell") == 1 and connections_to(executor, "iopub") == 1
    _plain_cell(front, executor, standby, client)  # its yield goes over a new link
    wait_connections(standby, "shell", 1)
    wait_connections(standby, "iopub", 1)


def test_a_resting_standby_chosen_to_run_a_cell_reaches_the_client(cluster) -> None:  # noqa: ANN001
    front, executor, standby, client = cluster
    _plain_cell(front, executor, standby, client)
    wait_connections(standby, "iopub", 0, timeout_s=IDLE_S + 3)
    front.hooks.place_execute = lambda kernel_id, msg_id, metadata: (2, [0])
    _plain_cell(front, standby, executor, client, output="from the standby\n")
