"""Give a job trace's jobs the model types a paper's simulation gave them.

Philly's job trace names no models; the Muri traces carry the 8 types Muri assigned, but
TensorShare's simulation (seed 001, sec. 4.1) drew each job's type at random from the 29 of its
Table 1 ("we follow the common practice ... by randomly assigning job types"). ``assign_types``
does the same, deterministically: a job's type is a hash of the seed and its id, so the same
trace and seed always give the same workload (``notebookos simulate --job-types table1``).
"""

from __future__ import annotations

import dataclasses
import hashlib

from notebookos.workload.interference import TYPES
from notebookos.workload.model import Workload

JOB_TYPE_SETS: dict[str, tuple[str, ...] | None] = {"trace": None, "table1": TYPES}


def type_of(job_id: str, types: tuple[str, ...], seed: int = 0) -> str:
    """The type a job with id ``job_id`` is given: uniform over ``types`` by a hash."""
    digest = hashlib.blake2b(f"{seed}:types:{job_id}".encode(), digest_size=8).digest()
    return types[int.from_bytes(digest, "big") % len(types)]


def assign_types(workload: Workload, which: str = "table1", seed: int = 0) -> Workload:
    """``workload`` with every task's name replaced by a type from the set ``which`` (``trace``:
    unchanged)."""
    if which not in JOB_TYPE_SETS:
        raise ValueError(f"job types {which!r}: expected one of {', '.join(JOB_TYPE_SETS)}")
    types = JOB_TYPE_SETS[which]
    if types is None:
        return workload
    sessions = tuple(
        dataclasses.replace(s, tasks=tuple(dataclasses.replace(t, name=type_of(t.task_id, types,
                                                                                  seed))
                                           for t in s.tasks))
        for s in workload.sessions)
    return dataclasses.replace(workload, sessions=sessions)
