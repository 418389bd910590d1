"""Per-cell GPU binding on one host: commit device ids to a replica for one request.

Thread-safe. A replica holds at most one commitment at a time (one cell runs at a time); a repeated
commit for the same request id returns the same devices.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CommitResult:
    committed: bool
    device_ids: tuple[int, ...]
    reason: str
    gpus_idle: int


class GpuBinder:
    def __init__(self, device_ids: list[int]) -> None:
        self._all = tuple(device_ids)
        self._free = list(device_ids)
        self._by_request: dict[str, tuple[str, tuple[int, ...]]] = {}  # request -> (owner, ids)
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        return len(self._all)

    @property
    def idle(self) -> int:
        with self._lock:
            return len(self._free)

    def committed_ids(self) -> list[int]:
        with self._lock:
            return sorted(i for _, ids in self._by_request.values() for i in ids)

    def committed_to(self, owner: str) -> list[int]:
        with self._lock:
            return sorted(i for o, ids in self._by_request.values() if o == owner for i in ids)

    def commit(
        self, owner: str, request_id: str, gpus: int, preferred: list[int] | None = None
    ) -> CommitResult:
        with self._lock:
            held = self._by_request.get(request_id)
            if held is not None:
                if held[0] != owner:
                    return CommitResult(False, (), f"request {request_id} is bound to {held[0]}",
                                        len(self._free))
                return CommitResult(True, held[1], "already committed", len(self._free))
            other = [r for r, (o, _) in self._by_request.items() if o == owner]
            if other:
                return CommitResult(
                    False, (), f"{owner} still holds GPUs for request {other[0]}", len(self._free)
                )
            if gpus > len(self._free):
                return CommitResult(
                    False, (),
                    f"{gpus} GPU(s) requested, {len(self._free)} of {len(self._all)} idle",
                    len(self._free),
                )
            want = [i for i in (preferred or []) if i in self._free][:gpus]
            rest = [i for i in sorted(self._free) if i not in want]
            chosen = tuple(want + rest[: gpus - len(want)])
            for i in chosen:
                self._free.remove(i)
            self._by_request[request_id] = (owner, chosen)
            return CommitResult(True, chosen, "", len(self._free))

    def release(self, request_id: str) -> tuple[int, ...]:
        with self._lock:
            held = self._by_request.pop(request_id, None)
            if held is None:
                return ()
            self._free.extend(held[1])
            return held[1]

    def release_owner(self, owner: str) -> tuple[int, ...]:
        """Release everything ``owner`` holds (its replica died or stopped)."""
        with self._lock:
            freed: list[int] = []
            for request_id in [r for r, (o, _) in self._by_request.items() if o == owner]:
                freed.extend(self._by_request.pop(request_id)[1])
            self._free.extend(freed)
            return tuple(freed)
