"""Per-cell GPU binding on one host: commit device ids to a replica for one request.

Thread-safe. A replica holds at most one commitment at a time (one cell runs at a time); a repeated
commit for the same request id returns the same devices.

GPU sharing (TensorShare's pairs): a request committed ``shareable`` (its kernel accepts a
slowdown from sharing) holds its devices alone until the Global Scheduler sends a request with
``share``: that one may join devices each held by exactly one shareable request (the devices it
names, the ones the Global Scheduler's decision was about). So a device has at most two holders,
an exclusive request never lands on a held device, and an exclusive holder is never joined.
Releasing one of two holders leaves the other holding the device; it is free once both are gone.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

MAX_HOLDERS = 2  # TensorShare pairs: never three on one device


@dataclass(frozen=True, slots=True)
class CommitResult:
    committed: bool
    device_ids: tuple[int, ...]
    reason: str
    gpus_idle: int
    shared_ids: tuple[int, ...] = ()  # devices of this commit another request also holds


@dataclass(frozen=True, slots=True)
class _Hold:
    owner: str
    ids: tuple[int, ...]
    shareable: bool


class GpuBinder:
    def __init__(self, device_ids: list[int]) -> None:
        self._all = tuple(device_ids)
        self._holders: dict[int, list[str]] = {i: [] for i in device_ids}  # device -> requests
        self._by_request: dict[str, _Hold] = {}
        self._lock = threading.Condition()  # notified when GPUs are released

    @property
    def total(self) -> int:
        return len(self._all)

    @property
    def idle(self) -> int:
        with self._lock:
            return self._idle()

    def _idle(self) -> int:
        return sum(1 for held in self._holders.values() if not held)

    def _free(self) -> list[int]:
        return sorted(i for i, held in self._holders.items() if not held)

    def _joinable(self, device_id: int) -> bool:
        held = self._holders.get(device_id)
        return (held is not None and len(held) == 1
                and self._by_request[held[0]].shareable)

    def committed_ids(self) -> list[int]:
        """Devices held by at least one request (each once, however many hold it)."""
        with self._lock:
            return sorted(i for i, held in self._holders.items() if held)

    def committed_to(self, owner: str) -> list[int]:
        with self._lock:
            return sorted(i for h in self._by_request.values() if h.owner == owner for i in h.ids)

    def shared_devices(self) -> dict[int, list[str]]:
        """Devices two requests hold right now: device id -> the holders' owners (first holder
        first)."""
        with self._lock:
            return {i: [self._by_request[r].owner for r in held]
                    for i, held in sorted(self._holders.items()) if len(held) >= 2}

    def commit(
        self, owner: str, request_id: str, gpus: int, preferred: list[int] | None = None, *,
        shareable: bool = False, share: bool = False,
    ) -> CommitResult:
        """Commit ``gpus`` devices to ``owner`` for ``request_id``. ``shareable``: one other
        request may later join these devices. ``share`` (implies shareable): when too few
        devices are free, join devices of ``preferred`` (all held devices when it is empty)
        that exactly one shareable request holds."""
        shareable = shareable or share
        with self._lock:
            held = self._by_request.get(request_id)
            if held is not None:
                if held.owner != owner:
                    return CommitResult(False, (), f"request {request_id} is bound to "
                                        f"{held.owner}", self._idle())
                return CommitResult(True, held.ids, "already committed", self._idle(),
                                    self._shared_of(held.ids))
            other = [r for r, h in self._by_request.items() if h.owner == owner]
            if other:
                return CommitResult(
                    False, (), f"{owner} still holds GPUs for request {other[0]}", self._idle())
            free = self._free()
            want = [i for i in (preferred or []) if i in free][:gpus]
            chosen = want + [i for i in free if i not in want][: gpus - len(want)]
            if len(chosen) < gpus and share:
                candidates = preferred if preferred else sorted(self._holders)
                chosen += [i for i in dict.fromkeys(candidates)
                           if i not in chosen and self._joinable(i)][: gpus - len(chosen)]
            if len(chosen) < gpus:
                return CommitResult(False, (), self._refusal(gpus, share), self._idle())
            for i in chosen:
                self._holders[i].append(request_id)
            ids = tuple(chosen)
            self._by_request[request_id] = _Hold(owner, ids, shareable)
            return CommitResult(True, ids, "", self._idle(), self._shared_of(ids))

    def _shared_of(self, ids: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(i for i in ids if len(self._holders[i]) >= 2)

    def _refusal(self, gpus: int, share: bool) -> str:
        why = f"{gpus} GPU(s) requested, {self._idle()} of {len(self._all)} idle"
        if not share:
            return why
        shared = sum(1 for held in self._holders.values() if len(held) >= MAX_HOLDERS)
        exclusive = sum(1 for i, held in self._holders.items()
                        if len(held) == 1 and not self._joinable(i))
        return (f"{why}; none to share: {shared} already shared by two, {exclusive} held by a "
                "kernel that does not share")

    def release(self, request_id: str) -> tuple[int, ...]:
        with self._lock:
            held = self._by_request.pop(request_id, None)
            if held is None:
                return ()
            for i in held.ids:
                self._holders[i].remove(request_id)
            self._lock.notify_all()
            return held.ids

    def release_owner(self, owner: str) -> tuple[int, ...]:
        """Release everything ``owner`` holds (its replica died or stopped)."""
        with self._lock:
            freed: list[int] = []
            for request_id in [r for r, h in self._by_request.items() if h.owner == owner]:
                held = self._by_request.pop(request_id)
                for i in held.ids:
                    self._holders[i].remove(request_id)
                freed.extend(held.ids)
            if freed:
                self._lock.notify_all()
            return tuple(freed)

    def wait_released(self, owner: str, timeout: float) -> bool:
        """Wait until ``owner`` holds no GPU (its cell ended); False after ``timeout``."""
        with self._lock:
            return self._lock.wait_for(
                lambda: not any(h.owner == owner for h in self._by_request.values()), timeout)
