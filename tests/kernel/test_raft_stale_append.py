"""A late or repeated AppendEntries must not undo membership changes a follower already holds.

pysyncobj's follower deletes every entry after an AppendEntries' ``prevLogIdx`` whenever it
holds more, even when they match the leader's (Raft deletes only from the first conflict), and
before deleting it *reverses* the membership changes in them, without knowing whether each
one changed anything when it was appended. A replacement that joined with ``--peers`` naming
the live members replays "add <a live member>" as a no-op, but the reversal removes that
member; a "remove <a long-gone replica>" (a no-op too) is reversed into adding the gone
replica. The leader's next messages bring the entries back and the view with them, unless
the leader is the executor killed right then (the notebook corpus with a kill after every
cell): the joiner is then left counting a gone replica and not its live peer, whose vote
requests it refuses (pysyncobj drops connections from addresses outside its view), and no live
member of the group has a quorum although two of three live (issue 32).

One real RaftLog, fed AppendEntries on its own tick thread by a leader that is only a name."""

from __future__ import annotations

import pickle
import time

import pytest
from pysyncobj.node import TCPNode
from pysyncobj.syncobj import _COMMAND_TYPE
from test_raft_applied_guard import _append, _applied, _on_tick

from notebookos.kernel.raft_log import RaftLog
from notebookos.ports import free_ports

pytestmark = pytest.mark.timeout(30)

NO_OP = bytes([_COMMAND_TYPE.NO_OP])


def _membership(kind: str, address: str) -> bytes:
    return bytes([_COMMAND_TYPE.MEMBERSHIP]) + pickle.dumps([kind, address, address])


@pytest.fixture(name="joiner")
def joiner_fixture():  # noqa: ANN201
    """A replica that joined a group of {leader, peer} (its --peers), after the leader's log
    removed a replica long gone and added ``peer`` and then this replica."""
    me, leader, peer, gone = (f"127.0.0.1:{p}" for p in free_ports(4))
    log = RaftLog(me, [leader, peer], {2: leader, 3: peer, 4: me}, b"key",
                  on_commit=lambda _record, _applied: None, on_diverged=lambda _why: None,
                  rest=None, raft_min_timeout=8, raft_max_timeout=9.5)  # no candidate in a test
    node = TCPNode(leader)
    entries = [(NO_OP + b"x" * 100_000, 2, 1), (_membership("rem", gone), 3, 1),
               (_membership("add", leader), 4, 1), (_membership("add", peer), 5, 1),
               (_membership("add", me), 6, 1), (NO_OP, 7, 1)]
    try:
        _append(log, node, 1, (1, 0), entries, commit=7)
        deadline = time.monotonic() + 5
        while _applied(log) < 7:
            assert time.monotonic() < deadline, "the joiner never applied its entries"
            time.sleep(0.01)
        assert log.raft_members() == {me, leader, peer}
        yield log, node, entries, (me, leader, peer, gone)
    finally:
        log.close()


def test_a_late_append_of_entries_held_keeps_the_view_of_the_group(joiner) -> None:  # noqa: ANN001
    log, node, entries, (me, leader, peer, _gone) = joiner
    # A late copy of the leader's first batch to us, cut short (what the leader resends after a
    # stale "reset" answer moved its next index for us back): every entry in it is ours already.
    _append(log, node, 1, (1, 0), entries[:1], commit=7)
    # Old pysyncobj: the view is now {gone} (the "add leader" and "add peer" reversed, the
    # "rem gone" not), and the leader's connection was dropped, so it cannot send the rest
    # again; once it is SIGKILLed the live peer asks this replica for votes in vain.
    assert log.raft_members() == {me, leader, peer}
    assert log._sync._SyncObj__getCurrentLogIndex() == 7
    assert log._sync.applied_guard.diverged is None


def test_a_late_append_of_a_large_entry_held_keeps_the_view_of_the_group(
        joiner) -> None:  # noqa: ANN001
    log, node, entries, (me, leader, peer, _gone) = joiner
    # the same, the entry sent in parts (pysyncobj's "transmission" of an entry over its batch
    # size, as a cell's large state update is)
    data = pickle.dumps(entries[0])
    for part, chunk in (("start", data[:60_000]), ("finish", data[60_000:])):
        message = {"type": "append_entries", "transmission": part, "data": chunk, "term": 1,
                   "commit_index": 7, "prevLogIdx": 1, "prevLogTerm": 0}
        _on_tick(log, lambda sync, m=message: sync._SyncObj__onMessageReceived(node, m))
    assert log.raft_members() == {me, leader, peer}
    assert log._sync._SyncObj__getCurrentLogIndex() == 7
    assert log._sync.applied_guard.rewritten == 0


def test_a_repeated_append_deletes_nothing(joiner) -> None:  # noqa: ANN001
    log, node, entries, (me, leader, peer, _gone) = joiner
    _append(log, node, 1, (1, 0), entries, commit=7)
    assert log.raft_members() == {me, leader, peer}
    assert log._sync._SyncObj__getCurrentLogIndex() == 7
    assert log._sync.applied_guard.rewritten == 0  # nothing was deleted to be written back


def test_an_append_that_conflicts_still_replaces_the_entries_from_the_conflict_on(
        joiner) -> None:  # noqa: ANN001
    log, node, entries, (me, leader, peer, gone) = joiner
    # a leader of term 2 whose log holds another entry at index 7 (Raft's rule: delete from
    # the first conflict on; that the guard reports the applied entry replaced is its test's)
    _append(log, node, 2, (1, 0), entries[:5] + [(NO_OP, 7, 2)], commit=7)
    got = log._sync._SyncObj__getEntries(7, 1)
    assert got and got[0][2] == 2
    assert log._sync._SyncObj__getCurrentLogIndex() == 7
    assert log.raft_members() == {me, leader, peer}
