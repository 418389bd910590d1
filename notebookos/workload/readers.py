"""Trace readers: ``template`` (NotebookOS session templates), ``tiresias``, ``muri``,
``canonical``. Units are explicit: each format has a default that ``time_unit`` overrides."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from notebookos.resources import InvalidResourceSpec, ResourceSpec
from notebookos.workload.model import Session, Task, TraceError, Workload, jobs_workload

FORMATS = ("template", "tiresias", "muri", "canonical")
TIME_UNITS = {"ms": 0.001, "s": 1.0, "min": 60.0}
DEFAULT_TIME_UNIT = {"tiresias": "s", "muri": "ms", "canonical": "s", "template": "min"}
TEMPLATE_TICK_S = 60.0  # one template tick is 60 s (NotebookOS-Dashboard workload driver)


def read_trace(path: str | Path, fmt: str, time_unit: str | None = None) -> Workload:
    """Read ``path`` as ``fmt``; ``time_unit`` (ms, s, min) overrides the format's default."""
    path = Path(path)
    if fmt not in FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}; known formats: {', '.join(FORMATS)}")
    unit = time_unit or DEFAULT_TIME_UNIT[fmt]
    if unit not in TIME_UNITS:
        raise TraceError(f"unknown time unit {unit!r}; known: {', '.join(TIME_UNITS)}")
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    if fmt == "template":
        return read_template(path, TIME_UNITS[unit])
    return read_job_csv(path, fmt, TIME_UNITS[unit])


def _number(path: Path, line: int, row: dict, column: str) -> float:
    raw = row.get(column)
    if raw is None or raw == "":
        raise TraceError(f"{path}:{line}: column {column!r} is missing")
    try:
        value = float(raw)
    except ValueError:
        raise TraceError(f"{path}:{line}: column {column!r}={raw!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{path}:{line}: column {column!r}={raw!r} must be finite and >= 0")
    return value


def read_job_csv(path: Path, fmt: str, seconds_per_unit: float) -> Workload:
    rows: list[tuple[str, float, float, int, str, str, float, float]] = []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        needed = {"job_id", "submit_time", "duration", "num_gpu"}
        missing = needed - set(reader.fieldnames or ())
        if missing:
            raise TraceError(f"{path}: not a {fmt} CSV: missing column(s) {sorted(missing)}")
        # Muri's traces give each job's steps: ``iterations`` of ``iteration_time`` (the trace's
        # time unit); the step-counting engine (gavel-ftf) runs on them.
        steps = {"iterations", "iteration_time"} <= set(reader.fieldnames or ())
        seen: set[str] = set()
        for line, row in enumerate(reader, start=2):
            job_id = (row["job_id"] or "").strip()
            if not job_id:
                raise TraceError(f"{path}:{line}: empty job_id")
            if job_id in seen:
                raise TraceError(f"{path}:{line}: duplicate job_id {job_id!r}")
            seen.add(job_id)
            gpus = _number(path, line, row, "num_gpu")
            if gpus != int(gpus) or gpus < 1:
                raise TraceError(f"{path}:{line}: num_gpu={row['num_gpu']!r} must be an integer >= 1")
            submit = _number(path, line, row, "submit_time") * seconds_per_unit
            duration = _number(path, line, row, "duration") * seconds_per_unit
            name = (row.get("model_name") or row.get("job_name") or "").strip()
            user = (row.get("user") or "").strip()
            iterations = iteration_s = 0.0
            if steps and row["iterations"] and row["iteration_time"]:  # (an empty cell: unknown)
                iterations = _number(path, line, row, "iterations")
                iteration_s = _number(path, line, row, "iteration_time") * seconds_per_unit
            rows.append((job_id, submit, duration, int(gpus), name, user, iterations, iteration_s))
    if not rows:
        raise TraceError(f"{path}: the trace has no jobs")
    return jobs_workload(rows, str(path))


def _field(training: dict, *names: str, default: float = 0.0) -> float:
    for name in names:
        if name in training and training[name] is not None:
            return float(training[name])
    return default


def read_template(path: Path, seconds_per_unit: float = TEMPLATE_TICK_S) -> Workload:
    """A NotebookOS-Dashboard session template: ticks of 60 s (``time_unit`` min, the default).

    Per training: ``start_tick``, ``duration_in_ticks``, ``cpus``/``millicpus`` (millicpus),
    ``memory`` (MB), ``vram`` (GB); the GPU count is the length of ``gpu_utilizations`` (as the
    workload driver uses it), else ``gpus``/``num_gpus``. ``timescaleAdjustmentFactor`` only
    speeds up the live driver and is ignored here.
    """
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TraceError(f"{path}: not a readable JSON template: {exc}") from None
    raw_sessions = data.get("sessions") if isinstance(data, dict) else None
    if not isinstance(raw_sessions, list):
        raise TraceError(f"{path}: a template needs a 'sessions' list")
    sessions = []
    for si, raw in enumerate(raw_sessions):
        where = f"{path}: session #{si}"
        try:
            sid = str(raw.get("id") or f"session-{si}")
            start = float(raw["start_tick"]) * seconds_per_unit
            stop = float(raw["stop_tick"]) * seconds_per_unit
            tasks = []
            for ti, tr in enumerate(raw.get("trainings") or []):
                utils = tr.get("gpu_utilizations")
                gpus = len(utils) if isinstance(utils, list) and utils else int(
                    _field(tr, "gpus", "num_gpus"))
                spec = ResourceSpec(
                    millicpus=int(math.ceil(_field(tr, "millicpus", "cpus"))),
                    memory_mb=int(math.ceil(_field(tr, "memory", "memory_mb"))),
                    gpus=gpus,
                    vram_gb=_field(tr, "vram", "vram_gb"),
                )
                submit = float(tr["start_tick"]) * seconds_per_unit
                duration = float(tr["duration_in_ticks"]) * seconds_per_unit
                if duration < 0 or submit < 0:
                    raise ValueError("negative start or duration")
                tasks.append(Task(f"{sid}/{ti}", sid, submit, duration, spec,
                                  str(tr.get("name") or ""), sid))
        except (KeyError, TypeError, ValueError, AttributeError, InvalidResourceSpec) as exc:
            raise TraceError(f"{where}: malformed session or training: {exc}") from None
        if stop < start:
            raise TraceError(f"{where}: stop_tick is before start_tick")
        tasks.sort(key=lambda t: t.submit)
        request = _largest(tasks)
        sessions.append(Session(sid, start, stop, request, tuple(tasks)))
    if not sessions:
        raise TraceError(f"{path}: the template has no sessions")
    sessions.sort(key=lambda s: (s.start, s.session_id))
    return Workload(tuple(sessions), str(path), job_trace=False)


def _largest(tasks: list[Task]) -> ResourceSpec:
    from notebookos.workload.model import session_request

    return session_request(tasks, ResourceSpec(millicpus=100, memory_mb=128, gpus=1, vram_gb=1.0))
