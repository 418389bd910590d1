"""The simulator's progress bar: tqdm on stderr, one bar per policy run, percent of the workload
done; silent when stderr is not a terminal (tqdm's ``disable=None``) or when asked to be quiet."""

from __future__ import annotations

import sys
from typing import TextIO


class ProgressBar:
    """A callable taking the fraction done (0..1), as the engines report it."""

    def __init__(self, label: str, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        from tqdm import tqdm

        disable = None if enabled is None else not enabled
        self.bar = tqdm(total=1000, desc=label, file=stream or sys.stderr, disable=disable,
                        unit="‰", bar_format="{desc}: {percentage:5.1f}%|{bar}| {elapsed}",
                        dynamic_ncols=True, leave=True)

    def __call__(self, fraction: float) -> None:
        if self.bar.disable:
            return
        done = int(round(1000 * min(1.0, max(0.0, fraction))))
        if done > self.bar.n:
            self.bar.update(done - self.bar.n)
        if done >= 1000:
            self.bar.close()

    def close(self) -> None:
        self.bar.close()
