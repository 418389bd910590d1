"""The election state machine, fed committed records directly (no sockets)."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from notebookos.kernel.election import ElectionBook, Phase, choose_vote
from notebookos.kernel.records import (
    LEAD,
    YIELD,
    Abort,
    Checkpointed,
    Completion,
    MemberAdded,
    MemberRemoved,
    Proposal,
    Restored,
    Vote,
)

MEMBERS = {1: "a:1", 2: "a:2", 3: "a:3"}


def book_with(*records) -> ElectionBook:
    book = ElectionBook(MEMBERS)
    for record in records:
        book.apply(record)
    return book


def vote_now(book: ElectionBook, eid: str, expected=frozenset({1, 2, 3}), now=0.0,
             lead_at=None, first_at=None):
    return choose_vote(book.get(eid), book.members, set(expected), book.last_executor, now,
                       lead_at, first_at,
                       lead_timeout=0.2, no_lead_timeout=1.0)


def test_first_committed_vote_decides_and_assigns_term_and_count():
    book = book_with(Proposal("m1", 2, YIELD), Proposal("m1", 1, LEAD), Proposal("m1", 3, YIELD))
    choice = vote_now(book, "m1")
    assert choice.ready and choice.candidate == 1
    book.apply(Vote("m1", 2, 1))
    book.apply(Vote("m1", 3, None))  # a later vote cannot change the outcome
    election = book.get("m1")
    assert (election.phase, election.executor, election.term, election.execution_count) == (
        Phase.RUNNING, 1, 1, 1)


def test_waits_for_the_previous_executor_until_the_lead_timeout():
    book = book_with(Proposal("m0", 2, LEAD), Vote("m0", 2, 2), Completion("m0", 2, "ok"),
                     Proposal("m1", 1, LEAD))
    assert not vote_now(book, "m1", now=0.1, lead_at=0.0, first_at=0.0).ready
    choice = vote_now(book, "m1", now=0.25, lead_at=0.0, first_at=0.0)
    assert choice.ready and choice.candidate == 1
    # a previous executor known to be down is not waited for
    assert vote_now(book, "m1", expected={1, 3}, now=0.0, lead_at=0.0).candidate == 1


def test_first_lead_wins_at_once_when_nobody_can_outrank_it():
    fresh = book_with(Proposal("m1", 3, LEAD))  # no previous executor
    assert vote_now(fresh, "m1", now=0.0, lead_at=0.0).candidate == 3
    handoff = book_with(Proposal("m0", 2, LEAD), Vote("m0", 2, 2), Completion("m0", 2, "ok"),
                        Proposal("m1", 2, YIELD), Proposal("m1", 1, LEAD))
    assert vote_now(handoff, "m1", now=0.0, lead_at=0.0).candidate == 1


def test_sticky_previous_executor_wins_over_first_lead():
    book = book_with(Proposal("m1", 3, LEAD), Proposal("m1", 1, YIELD), Proposal("m1", 2, YIELD),
                     Vote("m1", 3, 3), Completion("m1", 3, "ok"))
    book.apply(Proposal("m2", 1, LEAD))
    assert vote_now(book, "m2", now=0.0, lead_at=0.0).ready is False  # 3 may still propose
    book.apply(Proposal("m2", 3, LEAD))  # the previous executor's LEAD decides at once
    assert (book.get("m2").phase, book.get("m2").executor) == (Phase.RUNNING, 3)
    assert book.get("m2").execution_count == 2


def test_a_vote_committed_before_the_sticky_lead_still_decides():
    book = book_with(Proposal("m1", 3, LEAD), Vote("m1", 3, 3), Completion("m1", 3, "ok"),
                     Proposal("m2", 1, LEAD), Vote("m2", 2, 1), Proposal("m2", 3, LEAD))
    assert book.get("m2").executor == 1 and book.last_executor == 1


@pytest.mark.parametrize("yielders,now,ready", [((1, 2, 3), 0.0, True), ((1, 2), 0.5, False),
                                                ((1, 2), 1.5, True)])
def test_all_yield_fails(yielders, now, ready):
    # replica 3 may be unreachable, yet it is waited for: it may be the one with execute_request
    book = book_with(*(Proposal("m1", r, YIELD) for r in yielders))
    expected = {1, 2}
    choice = vote_now(book, "m1", expected=expected, now=now, first_at=0.0)
    assert choice.ready is ready
    if ready:
        assert choice.candidate is None
        book.apply(Vote("m1", 1, None))
        assert book.get("m1").phase is Phase.FAILED
        assert book.execution_count == 0


def test_only_first_proposal_per_replica_counts_and_votes_for_non_leaders_are_ignored():
    book = book_with(Proposal("m1", 1, YIELD), Proposal("m1", 1, LEAD), Vote("m1", 2, 1))
    assert book.get("m1").phase is Phase.PROPOSING
    assert book.get("m1").leads == []


def test_silent_cells_take_no_execution_count():
    book = book_with(Proposal("s", 1, LEAD, silent=True), Vote("s", 1, 1))
    assert book.get("s").execution_count == 0 and book.execution_count == 0


def test_abort_before_completion_wins_and_late_completion_is_ignored():
    book = book_with(Proposal("m1", 1, LEAD), Vote("m1", 1, 1), Abort("m1", 2, "gone"))
    applied = book.apply(Completion("m1", 1, "ok", b"update"))
    assert applied.ignored_completion
    assert book.get("m1").phase is Phase.ABORTED and book.updates == []


def test_completion_keeps_updates_until_a_checkpoint_covers_them():
    book = book_with(Proposal("m1", 1, LEAD), Vote("m1", 1, 1), Completion("m1", 1, "ok", b"u1"),
                     Proposal("m2", 1, LEAD), Vote("m2", 1, 1), Completion("m2", 1, "ok", b"u2"))
    assert [u for _c, _e, u in book.updates] == [b"u1", b"u2"]
    book.apply(Checkpointed(1))
    assert [u for _c, _e, u in book.updates] == [b"u2"]


def test_membership_and_restore_and_snapshot_pickle():
    book = book_with(MemberRemoved(3), MemberAdded(4, "a:4"), Restored(7), Restored(9))
    assert book.members == {1: "a:1", 2: "a:2", 4: "a:4"}
    book.apply(Proposal("m1", 1, LEAD))
    book.apply(Vote("m1", 1, 1))
    assert book.get("m1").execution_count == 8 and book.restored_from == 7
    clone = pickle.loads(pickle.dumps(book))
    assert clone.get("m1").executor == 1 and clone.term == 1


def test_replay_is_deterministic():
    records = [Proposal("a", 2, LEAD), Proposal("a", 1, YIELD), Vote("a", 1, 2),
               Completion("a", 2, "ok", b"x"), Proposal("b", 1, YIELD), Vote("b", 1, None)]
    one, two = book_with(*records), book_with(*records)
    assert pickle.dumps(one.__dict__) == pickle.dumps(two.__dict__)


def test_open_elections_are_exactly_the_unsettled_ones_in_term_order():
    """``open_elections`` is asked on every wake-up; it tracks the open ones instead of scanning
    every election of a long session, and must agree with that scan."""
    book = ElectionBook(MEMBERS)
    book.max_elections = 50
    for i in range(200):
        eid = f"c{i}"
        book.apply(Proposal(eid, 1, LEAD))
        book.apply(Vote(eid, 1, 1))
        if i % 7 == 3:
            book.apply(Abort(eid, 2, "gone"))
        elif i % 5 != 4:  # every fifth cell stays running
            book.apply(Completion(eid, 1, "ok"))
        book.apply(Proposal(f"y{i}", 2, YIELD))
        if i % 3 == 0:
            book.apply(Vote(f"y{i}", 2, None))  # failed
        scan = [book.elections[e] for e in book.order if not book.elections[e].phase.settled]
        assert book.open_elections() == scan
    assert all(not e.phase.settled for e in book.open_elections())
    assert pickle.loads(pickle.dumps(book)).open_ids == book.open_ids


# ---- a replacement replays the log from its start with today's members (issues 11 and 19) ----

JOINER_MEMBERS = {2: "a:2", 3: "a:3", 4: "a:4"}  # a replacement's --peers plus itself


def outcome(book: ElectionBook) -> tuple:
    """Everything a replica acts on: each election's result, the counters, the kept updates."""
    elections = tuple((e.election_id, e.term, e.phase, e.executor, e.execution_count, e.status)
                      for e in (book.elections[i] for i in book.order))
    return (elections, book.term, book.execution_count, book.last_executor,
            book.checkpoint_count, tuple(book.updates), tuple(book.open_ids))


def test_a_replacement_replaying_the_log_decides_every_cell_as_the_founders_did():
    """The log of two sticky cells on replica 1, its loss and its replacement by replica 4, as
    recorded on a real replacement: the second cell was decided by 1's sticky LEAD. A book that
    starts with the replacement's members must still decide it and keep its update."""
    records = [
        Proposal("c1", 2, YIELD), Proposal("c1", 3, YIELD), Proposal("c1", 1, LEAD),
        Vote("c1", 1, 1), Completion("c1", 1, "ok", b"u1"), Checkpointed(1, "c1"),
        Proposal("c2", 1, LEAD), Completion("c2", 1, "ok", b"u2"), Checkpointed(2, "c2"),
        MemberRemoved(1), MemberAdded(4, "a:4"),
        Proposal("c3", 4, LEAD), Vote("c3", 4, 4), Completion("c3", 4, "ok", b"u3"),
    ]
    founder, joiner = ElectionBook(MEMBERS), ElectionBook(JOINER_MEMBERS)
    completed_updates = {"founder": [], "joiner": []}
    for record in records:
        for name, book in (("founder", founder), ("joiner", joiner)):
            applied = book.apply(record)
            if applied.completed and applied.update is not None:
                completed_updates[name].append(applied.update)
    assert joiner.get("c2").phase is Phase.COMPLETED
    assert completed_updates["joiner"] == completed_updates["founder"] == [b"u1", b"u2", b"u3"]
    assert outcome(joiner) == outcome(founder)
    assert joiner.members == founder.members == {2: "a:2", 3: "a:3", 4: "a:4"}


def test_a_removed_previous_executor_does_not_decide_by_its_sticky_lead():
    book = book_with(Proposal("c1", 1, LEAD), Vote("c1", 1, 1), Completion("c1", 1, "ok"),
                     MemberRemoved(1), Proposal("c2", 1, LEAD))
    assert book.get("c2").phase is Phase.PROPOSING  # a vote decides, as before the removal


replica_ids = st.integers(min_value=1, max_value=4)
election_ids = st.sampled_from(["c1", "c2", "c3", "c4", "c5", "c6"])
any_record = st.one_of(
    st.builds(Proposal, election_ids, replica_ids, st.sampled_from([LEAD, YIELD]), st.booleans()),
    st.builds(Vote, election_ids, replica_ids, st.one_of(st.none(), replica_ids)),
    st.builds(Completion, election_ids, replica_ids, st.just("ok"),
              st.one_of(st.none(), st.binary(min_size=1, max_size=3))),
    st.builds(Abort, election_ids, replica_ids, st.just("gone")),
    st.builds(MemberAdded, replica_ids, st.just("a:x")),
    st.builds(MemberRemoved, replica_ids),
    st.builds(Checkpointed, st.integers(min_value=0, max_value=6)),
)


@st.composite
def cell(draw) -> list:
    """The records of one ordinary cell: a LEAD (and maybe a vote for it), its completion."""
    eid, executor = draw(election_ids), draw(replica_ids)
    records = [Proposal(eid, executor, LEAD)]
    if draw(st.booleans()):
        records.append(Vote(eid, draw(replica_ids), executor))
    records.append(Completion(eid, executor, "ok", draw(st.binary(min_size=1, max_size=2))))
    return records


log_records = st.lists(st.one_of(cell(), any_record.map(lambda r: [r])), max_size=25).map(
    lambda blocks: [r for block in blocks for r in block])


@settings(max_examples=300, deadline=None)
@given(records=log_records, start=st.dictionaries(replica_ids, st.just("a:y"), max_size=4))
def test_every_transition_depends_on_the_records_not_on_the_starting_members(records, start):
    """Books that start with any member maps reach the same outcome from the same records."""
    founder, other = ElectionBook(MEMBERS), ElectionBook(start)
    for record in records:
        one, two = founder.apply(record), other.apply(record)
        assert (one.decided, one.completed, one.aborted, one.ignored_completion, one.update) == (
            two.decided, two.completed, two.aborted, two.ignored_completion, two.update)
    assert outcome(founder) == outcome(other)
