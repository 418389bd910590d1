"""The prewarm pool: replica processes started ahead (interpreter up, heavy imports done) that
``StartReplica`` promotes instead of starting a replica cold."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

from notebookos.local_scheduler import spawn

log = logging.getLogger(__name__)


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


class PrewarmPool:
    """Keeps ``target`` prewarmed processes ready; refills in a background thread."""

    def __init__(self, module: str, target: int, python: str = sys.executable,
                 ready_timeout_s: float = 60.0) -> None:
        self.module = module
        self.python = python
        self.target = target
        self.ready_timeout_s = ready_timeout_s
        self._ready: list[PrewarmedProcess] = []
        self._starting = 0
        self._message = ""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="prewarm-pool")
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

    def take(self) -> PrewarmedProcess | None:
        with self._lock:
            while self._ready:
                p = self._ready.pop(0)
                if p.alive:
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
        proc = None
        try:
            proc = spawn.popen(
                [self.python, "-m", "notebookos.local_scheduler.prewarm_main", self.module],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            )
            assert proc.stdout is not None
            line = proc.stdout.readline()  # "ready" once the imports are done
            proc.stdout.close()
            ok = line.strip() == b"ready"
            with self._lock:
                self._starting -= 1
                if ok and not self._closed:
                    self._ready.append(PrewarmedProcess(proc))
                    self._message = ""
                    proc = None
                else:
                    self._message = "" if self._closed else "a prewarm process failed to start"
        except OSError as exc:
            with self._lock:
                self._starting -= 1
                self._message = f"cannot start a prewarm process: {exc}"
        finally:
            if proc is not None:
                PrewarmedProcess(proc).discard()
