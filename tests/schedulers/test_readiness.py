"""The Global Scheduler's wait for new replicas to answer (global_scheduler/readiness.py).

It wakes for a reply, a reported exit, a resend or its deadline, and for nothing else: it used to
wake every 100 ms to ask whether each replica still lived (issue 32: timers, not polling).
Stand-in replicas here are bare ZMQ ROUTER sockets speaking the Jupyter protocol with
jupyter_client's own Session.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import zmq
from jupyter_client.session import Session

from notebookos.global_scheduler import readiness
from notebookos.global_scheduler.front import ReplicaEndpoint
from notebookos.global_scheduler.loop_waits import LoopSignal

KEY = "readiness-test-key"


class StandInShell:
    """A replica's shell socket that answers ``kernel_info_request`` from the ``answer_from``th
    request on (0: never), after sending a ``status`` message that is not the answer."""

    def __init__(self, answer_from: int) -> None:
        self.answer_from = answer_from
        self.requests = 0
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self.session = Session(key=KEY.encode(), signature_scheme="hmac-sha256")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def endpoint(self, replica_id: int) -> ReplicaEndpoint:
        return ReplicaEndpoint(replica_id, "127.0.0.1", self.port, 0, 0, 0, "host-a")

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(50):
                continue
            idents, msg = self.session.recv(self.socket, mode=0)
            if msg is None or msg["header"]["msg_type"] != "kernel_info_request":
                continue
            self.requests += 1
            if self.answer_from and self.requests >= self.answer_from:
                self.session.send(self.socket, "status", {"execution_state": "busy"},
                                  ident=idents)
                self.session.send(self.socket, "kernel_info_reply",
                                  {"status": "ok", "implementation": "stand-in"},
                                  parent=msg, ident=idents)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.socket.close(linger=0)
        self.context.term()


@pytest.fixture
def shells():
    made: list[StandInShell] = []

    def make(answer_from: int) -> StandInShell:
        made.append(StandInShell(answer_from))
        return made[-1]

    yield make
    for shell in made:
        shell.close()


def test_a_silent_replica_is_not_polled_while_the_wait_lasts(shells) -> None:
    """A replica that never answers: ``alive`` is asked once when the wait begins, not every
    100 ms (the code before asked it 10 times a second until the deadline)."""
    shell = shells(answer_from=0)
    asked = []

    def alive(rid: int) -> bool:
        asked.append(time.monotonic())
        return True

    started = time.monotonic()
    answered = asyncio.run(readiness.ready([shell.endpoint(1)], KEY, "hmac-sha256", 1.5,
                                           alive))
    took = time.monotonic() - started
    assert answered == set()
    assert 1.4 < took < 3.0
    assert len(asked) == 1, f"alive asked {len(asked)} times in {took:.1f} s"


def test_a_reported_exit_ends_the_wait_at_once(shells) -> None:
    """The caller fires ``exits`` when a Local Scheduler reports a replica's exit: the wait
    looks at ``alive`` then and stops, without waiting for its deadline or a poll."""
    shell = shells(answer_from=0)
    exits = LoopSignal()
    dead: set[int] = set()

    def report_exit() -> None:
        time.sleep(0.3)
        dead.add(2)
        exits.fire()

    async def wait() -> set[int]:
        threading.Thread(target=report_exit, daemon=True).start()
        return await readiness.ready([shell.endpoint(2)], KEY, "hmac-sha256", 30.0,
                                     lambda rid: rid not in dead, exits=exits)

    started = time.monotonic()
    assert asyncio.run(wait()) == set()
    assert time.monotonic() - started < 1.5


def test_replies_are_collected_and_other_messages_skipped(shells) -> None:
    """Two replicas answer (each after a ``status`` that is not the answer): both ids, and
    their kernel_info_reply contents."""
    a, b = shells(answer_from=1), shells(answer_from=1)
    replies: dict[int, dict] = {}
    answered = asyncio.run(readiness.ready([a.endpoint(1), b.endpoint(2)], KEY, "hmac-sha256",
                                           10.0, replies=replies))
    assert answered == {1, 2}
    assert replies[1]["implementation"] == replies[2]["implementation"] == "stand-in"


def test_a_request_lost_before_the_replica_listened_is_sent_again(shells, monkeypatch) -> None:
    """A replica that misses the first request (it had not bound its socket yet) gets it
    again after RESEND_S and answers; one with a reply already is not asked again."""
    monkeypatch.setattr(readiness, "RESEND_S", 0.3)
    late, prompt = shells(answer_from=2), shells(answer_from=1)
    started = time.monotonic()
    answered = asyncio.run(readiness.ready([late.endpoint(1), prompt.endpoint(2)], KEY,
                                           "hmac-sha256", 10.0))
    assert answered == {1, 2}
    assert 0.25 < time.monotonic() - started < 3.0
    assert late.requests == 2 and prompt.requests == 1
