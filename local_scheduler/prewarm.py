"""The prewarm pool: replicas started ahead (interpreter up, heavy imports done) that
``StartReplica`` promotes instead of starting a replica cold.

The pool only counts and refills; what a prewarmed replica is (a waiting process, a waiting
container) is the launcher's business: the pool calls the launcher's ``start_prewarmed`` and hands
what it returns back to the launcher's ``launch``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from notebookos.local_scheduler import spawn

log = logging.getLogger(__name__)


class Prewarmed(Protocol):
    """One prewarmed replica waiting in the pool."""

    @property
    def alive(self) -> bool: ...

    def discard(self) -> None: ...


class PrewarmedProcess:
    """One waiting ``prewarm_main`` process; ``promote`` turns it into a replica."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def promote(self, argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
        order = json.dumps({"argv": argv, "env": env, "log": str(log_path)}) + "\n"
        assert self.process.stdin is not None
        self.process.stdin.write(order.encode())
        self.process.stdin.flush()
        self.process.stdin.close()
        return self.process

    def discard(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, 9)
            except ProcessLookupError:
                pass
        self.process.wait(timeout=10)


def start_prewarm_process(python: str, module: str,
                          learned: list[str] | None = None) -> PrewarmedProcess:
    """Start ``prewarm_main MODULE`` and wait for its ``ready`` line; it preloads the host's
    ``preload_modules`` and ``learned`` (``preload_learning``)."""
    env = None
    if learned:
        from notebookos.local_scheduler.prewarm_main import PRELOAD_ENV

        env = {**os.environ, PRELOAD_ENV: ",".join(
            [*os.environ.get(PRELOAD_ENV, "").split(","), *learned]).strip(",")}
    proc = spawn.popen(
        [python, "-m", "notebookos.local_scheduler.prewarm_main", module],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "ready" once the imports are done
    proc.stdout.close()
    prewarmed = PrewarmedProcess(proc)
    if line.strip() != b"ready":
        prewarmed.discard()
        raise RuntimeError("a prewarm process failed to start")
    return prewarmed


REFILL_DELAY_S = 2.0  # a pool refills this long after a take (PrewarmPool's docstring)


class PrewarmPool:
    """Keeps ``target`` prewarmed replicas ready; refills in one background thread.

    ``starter`` makes one prewarmed replica (blocking until it is ready) or raises OSError or
    RuntimeError with a message, which ``status`` reports until a start succeeds again.

    A refill waits ``refill_delay_s`` after a take: the replica just promoted is still starting
    (loading its state, answering its first cell), and on a small host a refill's imports would
    compete with it for the CPU (measured: benchmarks/deploy.py, docs/performance.md).
    """

    def __init__(self, starter: Callable[[], Prewarmed], target: int,
                 refill_delay_s: float = REFILL_DELAY_S) -> None:
        self.starter = starter
        self.target = target
        self.refill_delay_s = refill_delay_s
        self._refill_at = 0.0
        self._ready: list[Prewarmed] = []
        self._starting = 0
        self._message = ""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="prewarm-pool")

    def start(self) -> None:
        self._thread.start()

    def status(self) -> tuple[int, int, int, str]:
        """(target, ready, starting, message)."""
        with self._lock:
            self._ready = [p for p in self._ready if p.alive]
            return self.target, len(self._ready), self._starting, self._message

    def set_target(self, target: int) -> None:
        with self._lock:
            self.target = target
            extra = self._ready[target:] if len(self._ready) > target else []
            self._ready = self._ready[:target]
        for p in extra:
            p.discard()
        self._wake.set()

    def renew(self) -> None:
        """Replace the ready replicas by new ones (the interpreter they fork from, or their
        preloads, changed: ``preload_learning``); the refill starts at once."""
        with self._lock:
            stale, self._ready = self._ready, []
        for p in stale:
            p.discard()
        self._wake.set()

    def take(self) -> Prewarmed | None:
        with self._lock:
            while self._ready:
                p = self._ready.pop(0)
                if p.alive:
                    self._refill_at = time.monotonic() + self.refill_delay_s
                    self._wake.set()
                    return p
        return None

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        with self._lock:
            ready, self._ready = self._ready, []
        for p in ready:
            p.discard()

    def _run(self) -> None:
        while not self._closed:
            pause = self._refill_at - time.monotonic()
            if pause > 0:
                self._wake.wait(timeout=pause)
                self._wake.clear()
                continue
            with self._lock:
                self._ready = [p for p in self._ready if p.alive]
                missing = self.target - len(self._ready) - self._starting
                if missing > 0:
                    self._starting += 1
            if missing > 0:
                self._start_one()
                if self._message:  # back off instead of spinning on a failing start
                    self._wake.wait(timeout=2.0)
                continue
            self._wake.wait(timeout=2.0)
            self._wake.clear()

    def _start_one(self) -> None:
        try:
            prewarmed = self.starter()
        except (OSError, RuntimeError) as exc:
            with self._lock:
                self._starting -= 1
                self._message = "" if self._closed else f"cannot start a prewarmed replica: {exc}"
            log.warning("%s", self._message)
            return
        with self._lock:
            self._starting -= 1
            keep = not self._closed
            if keep:
                self._ready.append(prewarmed)
                self._message = ""
        if not keep:
            prewarmed.discard()
