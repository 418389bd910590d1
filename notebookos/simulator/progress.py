"""A tiny progress bar on stderr; silent when stderr is not a terminal or when asked to be."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    def __init__(self, label: str, stream: TextIO | None = None, enabled: bool | None = None,
                 width: int = 30) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label = label
        self.width = width
        self._last = -1.0
        self._started = time.monotonic()

    def __call__(self, fraction: float) -> None:
        if not self.enabled:
            return
        fraction = min(1.0, max(0.0, fraction))
        if fraction < 1.0 and fraction - self._last < 0.01:
            return
        self._last = fraction
        filled = int(self.width * fraction)
        elapsed = time.monotonic() - self._started
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] "
                          f"{fraction * 100:5.1f}% {elapsed:6.1f}s")
        if fraction >= 1.0:
            self.stream.write("\n")
        self.stream.flush()
