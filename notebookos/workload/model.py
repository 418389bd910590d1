"""The workload model the simulator runs: sessions with GPU tasks (cells, or batch jobs).

A batch-job trace is a workload of one-task sessions (``job_trace=True``); a session template is
a workload of long sessions with many short tasks. Times are seconds from the trace's start.
"""

from __future__ import annotations

from dataclasses import dataclass

from notebookos.resources import ResourceSpec


class TraceError(ValueError):
    """A trace file cannot be read; the message names the file, the line and the problem."""


@dataclass(frozen=True, slots=True)
class Task:
    task_id: str
    session_id: str
    submit: float
    duration: float
    request: ResourceSpec
    name: str = ""  # the job's model or name where the trace has one (Tiresias/Muri model_name)
    user: str = ""  # who submitted it, where the trace says (else ""; a session's tasks: its id)
    # A training job's steps, where the trace says (Muri's ``iterations`` and ``iteration_time``;
    # 0: unknown). Only engines that count steps use them (gavel-ftf, job_ftf.py); ``duration``
    # stays the trace's own column.
    iterations: float = 0.0
    iteration_s: float = 0.0

    @property
    def gpus(self) -> int:
        return self.request.gpus


@dataclass(frozen=True, slots=True)
class Session:
    session_id: str
    start: float
    stop: float | None  # None: the session ends when its last task ends (batch jobs)
    request: ResourceSpec  # what the kernel subscribes or reserves: the largest task's request
    tasks: tuple[Task, ...]


@dataclass(frozen=True)
class Workload:
    sessions: tuple[Session, ...]
    source: str = ""
    job_trace: bool = False

    @property
    def tasks(self) -> list[Task]:
        return sorted(
            (t for s in self.sessions for t in s.tasks), key=lambda t: (t.submit, t.task_id)
        )

    @property
    def task_count(self) -> int:
        return sum(len(s.tasks) for s in self.sessions)

    @property
    def span_s(self) -> float:
        end = 0.0
        for s in self.sessions:
            end = max(end, s.stop or 0.0, *(t.submit + t.duration for t in s.tasks))
        return end


def session_request(tasks: list[Task], default: ResourceSpec) -> ResourceSpec:
    """Field-wise maximum of the tasks' requests (a kernel is sized for its largest cell)."""
    if not tasks:
        return default
    return ResourceSpec(
        max(t.request.millicpus for t in tasks),
        max(t.request.memory_mb for t in tasks),
        max(t.request.gpus for t in tasks),
        max(t.request.vram_gb for t in tasks),
    )


def jobs_workload(rows: list[tuple], source: str) -> Workload:
    """A batch-job trace: ``(job_id, submit_s, duration_s, gpus[, name[, user[, iterations,
    iteration_s]]])`` rows, one session each."""
    sessions = []
    for row in sorted(rows, key=lambda r: (r[1], r[0])):
        job_id, submit, duration, gpus = row[:4]
        name = row[4] if len(row) > 4 else ""
        user = row[5] if len(row) > 5 else ""
        iterations, iteration_s = row[6:8] if len(row) > 7 else (0.0, 0.0)
        spec = ResourceSpec(gpus=gpus)
        task = Task(job_id, job_id, submit, duration, spec, name, user, iterations, iteration_s)
        sessions.append(Session(job_id, submit, None, spec, (task,)))
    return Workload(tuple(sessions), source, job_trace=True)
