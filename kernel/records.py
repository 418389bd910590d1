"""The typed records of a kernel's replicated log.

Every record is a small frozen dataclass. They travel through Raft (pickled inside pysyncobj's
encrypted transport) and are applied, in commit order, by every replica to the same
``ElectionBook`` (see ``election.py``). Nothing here touches sockets or threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LEAD = "LEAD"
YIELD = "YIELD"


@dataclass(frozen=True)
class Proposal:
    """A replica's bid for one execute request: LEAD (it got execute_request) or YIELD."""

    election_id: str  # the request's header.msg_id, identical on every replica
    replica_id: int
    kind: str  # LEAD or YIELD
    silent: bool = False  # the request's content.silent: a silent cell takes no execution_count


@dataclass(frozen=True)
class Vote:
    """A replica's vote: the candidate it saw win, or None when no replica proposed LEAD."""

    election_id: str
    voter: int
    candidate: int | None


@dataclass(frozen=True)
class Completion:
    """The executor finished the cell; carries the state-sync update (None when there is none)."""

    election_id: str
    executor: int
    status: str  # the executor's reply status: "ok" | "error" | "aborted"
    update: bytes | None = None  # SyncUpdate.to_bytes()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Abort:
    """The executor is presumed dead mid-cell: the cell fails and its effects are discarded."""

    election_id: str
    proposer: int
    reason: str


@dataclass(frozen=True)
class MemberAdded:
    replica_id: int
    address: str


@dataclass(frozen=True)
class MemberRemoved:
    replica_id: int


@dataclass(frozen=True)
class Checkpointed:
    """A full checkpoint of the namespace as of ``execution_count`` is in the store."""

    execution_count: int
    election_id: str = ""


@dataclass(frozen=True)
class Restored:
    """A group rebuilt from a store checkpoint starts counting after ``execution_count``."""

    execution_count: int
    replica_id: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    # names the proposing replica could not restore: the group's committed state lacks them (the
    # user is told), so a replica that restored them drops them and one that also failed them
    # is not behind for that reason
    failed: tuple[str, ...] = field(default_factory=tuple)


Record = (
    Proposal | Vote | Completion | Abort | MemberAdded | MemberRemoved | Checkpointed | Restored
)
