"""execute_reply contents for the replica's roles (the wire contract: docs/kernel-protocol.md)."""

from __future__ import annotations

from typing import Any

from .election import Election

ALL_YIELDED = "NotebookOSAllReplicasYielded"
EXECUTOR_FAILED = "NotebookOSExecutorFailed"
ID_REUSED = "NotebookOSRequestIdReused"

Reply = tuple[dict[str, Any], dict[str, Any]]


def role_metadata(role: str, replica_id: int, election: Election) -> dict[str, Any]:
    """``metadata.notebookos`` of a reply: who answered, in which role, who executed, the term."""
    return {
        "notebookos": {
            "role": role,
            "replica_id": replica_id,
            "executor": election.executor,
            "term": election.term,
            "execution_count": election.execution_count,
        }
    }


def standby(election: Election, replica_id: int) -> Reply:
    """A standby's reply once the executor completed the cell and its state is applied here."""
    metadata = role_metadata("standby", replica_id, election)
    metadata["notebookos"]["executor_status"] = election.status
    content = {
        "status": "ok",
        "execution_count": election.execution_count,
        "user_expressions": {},
        "payload": [],
    }
    return content, metadata


def all_yielded(election: Election, replica_id: int) -> Reply:
    """Every replica yielded: nothing ran; the scheduler should migrate and resubmit."""
    evalue = (
        f"every replica yielded execution of this request (term {election.term}); "
        "nothing ran. The scheduler should migrate a replica to a host with free GPUs and resubmit."
    )
    content = {
        "status": "error",
        "ename": ALL_YIELDED,
        "evalue": evalue,
        "traceback": [f"{ALL_YIELDED}: {evalue}"],
        "execution_count": election.execution_count,
    }
    metadata = role_metadata("none", replica_id, election)
    metadata["notebookos"]["yielded"] = True
    return content, metadata


def executor_failed(election: Election, replica_id: int) -> Reply:
    """The executor died mid-cell: the cell failed and the namespace is the previous cell's."""
    evalue = (
        f"{election.abort_reason}. The cell did not complete; its effects were discarded and "
        "the namespace is that of the last completed cell. Run the cell again to retry."
    )
    content = {
        "status": "error",
        "ename": EXECUTOR_FAILED,
        "evalue": evalue,
        "traceback": [f"{EXECUTOR_FAILED}: {evalue}"],
        "execution_count": election.execution_count,
    }
    return content, role_metadata("standby", replica_id, election)


def id_reused(election_id: str, replica_id: int) -> Reply:
    """A request that reuses the msg_id of a different, earlier request: its cell cannot run
    under that id (one election per id), and the earlier cell's reply is not its own."""
    evalue = (
        f"the request reuses msg_id {election_id} of an earlier request, so it did not run; "
        "run the cell again (the client should give every request a new msg_id)"
    )
    content = {
        "status": "error",
        "ename": ID_REUSED,
        "evalue": evalue,
        "traceback": [f"{ID_REUSED}: {evalue}"],
        "execution_count": None,
    }
    return content, {"notebookos": {"role": "none", "replica_id": replica_id}}
