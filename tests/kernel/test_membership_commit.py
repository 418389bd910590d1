"""A replica answers add/remove_replica_request with ok only once the Raft membership change is
committed (issue 31, items 4 and 8). pysyncobj changes a member's view of the group when the
change is appended to its log, so a member whose log holds the change uncommitted (and a leader
that denies the change as already present) used to answer "already applied"; a new leader
without it then rolled it back, the scheduler took the lost replica for removed, and after the
next replacement the group counted four members, two dead after the next kill: nothing could
commit any more and every cell hung. The handler runs here against a fake Raft log."""

from __future__ import annotations

import asyncio
import logging
import threading
from types import SimpleNamespace

import pytest

from notebookos.kernel.records import MemberRemoved
from notebookos.kernel.replica import ReplicaKernel

pytestmark = pytest.mark.timeout(30)

DEAD = "127.0.0.1:1111"


class FakeRaft:
    """The group as one member sees it: ``members`` is its appended view; a proposed record
    commits when ``commits`` says so (then ``members_after_commit``, if given, is the view)."""

    def __init__(self, commits: bool, members_after_commit: set[str] | None = None) -> None:
        self.lock = threading.RLock()
        self.book = SimpleNamespace(members={1: "127.0.0.1:1", 2: "127.0.0.1:2", 3: DEAD})
        self.members = {"127.0.0.1:1", "127.0.0.1:2"}  # the removal is appended here
        self.commits = commits
        self.members_after_commit = members_after_commit
        self.proposed: list = []
        self.asked = 0

    def remove_node(self, address: str, on_done) -> None:  # noqa: ANN001
        self.asked += 1
        on_done(False, "REQUEST_DENIED")  # the leader's log already holds it

    def raft_members(self) -> set[str]:
        return set(self.members)

    def propose(self, record, on_done=None, retry_for: float = 60.0) -> None:  # noqa: ANN001
        self.proposed.append(record)
        if self.commits and on_done is not None:
            if self.members_after_commit is not None:
                self.members = set(self.members_after_commit)
            threading.Timer(0.01, on_done, (True, "")).start()


def _remove(raft: FakeRaft, timeout: float = 0.6) -> dict:
    sent: list[dict] = []
    kernel = SimpleNamespace(
        raft=raft, membership_timeout=timeout, log=logging.getLogger("test"),
        session=SimpleNamespace(send=lambda _stream, _type, content, _parent, ident=None:
                                sent.append(content)))
    for name in ("_membership_change", "_change_raft_membership", "_membership_committed"):
        method = getattr(ReplicaKernel, name, None)
        if method is not None:
            setattr(kernel, name, method.__get__(kernel))
    parent = {"content": {"replica_id": 3, "raft_address": DEAD}}
    asyncio.run(asyncio.wait_for(kernel._membership_change(None, [], parent, add=False), 20))
    (content,) = sent
    return content


def test_a_change_only_appended_is_not_reported_done() -> None:
    raft = FakeRaft(commits=False)  # the group cannot commit (no majority reachable)
    content = _remove(raft)
    assert content["status"] == "error", content
    assert content["ename"] == "NotebookOSMembershipChangeFailed"


def test_a_change_rolled_back_by_a_new_leader_is_asked_for_again() -> None:
    # the book's record commits, but by then the member's view holds the dead replica again
    raft = FakeRaft(commits=True, members_after_commit={"127.0.0.1:1", "127.0.0.1:2", DEAD})
    content = _remove(raft)
    assert content["status"] == "error", content
    assert raft.asked >= 2  # asked again after the rollback


def test_a_committed_change_is_ok() -> None:
    raft = FakeRaft(commits=True)
    content = _remove(raft)
    assert content == {"status": "ok", "replica_id": 3}
    assert MemberRemoved(3) in raft.proposed
