"""When the leader tells the other members that a record committed (kernel/raft_log.py,
``_nobody_waits_for``): at once for records members wait for, with the next AppendEntries for a
sticky cell's LEAD and its Completion. In-process RaftLogs on loopback (real pysyncobj, real
sockets); the leader's AppendEntries rounds are counted on the real object."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from notebookos.kernel.raft_log import RaftLog
from notebookos.kernel.records import LEAD, Completion, Proposal, Record, Vote
from notebookos.ports import free_ports

CELLS = 20


def _group(applied: list[list[Record]]) -> list[RaftLog]:
    addresses = [f"127.0.0.1:{p}" for p in free_ports(3)]
    members = {i + 1: a for i, a in enumerate(addresses)}
    return [RaftLog(a, [b for b in addresses if b != a], members, b"key",
                    on_commit=lambda record, _a, seen=seen: seen.append(record),
                    quick_start=True, rest=None)
            for a, seen in zip(addresses, applied, strict=True)]


def _leader(logs: list[RaftLog], timeout: float = 10.0) -> RaftLog:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in logs:
            if log._sync._isLeader() and log.is_ready():
                return log
        time.sleep(0.005)
    raise TimeoutError("no leader")


def _commit(log: RaftLog, record: Record) -> None:
    done = threading.Event()
    log.propose(record, on_done=lambda ok, _why: ok and done.set())
    assert done.wait(10), f"{record!r} did not commit"


def _rounds_for(make: Callable[[int, int], list[Record]]) -> tuple[int, list[list[Record]]]:
    """How many AppendEntries rounds the leader starts while committing the records
    ``make(leader's member id, a follower's)`` returns, one after the other, heartbeats held off
    meanwhile; and what every member applied once the leader's next heartbeat went out."""
    applied: list[list[Record]] = [[], [], []]
    logs = _group(applied)
    try:
        leader = _leader(logs)
        leader_id = logs.index(leader) + 1
        records = make(leader_id, 1 if leader_id != 1 else 2)
        for log in logs:  # no heartbeat, and no election for want of one, while counting
            conf = log._sync._SyncObj__conf
            conf.raftMinTimeout = conf.raftMaxTimeout = 60.0
        sync = leader._sync
        conf = sync._SyncObj__conf
        conf.appendEntriesPeriod = 60.0
        send = sync._SyncObj__sendAppendEntries
        rounds = [0]

        def counted() -> None:
            rounds[0] += 1
            send()

        sync._SyncObj__sendAppendEntries = counted  # SyncObj calls it through the instance
        _commit(leader, Vote("warm-up", 1, 1))  # the heartbeat period now in force
        rounds[0] = 0
        for record in records:
            _commit(leader, record)
        count = rounds[0]
        conf.appendEntriesPeriod = 0.05  # heartbeats again: they carry the last commit index
        sync._SyncObj__newAppendEntriesTime = 0
        deadline = time.monotonic() + 5
        while any(len(a) < len(records) + 1 for a in applied) and time.monotonic() < deadline:
            time.sleep(0.01)
        return count, [list(a) for a in applied]
    finally:
        for log in logs:
            log.close()


def _completions(executor: int) -> list[Record]:
    return [Completion(f"cell-{i}", executor, "ok", None, ()) for i in range(CELLS)]


def test_a_sticky_cells_completion_is_announced_with_the_next_append_entries() -> None:
    lazy, applied = _rounds_for(lambda leader, _follower: _completions(leader))
    prompt, _ = _rounds_for(lambda _leader, _follower: [Vote(f"cell-{i}", 1, 1)
                                                        for i in range(CELLS)])
    # A vote: one round to replicate it, one to announce its commit; a Completion: one.
    assert prompt >= 2 * CELLS - 1, prompt
    assert lazy <= CELLS + 1, lazy
    for member in applied:  # and still every member applies every record, with no new one
        assert [r.election_id for r in member if isinstance(r, Completion)] == \
            [f"cell-{i}" for i in range(CELLS)]


def test_a_completion_with_a_state_update_is_announced_at_once() -> None:
    """The standbys have the update to apply: told with the next record (the checkpoint's, a
    write later) or a heartbeat, they held the cell's state 1-50 ms late (issue 36)."""
    rounds, applied = _rounds_for(lambda leader, _follower: [
        Completion(f"cell-{i}", leader, "ok", b"update", ()) for i in range(CELLS)])
    assert rounds >= 2 * CELLS - 1, rounds
    for member in applied:
        assert [r.election_id for r in member if isinstance(r, Completion)] == \
            [f"cell-{i}" for i in range(CELLS)]


def test_a_followers_lead_and_completion_are_announced_at_once() -> None:
    """An executor that is not the leader (leadership did not follow it: a refused transfer,
    a rested group's first cell) waits for its LEAD to commit: announced a heartbeat later
    (50 ms), it cost the cell that much (found by benchmarks/idle.py: 112 ms after idle)."""
    def follower_cells(_leader: int, follower: int) -> list[Record]:
        return [record for i in range(CELLS // 2)
                for record in (Proposal(f"cell-{i}", follower, LEAD),
                               Completion(f"cell-{i}", follower, "ok", None, ()))]

    rounds, _ = _rounds_for(follower_cells)
    assert rounds >= 2 * CELLS - 1, rounds
