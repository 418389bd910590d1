"""The replay's progress bar (tqdm): tasks done, sessions open, elapsed and remaining trace time.
Silent when stderr is not a terminal or when asked to be quiet."""

from __future__ import annotations

import sys
from typing import Any


class ReplayProgress:
    def __init__(self, tasks: int, span_s: float, quiet: bool = False) -> None:
        from tqdm import tqdm

        self.span_s = span_s
        self.bar = tqdm(total=tasks, unit="cell", desc="replay", file=sys.stderr,
                        disable=True if quiet else None, dynamic_ncols=True, leave=True)

    def __call__(self, state: dict[str, Any]) -> None:
        if self.bar.disable:
            return
        done = int(state.get("done", 0))
        if done != self.bar.n:
            self.bar.update(done - self.bar.n)
        elapsed = float(state.get("elapsed_s", 0.0))
        self.bar.set_postfix_str(
            f"sessions open {state.get('open_sessions', 0)}, trace time "
            f"{elapsed:.0f}/{self.span_s:.0f} s, {max(0.0, self.span_s - elapsed):.0f} s left",
            refresh=True)

    def close(self) -> None:
        self.bar.close()
