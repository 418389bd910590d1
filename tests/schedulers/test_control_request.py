"""The Global Scheduler's control exchange with a replica (membership changes) gives up as soon
as its caller says no answer can come, instead of waiting out its timeout: after a second fault
while a replacement joins, each wait held the rebuild back 30 s (the fault campaign's double
faults took 55 s)."""

from __future__ import annotations

import time

import pytest
import zmq

from notebookos.global_scheduler.control import ControlError, control_request
from notebookos.global_scheduler.front import ReplicaEndpoint


@pytest.fixture
def silent_replica():  # noqa: ANN201 - yields an endpoint
    """A control socket that takes requests and never answers (a replica whose group cannot
    commit the change)."""
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    try:
        yield ReplicaEndpoint(7, "127.0.0.1", 0, 0, 0, port), sock
    finally:
        sock.close(linger=0)


def test_a_hopeless_request_ends_when_its_caller_gives_up(silent_replica) -> None:  # noqa: ANN001
    endpoint, sock = silent_replica
    lost_at = time.monotonic() + 0.5
    started = time.monotonic()
    with pytest.raises(ControlError, match="the group lost its Raft majority"):
        control_request(endpoint, "key", "hmac-sha256", "remove_replica_request",
                        {"replica_id": 2}, timeout_s=30,
                        give_up=lambda: "the group lost its Raft majority"
                        if time.monotonic() >= lost_at else None)
    assert time.monotonic() - started < 5
    assert sock.poll(1000)  # the request did reach the replica


def test_without_a_reason_to_give_up_it_waits_its_timeout(silent_replica) -> None:  # noqa: ANN001
    endpoint, _ = silent_replica
    started = time.monotonic()
    with pytest.raises(ControlError, match="did not answer"):
        control_request(endpoint, "key", "hmac-sha256", "remove_replica_request",
                        {"replica_id": 2}, timeout_s=1.0, give_up=lambda: None)
    assert time.monotonic() - started >= 1.0
