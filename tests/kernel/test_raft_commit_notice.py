"""When the leader tells the other members that a record committed (kernel/raft_log.py,
``_nobody_waits_for``): at once for records members wait for, with the next AppendEntries for a
sticky cell's LEAD and its Completion. In-process RaftLogs on loopback (real pysyncobj, real
sockets); the leader's AppendEntries rounds are counted on the real object."""

from __future__ import annotations

import threading
import time

from notebookos.kernel.raft_log import RaftLog
from notebookos.kernel.records import Completion, Record, Vote
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


def _rounds_for(records: list[Record]) -> tuple[int, list[list[Record]]]:
    """How many AppendEntries rounds the leader starts while committing ``records`` one after
    the other, heartbeats held off meanwhile; and what every member applied once the leader's
    next heartbeat went out."""
    applied: list[list[Record]] = [[], [], []]
    logs = _group(applied)
    try:
        leader = _leader(logs)
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


def test_a_sticky_cells_completion_is_announced_with_the_next_append_entries() -> None:
    completions = [Completion(f"cell-{i}", 1, "ok", None, ()) for i in range(CELLS)]
    lazy, applied = _rounds_for(completions)
    votes = [Vote(f"cell-{i}", 1, 1) for i in range(CELLS)]
    prompt, _ = _rounds_for(votes)
    # A vote: one round to replicate it, one to announce its commit; a Completion: one.
    assert prompt >= 2 * CELLS - 1, prompt
    assert lazy <= CELLS + 1, lazy
    for member in applied:  # and still every member applies every record, with no new one
        assert [r.election_id for r in member if isinstance(r, Completion)] == \
            [c.election_id for c in completions]
