"""Followers whose answer the leader does not need answer later (kernel/raft_log.py,
``_KeyedSyncObj._tag_for_later_answers``): with three members, one follower answers each
AppendEntries at once and the other holds its answer up to ``ACK_LATER_S`` (issue 36: two of
a trivial cell's eight Raft messages, and the wake-ups they cost). Real pysyncobj on loopback;
the answers are counted where the leader receives them."""

from __future__ import annotations

import threading
import time
from collections import Counter

from notebookos.kernel import raft_log
from notebookos.kernel.raft_log import RaftLog
from notebookos.kernel.records import LEAD, Completion, Proposal, Vote
from notebookos.ports import free_ports

RECORDS = 30


def _group() -> list[RaftLog]:
    addresses = [f"127.0.0.1:{p}" for p in free_ports(3)]
    members = {i + 1: a for i, a in enumerate(addresses)}
    return [RaftLog(a, [b for b in addresses if b != a], members, b"key",
                    on_commit=lambda *_: None, quick_start=True, rest=None)
            for a in addresses]


def _leader(logs: list[RaftLog], timeout: float = 10.0) -> RaftLog:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in logs:
            if log._sync._isLeader() and log.is_ready():
                return log
        time.sleep(0.005)
    raise TimeoutError("no leader")


def _commit(log: RaftLog, record) -> float:  # noqa: ANN001
    done = threading.Event()
    start = time.monotonic()
    log.propose(record, on_done=lambda ok, _why: ok and done.set())
    assert done.wait(10), f"{record!r} did not commit"
    return time.monotonic() - start


def _count_answers(followers: list[RaftLog]) -> Counter:
    """The next_node_idx answers the followers send, by follower address (pysyncobj calls its
    transport's ``send`` through the instance)."""
    answers: Counter = Counter()
    for log in followers:
        transport = log._sync._SyncObj__transport
        send = transport.send

        def counted(node, message, send=send, me=log.self_address):  # noqa: ANN001
            if isinstance(message, dict) and message.get("type") == "next_node_idx":
                answers[me] += 1
            return send(node, message)

        transport.send = counted
    return answers


def _records(leader_id: int) -> list:
    return [r for k in range(RECORDS // 2)
            for r in (Proposal(f"e{k}", leader_id, LEAD), Completion(f"e{k}", leader_id, "ok"))]


def test_one_follower_answers_each_append_at_once_the_other_later():
    """Fails on the code before: both followers answered every AppendEntries (2 x RECORDS)."""
    assert raft_log.ACK_LATER
    logs = _group()
    try:
        leader = _leader(logs)
        leader_id = logs.index(leader) + 1
        _commit(leader, Proposal("warm-up", leader_id, LEAD))
        _commit(leader, Vote("warm-up", leader_id, leader_id))
        time.sleep(0.1)  # every answer to the warm-up in
        followers = [log for log in logs if log is not leader]
        answers = _count_answers(followers)
        for record in _records(leader_id):
            _commit(leader, record)
        assert sum(answers.values()) < 1.5 * RECORDS, answers
        time.sleep(2 * raft_log.ACK_LATER_S + 0.1)  # the held answers are due, and sent
        ends = {log.self_address: log.log_end() for log in followers}
        assert all(end == leader.log_end() for end in ends.values()), ends
        match = leader._sync._SyncObj__raftMatchIndex
        assert all(index == leader.log_end()[1] for index in match.values()), match
    finally:
        for log in logs:
            log.close()


def test_without_the_prompt_follower_the_other_answers_at_once():
    logs = _group()
    try:
        leader = _leader(logs)
        leader_id = logs.index(leader) + 1
        _commit(leader, Proposal("warm-up", leader_id, LEAD))
        _commit(leader, Vote("warm-up", leader_id, leader_id))
        followers = sorted((log for log in logs if log is not leader),
                           key=lambda log: log.self_address)
        prompt = next(log for log in followers
                      if leader._sync._answers_at_once(raft_log._node(log.self_address)))
        prompt.close()
        deadline = time.monotonic() + 10
        while leader.is_connected(prompt.self_address) and time.monotonic() < deadline:
            time.sleep(0.01)
        times = sorted(_commit(leader, record) for record in _records(leader_id))
        # each one waits for the remaining follower's answer, never for a held one's time
        assert times[len(times) // 2] < raft_log.ACK_LATER_S, times
    finally:
        for log in logs:
            log.close()
