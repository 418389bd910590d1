"""A kernel front's five sockets, bound on drawn or given ports, and one set kept bound ahead
for the next kernel (global_scheduler/front_sockets.py)."""

from __future__ import annotations

import concurrent.futures
import time

import pytest
import zmq
from fake_replicas import KEY, FrontHooks
from jupyter_client.session import Session

from notebookos.global_scheduler.front import KernelFront
from notebookos.global_scheduler.front_sockets import (
    FRONT_CHANNELS,
    FrontSockets,
    SpareFrontSockets,
)
from notebookos.ports import bindable, free_ports

pytestmark = pytest.mark.timeout(60)


def _wait_spare(spare: SpareFrontSockets, timeout: float = 10) -> FrontSockets:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        taken = spare.take()
        if taken is not None:
            return taken
        time.sleep(0.02)
    raise AssertionError("no spare front sockets were bound")


def test_sockets_bind_on_given_ports_and_release_them_on_close() -> None:
    ports = dict(zip((f"{n}_port" for n in FRONT_CHANNELS), free_ports(5), strict=True))
    bound = FrontSockets("127.0.0.1", ports)
    assert bound.ports == ports
    assert not any(bindable("127.0.0.1", p) for p in ports.values())
    with pytest.raises(zmq.ZMQError):  # taken: a second set on the same ports is refused
        FrontSockets("127.0.0.1", ports)
    bound.close()
    time.sleep(0.1)  # ZMQ closes listeners on its I/O thread
    assert all(bindable("127.0.0.1", p) for p in ports.values())


def test_a_spare_set_is_bound_ahead_and_a_front_serves_on_it() -> None:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        spare = SpareFrontSockets("127.0.0.1", pool.submit)
        assert spare.take() is None  # nothing bound yet: the first kernel binds its own
        first = _wait_spare(spare)
        second = _wait_spare(spare)  # the take above had the next one bound
        assert set(first.ports.values()).isdisjoint(second.ports.values())
        front = KernelFront("k-spare", KEY, "hmac-sha256", FrontHooks(), starting=True,
                            bound=first)
        front.start()
        client = zmq.Context.instance().socket(zmq.DEALER)
        client.linger = 0
        try:
            assert front.ports == first.ports
            client.connect(f"tcp://127.0.0.1:{front.ports['shell_port']}")
            session = Session(key=KEY.encode())
            session.send(client, "kernel_info_request", {})
            assert client.poll(5000), "the front did not answer on the spare's shell socket"
            _, frames = session.feed_identities(client.recv_multipart())
            assert session.deserialize(frames)["msg_type"] == "kernel_info_reply"
        finally:
            client.close(linger=0)
            front.close()
            second.close()
            spare.close()
        assert spare.take() is None  # closed: nothing more is bound


def test_a_front_given_ports_binds_them_and_closes_the_spare_it_was_offered() -> None:
    spare = FrontSockets("127.0.0.1")
    ports = dict(zip((f"{n}_port" for n in FRONT_CHANNELS), free_ports(5), strict=True))
    front = KernelFront("k-ports", KEY, "hmac-sha256", FrontHooks(), ports=ports, bound=spare)
    try:
        assert front.ports == ports
        assert all(s.closed for s in spare.sockets.values())
    finally:
        front.close()


def test_a_spare_that_cannot_be_bound_is_logged_and_the_next_take_tries_again(
        caplog: pytest.LogCaptureFixture) -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        spare = SpareFrontSockets("192.0.2.1", pool.submit)  # TEST-NET: not this host's
        spare.prepare()
        deadline = time.monotonic() + 10
        while "could not bind a spare kernel front" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.02)
        assert spare.take() is None
        spare.close()
