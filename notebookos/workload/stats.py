"""``trace stats``: the figures the Sensei calibration is checked against (traces/README.md)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from notebookos.workload.model import Workload

SENSEI_TARGETS = {
    "task_duration_min": {"p50": 2, "p75": 5, "p90": 17, "p95": 36, "p99": 182},
    "gap_min": {"min": 4, "p50": 5, "p75": 8},
    "idle_reserved_gpu_fraction": "> 0.81",
    "sessions_util_le_5pct": "0.74-0.75",
    "sessions_util_le_31pct": "0.90",
    "excerpt_17_5h": "active sessions max 90; concurrent trainings mean 19.5, median 19, max 34",
}


def _pcts(values: list[float], keys=(50, 75, 90, 95, 99)) -> dict:
    if not values:
        return {}
    arr = np.asarray(values, dtype=float)
    out = {f"p{k}": round(float(np.percentile(arr, k)), 3) for k in keys}
    out["min"] = round(float(arr.min()), 3)
    out["max"] = round(float(arr.max()), 3)
    return out


def _step_stats(changes: list[tuple[float, int]], end: float) -> dict:
    """Time-weighted mean, median and max of a step function given as (+1/-1 at time) events."""
    if not changes:
        return {"mean": 0.0, "median": 0.0, "max": 0}
    changes.sort()
    level, last, levels, weights, peak = 0, changes[0][0], [], [], 0
    for t, delta in changes:
        if t > last:
            levels.append(level)
            weights.append(t - last)
            last = t
        level += delta
        peak = max(peak, level)
    if end > last:
        levels.append(level)
        weights.append(end - last)
    lv, w = np.asarray(levels, dtype=float), np.asarray(weights, dtype=float)
    order = np.argsort(lv)
    cum = np.cumsum(w[order])
    median = float(lv[order][np.searchsorted(cum, cum[-1] / 2)]) if cum.size else 0.0
    return {"mean": round(float((lv * w).sum() / w.sum()), 3) if w.sum() else 0.0,
            "median": median, "max": peak}


def trace_stats(workload: Workload, progress: Callable[[int], None] | None = None) -> dict:
    """Calibration statistics; ``progress`` is told the sessions done so far, every 256."""
    durations, gaps, utils = [], [], []
    session_changes, task_changes = [], []
    reserved_gpu_s = busy_gpu_s = 0.0
    idle_sessions = 0
    end = workload.span_s
    for done, s in enumerate(workload.sessions, start=1):
        if progress is not None and done % 256 == 0:
            progress(done)
        stop = s.stop if s.stop is not None else max((t.submit + t.duration for t in s.tasks),
                                                     default=s.start)
        life = max(stop - s.start, 1e-9)
        session_changes += [(s.start, 1), (stop, -1)]
        busy = sum(t.duration * t.gpus for t in s.tasks)
        reserved = life * s.request.gpus
        reserved_gpu_s += reserved
        busy_gpu_s += busy
        utils.append(busy / reserved if reserved else 0.0)
        if not s.tasks:
            idle_sessions += 1
        previous_end = None
        for t in s.tasks:
            durations.append(t.duration / 60)
            task_changes += [(t.submit, 1), (t.submit + t.duration, -1)]
            if previous_end is not None:
                gaps.append((t.submit - previous_end) / 60)
            previous_end = t.submit + t.duration
    n = max(1, len(workload.sessions))
    return {
        "sessions": len(workload.sessions),
        "tasks": workload.task_count,
        "span_hours": round(end / 3600, 3),
        "task_duration_min": _pcts(durations),
        "gap_min": _pcts(gaps),
        "active_sessions": _step_stats(session_changes, end),
        "concurrent_trainings": _step_stats(task_changes, end),
        "idle_reserved_gpu_fraction": round(1 - busy_gpu_s / reserved_gpu_s, 4)
        if reserved_gpu_s else None,
        "sessions_never_training": round(idle_sessions / n, 4),
        "sessions_util_le_5pct": round(sum(u <= 0.05 for u in utils) / n, 4),
        "sessions_util_le_31pct": round(sum(u <= 0.3113 for u in utils) / n, 4),
        "sensei_targets": SENSEI_TARGETS,
    }
