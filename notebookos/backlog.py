"""A FIFO of multipart ZMQ messages bounded by count and by bytes: the oldest go first.

Used where IOPub messages must wait for a subscriber instead of being dropped by a PUB socket:
in the kernel replica (no Global Scheduler subscribed, e.g. while it restarts) and in the Global
Scheduler's front (no client subscribed yet after a restart). Not thread-safe: each owner uses it
from one thread.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

DEFAULT_MAX_MESSAGES = 10_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


def frames_size(frames: Sequence[Any]) -> int:
    """Bytes in a multipart message (bytes, memoryviews, zmq.Frame or anything with a buffer)."""
    total = 0
    for frame in frames:
        try:
            total += memoryview(frame).nbytes
        except TypeError:  # e.g. str
            total += len(frame)
    return total


class Backlog:
    """Messages (each with an opaque ``extra``) in arrival order, at most ``max_messages`` and
    ``max_bytes``; appending beyond a bound drops the oldest and counts it in ``dropped``."""

    def __init__(self, max_messages: int = DEFAULT_MAX_MESSAGES,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_messages < 1 or max_bytes < 1:
            raise ValueError("a backlog needs room for at least one message")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.dropped = 0
        self.bytes = 0
        self._items: deque[tuple[list[Any], Any, int]] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def append(self, frames: Sequence[Any], extra: Any = None) -> int:
        """Keep ``frames``; returns how many older messages this dropped (0 almost always)."""
        size = frames_size(frames)
        self._items.append((list(frames), extra, size))
        self.bytes += size
        dropped = 0
        # A single message larger than max_bytes is kept alone rather than dropped on arrival.
        while len(self._items) > self.max_messages or (
            self.bytes > self.max_bytes and len(self._items) > 1
        ):
            _, _, old = self._items.popleft()
            self.bytes -= old
            dropped += 1
        self.dropped += dropped
        return dropped

    def popleft(self) -> tuple[list[Any], Any]:
        frames, extra, size = self._items.popleft()
        self.bytes -= size
        return frames, extra

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0
