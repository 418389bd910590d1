"""Debug only: how long each call site holds the Global Scheduler's lock (issue 32).

``NOTEBOOKOS_DEBUG_LOCK_HOLDS=PATH`` makes ``service_lock()`` return a ``TimedRLock``
instead of a plain ``threading.RLock``: it records, per call site (the frame that took the
lock when it was free), every hold's duration, and for a hold longer than
``NOTEBOOKOS_DEBUG_LOCK_HOLDS_SAMPLE_MS`` (default 20) a sample of the holder's stack taken
while it still held the lock (what it was blocked on). A summary (per site: count, p50, p99,
max, samples) is written as JSON to ``PATH`` (``{pid}`` in it is replaced by the process id)
every 2 s and at exit. Unset, the lock is a plain RLock: nothing on the hot path.
``python -m notebookos.global_scheduler.lock_holds FILES`` prints the summaries as a table.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
import traceback
from collections import defaultdict
from typing import Any

ENV = "NOTEBOOKOS_DEBUG_LOCK_HOLDS"
_HERE = os.path.abspath(__file__)
_THREADING = os.path.abspath(threading.__file__)
# state_lock.StateLock wraps the lock: its frames are not the site either
_SKIP = (_HERE, _THREADING, os.path.join(os.path.dirname(_HERE), "state_lock.py"))


def service_lock(name: str = "service.lock") -> Any:
    """The service's lock: a ``state_lock.StateLock`` over a plain RLock, or over a timed one
    when the env var names a path."""
    from notebookos.global_scheduler.state_lock import StateLock

    path = os.environ.get(ENV, "")
    if not path:
        return StateLock(threading.RLock())
    sample_ms = float(os.environ.get(f"{ENV}_SAMPLE_MS", "20"))
    return StateLock(TimedRLock(name, path.replace("{pid}", str(os.getpid())),
                                sample_ms / 1000))


def _site(depth: int) -> str:
    """The first frame out of this module and threading.py (a Condition's wait re-takes the
    lock from threading.py): ``file:line function``."""
    frame = sys._getframe(depth)
    while frame is not None and os.path.abspath(frame.f_code.co_filename) in _SKIP:
        frame = frame.f_back
    if frame is None:
        return "?"
    parts = frame.f_code.co_filename.split(os.sep)
    return f"{'/'.join(parts[-2:])}:{frame.f_lineno} {frame.f_code.co_name}"


class TimedRLock:
    """An RLock that times each outermost hold per call site (see the module's doc)."""

    def __init__(self, name: str, path: str, sample_s: float) -> None:
        self._lock = threading.RLock()
        self.name = name
        self.path = path
        self.sample_s = sample_s
        # only the owner writes these, while it holds the lock
        self._owner: int | None = None
        self._depth = 0
        self._since = 0.0
        self._where = ""
        self._sampled = False
        self._stats_lock = threading.Lock()
        self._holds: dict[str, list[float]] = defaultdict(list)
        self._samples: dict[str, dict[str, list]] = defaultdict(dict)  # site -> stack -> [n, max]
        self._dirty = False
        threading.Thread(target=self._watch, name="lock-holds", daemon=True).start()
        atexit.register(self.dump)

    # -- the lock -------------------------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self._entered(3)
        return got

    def _entered(self, depth: int) -> None:
        self._depth += 1
        if self._depth == 1:
            self._owner = threading.get_ident()
            self._where = _site(depth)
            self._sampled = False
            self._since = time.perf_counter()

    def release(self) -> None:
        if self._depth == 1:
            self._left()
        self._depth -= 1
        self._lock.release()

    def _left(self) -> None:
        held = time.perf_counter() - self._since
        self._owner = None
        with self._stats_lock:
            self._holds[self._where].append(held)
            self._dirty = True

    def __enter__(self) -> bool:
        self._lock.acquire()
        self._entered(3)
        return True

    def __exit__(self, *exc: object) -> None:
        self.release()

    # threading.Condition's protocol for an RLock (a wait gives the lock up entirely)
    def _is_owned(self) -> bool:
        return self._lock._is_owned()  # type: ignore[attr-defined]

    def _release_save(self) -> Any:
        self._left()
        depth, self._depth = self._depth, 0
        return depth, self._lock._release_save()  # type: ignore[attr-defined]

    def _acquire_restore(self, state: Any) -> None:
        depth, inner = state
        self._lock._acquire_restore(inner)  # type: ignore[attr-defined]
        self._entered(3)
        self._depth = depth

    # -- the watcher and the summary ----------------------------------------------------------

    def _watch(self) -> None:
        last_dump = time.monotonic()
        while True:
            time.sleep(min(self.sample_s / 4, 0.005) or 0.005)
            owner, since, where = self._owner, self._since, self._where
            if (owner is not None and not self._sampled
                    and time.perf_counter() - since > self.sample_s):
                frame = sys._current_frames().get(owner)
                if frame is not None and self._owner == owner and self._since == since:
                    self._sampled = True
                    stack = "".join(traceback.format_stack(frame)[-8:])
                    held = time.perf_counter() - since
                    with self._stats_lock:
                        seen = self._samples[where].setdefault(stack, [0, 0.0])
                        seen[0] += 1
                        seen[1] = max(seen[1], held)
            if time.monotonic() - last_dump > 2:
                last_dump = time.monotonic()
                self.dump()

    def summary(self) -> dict:
        with self._stats_lock:
            holds = {site: sorted(values) for site, values in self._holds.items()}
            samples = {site: dict(stacks) for site, stacks in self._samples.items()}
        sites = {}
        for site, values in holds.items():
            count = len(values)
            sites[site] = {
                "count": count,
                "p50_ms": values[count // 2] * 1000,
                "p99_ms": values[min(count - 1, int(count * 0.99))] * 1000,
                "max_ms": values[-1] * 1000,
                "total_ms": sum(values) * 1000,
                "samples": [{"seen": n, "held_ms_at_least": held * 1000, "stack": stack}
                            for stack, (n, held) in sorted(samples.get(site, {}).items(),
                                                            key=lambda kv: -kv[1][1])[:5]],
            }
        return {"lock": self.name, "pid": os.getpid(), "sample_ms": self.sample_s * 1000,
                "sites": sites}

    def dump(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        try:
            tmp = f"{self.path}.tmp"
            with open(tmp, "w") as out:
                json.dump(self.summary(), out, indent=1)
            os.replace(tmp, self.path)
        except OSError:
            pass


def main(argv: list[str] | None = None) -> None:
    """``python -m notebookos.global_scheduler.lock_holds FILES [--top N] [--stacks]``: the
    summaries (one per GS process) merged, worst holds first."""
    import argparse


    parser = argparse.ArgumentParser(description="the Global Scheduler's lock holds, per call site")
    parser.add_argument("files", nargs="+")
    parser.add_argument("--top", type=int, default=25, help="sites shown, by max hold")
    parser.add_argument("--stacks", action="store_true", help="the sampled stacks of long holds")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    merged: dict[str, dict] = defaultdict(lambda: {"count": 0, "p50_ms": 0.0, "p99_ms": 0.0,
                                                   "max_ms": 0.0, "total_ms": 0.0,
                                                   "samples": []})
    for name in args.files:
        with open(name) as f:
            doc = json.load(f)
        for site, row in doc["sites"].items():
            m = merged[site]
            m["count"] += row["count"]
            m["total_ms"] += row["total_ms"]
            # the percentiles of merged files: the worst file's (an upper bound)
            for key in ("p50_ms", "p99_ms", "max_ms"):
                m[key] = max(m[key], row[key])
            m["samples"].extend(row["samples"])
    rows = sorted(merged.items(), key=lambda kv: -kv[1]["max_ms"])[:args.top]
    if args.json:
        print(json.dumps(dict(rows), indent=1))
        return
    print(f"{'site':70} {'count':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>9}")
    for site, m in rows:
        print(f"{site[:70]:70} {m['count']:7d} {m['p50_ms']:8.3f} {m['p99_ms']:8.3f} "
              f"{m['max_ms']:9.1f}")
        if args.stacks:
            for s in sorted(m["samples"], key=lambda s: -s["held_ms_at_least"])[:2]:
                print(f"    held >= {s['held_ms_at_least']:.0f} ms (x{s['seen']}):")
                print("      " + s["stack"].rstrip().replace("\n", "\n      "))



if __name__ == "__main__":
    main()
