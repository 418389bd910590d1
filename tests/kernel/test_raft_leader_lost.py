"""A follower that loses its connection to the Raft leader elects at once (kernel/raft_rest.py,
point 4), awake or resting, instead of after the election timeout. In-process RaftLogs on
loopback (real pysyncobj, real sockets) with an election timeout of 8-9.5 s, so only the
leader-lost path can elect within the test's bound."""

from __future__ import annotations

import time

import pytest

from notebookos.kernel.raft_log import RaftLog
from notebookos.kernel.raft_rest import RestTimings
from notebookos.kernel.records import Vote
from notebookos.ports import free_ports

pytestmark = pytest.mark.timeout(60)


def _group(rest: RestTimings) -> list[RaftLog]:
    addresses = [f"127.0.0.1:{p}" for p in free_ports(3)]
    members = {i + 1: a for i, a in enumerate(addresses)}
    return [RaftLog(a, [b for b in addresses if b != a], members, b"key",
                    on_commit=lambda _record, _applied: None, quick_start=True, rest=rest,
                    raft_min_timeout=8.0, raft_max_timeout=9.5)
            for a in addresses]


def _leaders(logs: list[RaftLog]) -> list[RaftLog]:
    return [log for log in logs if log._sync._isLeader() and log.is_ready()]


def _wait_for(predicate, timeout: float) -> float:  # noqa: ANN001
    t0 = time.monotonic()
    while not predicate():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.005)
    return time.monotonic() - t0


@pytest.mark.parametrize("resting", [False, True], ids=["awake", "resting"])
def test_losing_the_leaders_connection_elects_a_new_leader_at_once(resting: bool) -> None:
    # rest only when asked: quiet periods far beyond the test otherwise
    rest = RestTimings() if resting else RestTimings(follower_quiet=1e9, leader_quiet=1e9)
    logs = _group(rest)
    try:
        _wait_for(lambda: len(_leaders(logs)) == 1, 20)
        (leader,) = _leaders(logs)
        leader.propose(Vote("cell", 1, 1))
        if resting:
            _wait_for(lambda: all(log.is_resting() for log in logs), 20)
        survivors = [log for log in logs if log is not leader]
        leader.close()  # its sockets close, as a SIGKILLed replica's do
        elapsed = _wait_for(lambda: len(_leaders(survivors)) == 1, 15)
        assert elapsed < 2.0, f"a new leader after {elapsed:.2f}s (the timeout is 8-9.5 s)"
    finally:
        for log in logs:
            log.close()
