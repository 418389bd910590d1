"""pysyncobj's follower deletes applied log entries when an AppendEntries reaches below its
applied index (it logs "truncating already-applied log entries ... state machine may have
diverged"). ``AppliedEntryGuard`` (kernel/raft_log.py) tells the harmless case (the same
entries written back: a late or repeated AppendEntries) from a real divergence (another entry
at an applied index), which must never go unnoticed (DESIGN section 4): the replica is told
and exits to be replaced. One real RaftLog, fed AppendEntries on its own tick thread by a
leader that is only a name."""

from __future__ import annotations

import queue
import threading
import time

import pytest
from pysyncobj import SyncObj
from pysyncobj.node import TCPNode
from pysyncobj.syncobj import _COMMAND_TYPE

from notebookos.kernel.raft_log import RaftLog
from notebookos.ports import free_ports

pytestmark = pytest.mark.timeout(30)

NO_OP = bytes([_COMMAND_TYPE.NO_OP])


def _on_tick(log: RaftLog, action) -> None:  # noqa: ANN001
    """Run ``action(sync)`` on the log's tick thread (where pysyncobj handles messages)."""
    sync = log._sync
    done: queue.Queue = queue.Queue()
    once = threading.Event()

    def callback() -> None:
        if once.is_set():
            return
        once.set()
        try:
            done.put((True, action(sync)))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            done.put((False, exc))

    sync.addOnTickCallback(callback)
    try:
        ok, value = done.get(timeout=10)
    finally:
        sync.removeOnTickCallback(callback)
    if not ok:
        raise value


def _append(log: RaftLog, leader: TCPNode, term: int, prev: tuple[int, int],
            entries: list[tuple[bytes, int, int]], commit: int) -> None:
    message = {"type": "append_entries", "term": term, "commit_index": commit,
               "entries": entries, "prevLogIdx": prev[0], "prevLogTerm": prev[1]}
    _on_tick(log, lambda sync: sync._SyncObj__onMessageReceived(leader, message))


def _append_untrimmed(log: RaftLog, leader: TCPNode, term: int, prev: tuple[int, int],
                      entries: list[tuple[bytes, int, int]], commit: int) -> None:
    """pysyncobj's own handling, watched by the guard, without the trimming of entries this
    log holds (``_without_entries_held``): how the guard sees a deletion pysyncobj makes."""
    message = {"type": "append_entries", "term": term, "commit_index": commit,
               "entries": entries, "prevLogIdx": prev[0], "prevLogTerm": prev[1]}

    def handle(sync) -> None:  # noqa: ANN001
        sync.applied_guard.before(sync, message)
        SyncObj._SyncObj__onMessageReceived(sync, leader, message)
        sync.applied_guard.after(sync, message)

    _on_tick(log, handle)


def _applied(log: RaftLog) -> int:
    return log._sync._SyncObj__raftLastApplied


@pytest.fixture(name="follower")
def follower_fixture():  # noqa: ANN201
    me, leader = (f"127.0.0.1:{p}" for p in free_ports(2))
    diverged: list[str] = []
    log = RaftLog(me, [leader], {1: me, 2: leader}, b"key",
                  on_commit=lambda _record, _applied: None, on_diverged=diverged.append,
                  rest=None, raft_min_timeout=8, raft_max_timeout=9.5)  # no candidate in a test
    node = TCPNode(leader)
    try:
        _append(log, node, 1, (1, 0), [(NO_OP, 2, 1), (NO_OP, 3, 1)], commit=3)
        deadline = time.monotonic() + 5
        while _applied(log) < 3:
            assert time.monotonic() < deadline, "the follower never applied its entries"
            time.sleep(0.01)
        yield log, node, diverged
    finally:
        log.close()


def test_the_same_append_again_deletes_nothing(follower) -> None:  # noqa: ANN001
    log, node, diverged = follower
    # The same AppendEntries again (a late copy): pysyncobj alone deleted entries 2-3, applied
    # here, and appended the same ones; they match, so nothing is deleted (issue 32,
    # test_raft_stale_append.py).
    _append(log, node, 1, (1, 0), [(NO_OP, 2, 1), (NO_OP, 3, 1)], commit=3)
    guard = log._sync.applied_guard
    assert guard.rewritten == 0
    assert not guard.at_risk
    assert log._sync._SyncObj__getCurrentLogIndex() == 3
    assert diverged == []


def test_applied_entries_written_back_unchanged_are_no_divergence(follower) -> None:  # noqa: ANN001
    log, node, diverged = follower
    # pysyncobj alone: the same AppendEntries again deletes entries 2-3, applied here, and
    # appends the same ones
    _append_untrimmed(log, node, 1, (1, 0), [(NO_OP, 2, 1), (NO_OP, 3, 1)], commit=3)
    guard = log._sync.applied_guard
    assert guard.rewritten == 2
    assert not guard.at_risk
    assert diverged == []
    assert guard.diverged is None


def test_an_applied_entry_replaced_by_another_is_divergence(follower) -> None:  # noqa: ANN001
    log, node, diverged = follower
    # A leader of a later term whose log has another entry at index 2, which this follower
    # applied: pysyncobj deletes 2-3 and appends the leader's (what Raft promises never
    # happens to a committed entry, and what pysyncobj only logs).
    _append(log, node, 2, (1, 0), [(NO_OP, 2, 2)], commit=2)
    assert len(diverged) == 1, diverged
    assert "index 2" in diverged[0]
    assert log._sync.applied_guard.diverged == diverged[0]


def test_applied_entries_deleted_and_not_yet_sent_again_wait_for_the_next_append(
        follower) -> None:  # noqa: ANN001
    log, node, diverged = follower
    _append_untrimmed(log, node, 1, (1, 0), [(NO_OP, 2, 1)], commit=3)  # 3 deleted, not resent
    guard = log._sync.applied_guard
    assert set(guard.at_risk) == {3}
    assert diverged == []
    _append(log, node, 1, (2, 1), [(NO_OP, 3, 1)], commit=3)  # the same entry comes back
    assert not guard.at_risk
    assert diverged == []


def test_a_late_append_of_this_leaders_entries_deletes_nothing(follower) -> None:  # noqa: ANN001
    log, node, diverged = follower
    # entry 2 again, from the leader of term 1 and from a leader of a later term: this log
    # holds it, and entry 3 after it (whose the later leader's may be: not deleted either)
    _append(log, node, 1, (1, 0), [(NO_OP, 2, 1)], commit=3)
    _append(log, node, 2, (1, 0), [(NO_OP, 2, 1)], commit=3)
    guard = log._sync.applied_guard
    assert not guard.at_risk and guard.rewritten == 0
    assert log._sync._SyncObj__getCurrentLogIndex() == 3
    assert diverged == []


def test_an_append_that_truncates_nothing_is_not_counted(follower) -> None:  # noqa: ANN001
    log, node, diverged = follower
    # an AppendEntries of an older term reaching below the applied index: pysyncobj ignores it
    _append(log, node, 0, (1, 0), [(NO_OP, 2, 0)], commit=2)
    guard = log._sync.applied_guard
    assert guard.rewritten == 0
    assert not guard.at_risk
    assert diverged == []
