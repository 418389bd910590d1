"""The replay's progress bar (tqdm): cells done, sessions open, elapsed and remaining trace time
(and the replay time it is played in). Silent when stderr is not a terminal or when asked to be
quiet."""

from __future__ import annotations

import sys
from typing import Any, TextIO


def trace_span(seconds: float) -> str:
    """A trace duration in the unit a person reads it in: ``"45 s"``, ``"12.5 min"``, ``"8.6 h"``."""
    if seconds >= 7200:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


class ReplayProgress:
    def __init__(self, tasks: int, span_s: float, quiet: bool = False, time_scale: float = 1.0,
                 file: TextIO | None = None) -> None:
        from tqdm import tqdm

        self.span_s = span_s  # replay (wall) seconds
        self.time_scale = time_scale
        self.bar = tqdm(total=tasks, unit="cell", desc="replay", file=file or sys.stderr,
                        disable=True if quiet else None, dynamic_ncols=True, leave=True)

    def postfix(self, state: dict[str, Any]) -> str:
        elapsed = min(float(state.get("elapsed_s", 0.0)), self.span_s)
        left = self.span_s - elapsed
        trace = (f"trace {trace_span(elapsed / self.time_scale)} of "
                 f"{trace_span(self.span_s / self.time_scale)}, "
                 f"{trace_span(left / self.time_scale)} left")
        return (f"sessions open {state.get('open_sessions', 0)}, {trace} (replay "
                f"{elapsed:.0f}/{self.span_s:.0f} s)")

    def __call__(self, state: dict[str, Any]) -> None:
        if self.bar.disable:
            return
        done = int(state.get("done", 0))
        if done != self.bar.n:
            self.bar.update(done - self.bar.n)
        self.bar.set_postfix_str(self.postfix(state), refresh=True)

    def close(self) -> None:
        self.bar.close()
