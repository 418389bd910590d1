"""What a replay plays: a workload read from a template, a Sensei CSV or the generator, sliced
(time window, first N sessions) and compressed in time.

Times in a plan are seconds of replay (wall) time from the start of the run: trace times
multiplied by the time scale.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from notebookos.resources import ResourceSpec
from notebookos.workload.model import Session, Task, TraceError, Workload

INPUT_KINDS = ("template", "sensei", "generate")
_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "": 1.0}


def parse_duration(text: str) -> float:
    """``"90m"``, ``"2h"``, ``"3600"`` (seconds), ``"1.5d"`` -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|)\s*", text or "")
    if not match:
        raise ValueError(f"{text!r} is not a duration: expected a number with an optional unit "
                         "s, m, h or d (e.g. 90m, 2h)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_window(text: str) -> tuple[float, float]:
    """``"2h:4h"`` -> (7200, 14400) seconds of trace time."""
    start, sep, end = (text or "").partition(":")
    if not sep:
        raise ValueError(f"--window {text!r}: expected START:END, e.g. 2h:4h or 0:90m")
    a, b = parse_duration(start), parse_duration(end)
    if not b > a:
        raise ValueError(f"--window {text!r}: the end must be after the start")
    return a, b


def load_input(kind: str, path: Path | None, seed: int, hours: float | None = None,
               idle_sessions: bool = True) -> Workload:
    """Read the input (see docs/replay.md): ``template`` (a session template JSON), ``sensei``
    (a Sensei job CSV in the Tiresias format, times in minutes unless the file name says
    ``_sec``, grouped into sessions by the Sensei model), ``generate`` (the Sensei-calibrated
    generator's own output, ``hours`` long)."""
    from notebookos.workload.readers import read_trace

    if kind == "template":
        if path is None:
            raise TraceError("a template replay needs the template's path")
        return read_trace(path, "template")
    if kind == "sensei":
        from notebookos.workload.sessionize import sessionize

        if path is None:
            raise TraceError("a Sensei replay needs the CSV's path")
        unit = "s" if "_sec" in path.name or "canonical" in path.name else "min"
        fmt = "canonical" if "canonical" in path.name else "tiresias"
        return sessionize(read_trace(path, fmt, unit), seed=seed, idle_sessions=idle_sessions)
    if kind == "generate":
        import json
        import tempfile

        from notebookos.workload.generator import SenseiParams, generate_sensei
        from notebookos.workload.readers import read_template

        if not hours or hours <= 0:
            raise ValueError("--input generate needs --hours > 0")
        template = generate_sensei(SenseiParams(hours=hours, seed=seed))
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / f"sensei-{hours:g}h-seed{seed}.json"
            out.write_text(json.dumps(template))
            workload = read_template(out)
        return replace(workload, source=f"generated: Sensei model, {hours:g} h, seed {seed}")
    raise ValueError(f"unknown input {kind!r}; known: {', '.join(INPUT_KINDS)}")


def window(workload: Workload, start: float, end: float) -> Workload:
    """Tasks submitted in ``[start, end)`` and the sessions alive then, shifted so that ``start``
    is 0. A session is cut to the window (a task running past its end keeps its session open
    until the task ends)."""
    sessions = []
    for s in workload.sessions:
        stop = s.stop if s.stop is not None else max(
            (t.submit + t.duration for t in s.tasks), default=s.start)
        tasks = tuple(replace(t, submit=t.submit - start) for t in s.tasks
                      if start <= t.submit < end)
        if not tasks and (stop <= start or s.start >= end):
            continue
        last_end = max((t.submit + t.duration for t in tasks), default=0.0)
        new_start = max(s.start, start) - start
        new_stop = max(min(stop, end) - start, last_end, new_start)
        sessions.append(replace(s, start=new_start, stop=new_stop, tasks=tasks))
    if not sessions:
        raise TraceError(f"no session is alive in the window {start:g}-{end:g} s")
    return replace(workload, sessions=tuple(sessions))


def played_until(workload: Workload, end: float) -> Workload | None:
    """The part of a plan a run stopped at ``end`` played: cells due before ``end``, sessions
    started by then, cut there (a cell running past it keeps its session). None if nothing."""
    if not end > 0:
        return None
    try:
        return window(workload, 0.0, end)
    except TraceError:
        return None


def first_sessions(workload: Workload, count: int, training_only: bool = False) -> Workload:
    """The first ``count`` sessions by start time (only sessions that train, if asked)."""
    if count < 1:
        raise ValueError(f"--sessions {count} must be >= 1")
    pool = [s for s in workload.sessions if s.tasks or not training_only]
    if not pool:
        raise TraceError("the input has no session that trains")
    return replace(workload, sessions=tuple(pool[:count]))


def scale_time(workload: Workload, factor: float) -> Workload:
    """Every time and duration multiplied by ``factor`` (0.02 plays a 60 s tick in 1.2 s)."""
    if not factor > 0:
        raise ValueError(f"--time-scale {factor!r} must be > 0")

    def task(t: Task) -> Task:
        return replace(t, submit=t.submit * factor, duration=t.duration * factor)

    return replace(workload, sessions=tuple(
        replace(s, start=s.start * factor, stop=None if s.stop is None else s.stop * factor,
                tasks=tuple(task(t) for t in s.tasks)) for s in workload.sessions))


def rebase_to_zero(workload: Workload) -> Workload:
    """Shift times so that the first session starts at 0 (no idle wait before the first one)."""
    first = min((s.start for s in workload.sessions), default=0.0)
    if first <= 0:
        return workload
    return replace(workload, sessions=tuple(
        replace(s, start=s.start - first, stop=None if s.stop is None else s.stop - first,
                tasks=tuple(replace(t, submit=t.submit - first) for t in s.tasks))
        for s in workload.sessions))


def kernel_gpus(needed: int, offered: list[int]) -> int:
    """The smallest GPU count among the offered kernelspecs that covers ``needed``."""
    fits = sorted(g for g in offered if g >= needed)
    if not fits:
        raise TraceError(f"a session needs {needed} GPU(s) per cell but the server's NotebookOS "
                         f"kernelspecs offer at most {max(offered, default=0)}")
    return fits[0]


# What the NotebookOS provisioner asks for per replica unless its kernelspec says otherwise
# (provisioner/provisioner.py's traits; tests/replay checks they stay equal).
PROVISIONER_MILLICPUS = 1000
PROVISIONER_MEMORY_MB = 2048
PROVISIONER_VRAM_GB = 0.0


def kernelspec_request(gpus: int, config: dict | None = None) -> ResourceSpec:
    """The request of a NotebookOS kernelspec whose provisioner config is ``config``."""
    config = config or {}
    return ResourceSpec(int(config.get("millicpus", PROVISIONER_MILLICPUS)),
                        int(config.get("memory_mb", PROVISIONER_MEMORY_MB)), gpus,
                        float(config.get("vram_gb", PROVISIONER_VRAM_GB)))


def as_played(workload: Workload, offered: dict[int, ResourceSpec]) -> Workload:
    """The workload as the live system runs it: a kernel's request is its kernelspec's (the
    smallest offered GPU count that covers the session's largest training; CPU, memory and GPU
    memory as the provisioner asks), and it binds those GPUs for every cell. The simulator gets
    this same workload."""
    sessions = []
    for s in workload.sessions:
        request = offered[kernel_gpus(s.request.gpus, list(offered))]
        sessions.append(replace(s, request=request, tasks=tuple(
            replace(t, request=request) for t in s.tasks)))
    return replace(workload, sessions=tuple(sessions))


def session_stop(session: Session) -> float:
    return session.stop if session.stop is not None else max(
        (t.submit + t.duration for t in session.tasks), default=session.start)


def played_to_json(workload: Workload) -> list[dict]:
    """The plan as played, for ``plan.json`` (read back by ``played_from_json``)."""
    def spec(r: ResourceSpec) -> dict:
        return {"millicpus": r.millicpus, "memory_mb": r.memory_mb, "gpus": r.gpus,
                "vram_gb": r.vram_gb}

    return [{"session_id": s.session_id, "start": s.start, "stop": s.stop,
             "request": spec(s.request),
             "tasks": [{"task_id": t.task_id, "submit": t.submit, "duration": t.duration,
                        "request": spec(t.request)} for t in s.tasks]}
            for s in workload.sessions]


def played_from_json(data: list[dict], source: str) -> Workload:
    try:
        return Workload(tuple(
            Session(s["session_id"], float(s["start"]),
                    None if s["stop"] is None else float(s["stop"]), ResourceSpec(**s["request"]),
                    tuple(Task(t["task_id"], s["session_id"], float(t["submit"]),
                               float(t["duration"]), ResourceSpec(**t["request"]))
                          for t in s["tasks"]))
            for s in data), source)
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceError(f"{source}: not a replay plan: {exc!r}") from None
