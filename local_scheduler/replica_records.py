"""The process launcher's record of its running replicas, so that a restarted Local Scheduler takes
them back (issue 33: a Local Scheduler's restart loses no replica).

One JSON file in the launcher's working directory, rewritten whole (a temporary file renamed over
it) whenever a replica starts or exits: who the replicas are (their spec, pid and start time,
ports, Raft address, resources, log) and which Local Scheduler holds them now (``ls_pid``). A
replica whose Local Scheduler died reads it to learn whether a successor took it back
(``orphan_watch.py``).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

STATE_FILE = "replicas.json"
ENV_LS_PID = "NOTEBOOKOS_LS_PID_NOW"  # the Local Scheduler that started the replica
ENV_STATE_FILE = "NOTEBOOKOS_LS_STATE_FILE"  # this file, for the replica's orphan watch
ENV_ORPHAN_GRACE_S = "NOTEBOOKOS_ORPHAN_GRACE_S"  # how long a replica waits for a successor


class ReplicaRecords:
    """The records, owned by one launcher; ``save`` after each change."""

    def __init__(self, workdir: Path) -> None:
        self.path = Path(workdir) / STATE_FILE
        self._lock = threading.Lock()
        self._records: dict[str, dict[str, Any]] = {}

    def load(self) -> list[dict[str, Any]]:
        """The records a previous run left (none when the file is missing or unreadable)."""
        document = self._document()
        replicas = document.get("replicas")
        return [r for r in replicas if isinstance(r, dict)] if isinstance(replicas, list) else []

    def holder(self) -> int | None:
        """The pid of the Local Scheduler that wrote the records last (None: none yet)."""
        pid = self._document().get("ls_pid")
        return pid if isinstance(pid, int) else None

    def _document(self) -> dict[str, Any]:
        try:
            document = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return document if isinstance(document, dict) else {}

    def put(self, owner: str, record: dict[str, Any]) -> None:
        with self._lock:
            self._records[owner] = record
            self._save()

    def drop(self, owner: str) -> None:
        with self._lock:
            if self._records.pop(owner, None) is not None:
                self._save()

    def save(self) -> None:
        with self._lock:
            self._save()

    def _save(self) -> None:
        document = {"ls_pid": os.getpid(), "replicas": list(self._records.values())}
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(document))
        os.replace(temporary, self.path)


def record_of(replica: Any, resources: Any, ticks: int | None) -> dict[str, Any]:
    """A ``LaunchedReplica`` as a record (``ReplicaSpec`` and ``ResourceSpec`` are dataclasses)."""
    spec = asdict(replica.spec)
    return {
        "spec": spec, "pid": replica.pid, "start_ticks": ticks, "ip": replica.ip,
        "ports": dict(replica.ports), "raft_address": replica.raft_address,
        "log_path": str(replica.log_path) if replica.log_path is not None else None,
        "started_unix": replica.started_unix, "forked": replica.forked,
        "from_prewarm_pool": replica.from_prewarm_pool,
        "resources": list(asdict(resources).values()) if resources is not None else None,
    }


def holder_of(path: str | os.PathLike[str], pid: int) -> int | None:
    """The pid of the Local Scheduler whose records list replica ``pid`` (None: none does)."""
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict) or not isinstance(document.get("ls_pid"), int):
        return None
    replicas = document.get("replicas")
    if isinstance(replicas, list) and any(
            isinstance(r, dict) and r.get("pid") == pid for r in replicas):
        return int(document["ls_pid"])
    return None
