"""Executor election as a pure state machine over committed log records.

Every replica feeds the same committed records, in the same order, to its own ``ElectionBook``;
since ``apply`` is deterministic, every replica agrees on each election's term, its executor, the
cell's ``execution_count`` and its outcome. Timing (how long to wait for missing proposals) is
local and enters only through ``choose_vote``, whose result is proposed as a VOTE: the first
committed VOTE decides, so local clocks never make replicas disagree.

Rules (issue 3):
- A replica that got ``execute_request`` proposes LEAD; one that got ``yield_request`` proposes
  YIELD. Only a replica's first proposal for an election counts.
- Once every expected replica has proposed, or ``lead_timeout`` after the first committed LEAD,
  a replica votes for the previous executor if it proposed LEAD (sticky), else for the first
  committed LEAD. With no LEAD at all (everyone yielded, or ``no_lead_timeout`` passed) it votes
  None: the election fails and nothing runs.
  Since the sticky rule ignores every other proposal, a replica may vote as soon as the previous
  executor's LEAD is committed; and once the previous executor has yielded (or is gone, or there
  is none), the first committed LEAD cannot be outranked, so it may vote at once as well.
  The book applies that as an implicit vote: a committed LEAD from the previous executor (not
  removed from the group) decides at once, unless a VOTE was committed before it.
- Every transition depends on the records alone, never on the member map a replica started
  with: a replacement starts with the *current* members (``--peers``) yet replays the log from
  its beginning, when the members were others. (The sticky rule once asked "is the previous
  executor a member?": on a replacement the founding executor was not, so the cells it decided
  by its sticky LEAD stayed undecided there, their state updates were dropped, and the
  replacement later ran cells without that state: issues 11 and 19.)
- The first committed VOTE decides. A non-silent decided cell takes the next execution_count.
- The executor's COMPLETION ends the election (its sync update rides on it); an ABORT committed
  first (executor presumed dead) fails the cell instead, and a later COMPLETION is ignored.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from .records import (
    LEAD,
    Abort,
    Checkpointed,
    Completion,
    MemberAdded,
    MemberRemoved,
    Proposal,
    Record,
    Restored,
    Vote,
)


class Phase(StrEnum):
    PROPOSING = "proposing"  # collecting LEAD/YIELD proposals and votes
    RUNNING = "running"  # an executor was chosen and runs the cell
    FAILED = "failed"  # every replica yielded: nothing runs
    COMPLETED = "completed"  # the executor finished; its sync update is in the log
    ABORTED = "aborted"  # the executor was presumed dead mid-cell

    @property
    def settled(self) -> bool:
        return self in (Phase.FAILED, Phase.COMPLETED, Phase.ABORTED)


@dataclass
class Election:
    election_id: str
    term: int
    silent: bool = False
    proposals: dict[int, str] = field(default_factory=dict)  # replica -> LEAD/YIELD, first only
    leads: list[int] = field(default_factory=list)  # LEAD proposers in commit order
    votes: list[tuple[int, int | None]] = field(default_factory=list)
    phase: Phase = Phase.PROPOSING
    executor: int | None = None
    execution_count: int = 0
    status: str = ""  # executor's reply status once COMPLETED; the abort reason once ABORTED
    abort_reason: str = ""


@dataclass(frozen=True)
class Applied:
    """What one committed record changed, for the replica's side effects."""

    election: Election | None = None
    decided: bool = False  # this record decided the election (first VOTE)
    completed: bool = False  # this record completed the election (with its update)
    aborted: bool = False
    ignored_completion: bool = False  # a COMPLETION that lost the race to an ABORT
    update: bytes | None = None
    membership_changed: bool = False


class ElectionBook:
    """All elections of one kernel, the member list, the term and the execution counter."""

    def __init__(self, members: dict[int, str]) -> None:
        # the current members: a local view (a replacement starts with today's members), used for
        # timing and addresses only, never by a transition (see the module docstring)
        self.members: dict[int, str] = dict(members)
        self.removed: set[int] = set()  # replica ids a committed MemberRemoved took out
        self.term = 0
        self.execution_count = 0
        self.last_executor: int | None = None
        self.elections: dict[str, Election] = {}
        self.order: list[str] = []  # election ids in term order
        # ids of the elections not settled yet, in term order: the replica asks for them on every
        # wake-up, and a long session's ``order`` holds up to ``max_elections`` settled ones
        self.open_ids: dict[str, None] = {}
        self.checkpoint_count = 0  # execution_count covered by the latest store checkpoint
        # sync updates after the latest checkpoint, in order: (execution_count, election_id, bytes)
        self.updates: list[tuple[int, str, bytes]] = []
        self.max_elections = 10_000
        # set when this group was rebuilt from a store checkpoint (all replicas had been lost)
        self.restored_from: int | None = None
        self.restore_notes: tuple[str, ...] = ()
        self.restore_failed: frozenset[str] = frozenset()  # names the rebuild agreed are lost

    # ---- queries -------------------------------------------------------------------------
    def get(self, election_id: str) -> Election | None:
        return self.elections.get(election_id)

    def open_elections(self) -> list[Election]:
        return [self.elections[i] for i in self.open_ids]

    # ---- the transition function ----------------------------------------------------------
    def apply(self, record: Record) -> Applied:
        if isinstance(record, Proposal):
            return self._apply_proposal(record)
        if isinstance(record, Vote):
            return self._apply_vote(record)
        if isinstance(record, Completion):
            return self._apply_completion(record)
        if isinstance(record, Abort):
            return self._apply_abort(record)
        if isinstance(record, MemberAdded):
            self.members[record.replica_id] = record.address
            self.removed.discard(record.replica_id)
            return Applied(membership_changed=True)
        if isinstance(record, MemberRemoved):
            self.members.pop(record.replica_id, None)
            self.removed.add(record.replica_id)
            return Applied(membership_changed=True)
        if isinstance(record, Checkpointed):
            if record.execution_count > self.checkpoint_count:
                self.checkpoint_count = record.execution_count
                self.updates = [u for u in self.updates if u[0] > record.execution_count]
            return Applied()
        if isinstance(record, Restored):
            if self.term == 0 and self.restored_from is None:
                self.execution_count = record.execution_count
                self.checkpoint_count = record.execution_count
                self.restored_from = record.execution_count
                self.restore_notes = tuple(record.notes)
                self.restore_failed = frozenset(record.failed)
            return Applied()
        raise TypeError(f"not a log record: {type(record).__name__}")

    def _election(self, election_id: str, silent: bool = False) -> Election:
        election = self.elections.get(election_id)
        if election is None:
            self.term += 1
            election = Election(election_id=election_id, term=self.term, silent=silent)
            self.elections[election_id] = election
            self.order.append(election_id)
            self.open_ids[election_id] = None
            self._prune()
        return election

    def _prune(self) -> None:
        while len(self.order) > self.max_elections:
            oldest = self.elections[self.order[0]]
            if not oldest.phase.settled:
                break
            del self.elections[self.order.pop(0)]

    def _apply_proposal(self, p: Proposal) -> Applied:
        election = self._election(p.election_id, p.silent)
        if election.phase is Phase.PROPOSING and p.replica_id not in election.proposals:
            election.proposals[p.replica_id] = p.kind
            if p.kind == LEAD:
                election.leads.append(p.replica_id)
                if p.replica_id == self.last_executor and p.replica_id not in self.removed:
                    # sticky fast path: every vote would name the previous executor now, so its
                    # committed LEAD decides at once (an implicit first vote, one commit saved).
                    # "Not removed", not "a member": only records decide (module docstring)
                    return self._decide(election, p.replica_id, voter=p.replica_id)
        return Applied(election=election)

    def _apply_vote(self, v: Vote) -> Applied:
        election = self._election(v.election_id)
        if election.phase is not Phase.PROPOSING:
            return Applied(election=election)
        if v.candidate is not None and v.candidate not in election.leads:
            return Applied(election=election)  # a vote for a non-LEAD proposer is invalid
        return self._decide(election, v.candidate, voter=v.voter)

    def _decide(self, election: Election, candidate: int | None, voter: int) -> Applied:
        election.votes.append((voter, candidate))
        if candidate is None:
            election.phase = Phase.FAILED
            self.open_ids.pop(election.election_id, None)
        else:
            election.phase = Phase.RUNNING
            election.executor = candidate
            self.last_executor = candidate
            if not election.silent:
                self.execution_count += 1
            election.execution_count = self.execution_count
        return Applied(election=election, decided=True)

    def _apply_completion(self, c: Completion) -> Applied:
        election = self.elections.get(c.election_id)
        if (
            election is None
            or election.phase is not Phase.RUNNING
            or election.executor != c.executor
        ):
            return Applied(election=election, ignored_completion=True)
        election.phase = Phase.COMPLETED
        self.open_ids.pop(election.election_id, None)
        election.status = c.status
        if c.update is not None:
            self.updates.append((election.execution_count, election.election_id, c.update))
        return Applied(election=election, completed=True, update=c.update)

    def _apply_abort(self, a: Abort) -> Applied:
        election = self.elections.get(a.election_id)
        if election is None or election.phase is not Phase.RUNNING:
            return Applied(election=election)
        election.phase = Phase.ABORTED
        self.open_ids.pop(election.election_id, None)
        election.abort_reason = a.reason
        election.status = "aborted"
        return Applied(election=election, aborted=True)


@dataclass(frozen=True)
class VoteChoice:
    ready: bool
    candidate: int | None = None


def choose_vote(
    election: Election,
    members: Iterable[int],
    expected: set[int],
    last_executor: int | None,
    now: float,
    first_lead_at: float | None,
    first_proposal_at: float | None,
    lead_timeout: float,
    no_lead_timeout: float,
) -> VoteChoice:
    """Whether this replica should vote now, and for whom.

    ``members`` are all current members; ``expected`` those whose proposals are worth waiting for
    before choosing among LEADs (members believed alive). Failing for want of a LEAD needs a YIELD
    from every member, or ``no_lead_timeout``: a member that merely looks unreachable may still
    be the one that got execute_request.
    the times are this replica's monotonic clock when it saw the first committed LEAD/proposal.
    """
    if election.phase is not Phase.PROPOSING:
        return VoteChoice(ready=False)
    all_in = expected.issubset(election.proposals.keys())
    if election.leads:
        if last_executor is not None and last_executor in election.leads:
            # sticky: the previous executor wins whatever the missing proposals say
            return VoteChoice(ready=True, candidate=last_executor)
        if (
            last_executor is None
            or election.proposals.get(last_executor) is not None  # it yielded
            or last_executor not in expected  # gone or unreachable
        ):
            # nobody can outrank the first committed LEAD any more: waiting changes nothing
            return VoteChoice(ready=True, candidate=election.leads[0])
        lead_timed_out = first_lead_at is not None and now - first_lead_at >= lead_timeout
        if not (all_in or lead_timed_out):
            return VoteChoice(ready=False)
        if last_executor is not None and last_executor in election.leads:
            return VoteChoice(ready=True, candidate=last_executor)
        return VoteChoice(ready=True, candidate=election.leads[0])
    if election.proposals and set(members).issubset(election.proposals.keys()):
        return VoteChoice(ready=True, candidate=None)  # every member yielded
    if first_proposal_at is not None and now - first_proposal_at >= no_lead_timeout:
        return VoteChoice(ready=True, candidate=None)
    return VoteChoice(ready=False)
