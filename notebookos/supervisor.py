"""Start, watch, restart and stop a set of daemons as one unit (what ``notebookos up`` runs).

Each child runs in its own process group with its output in a log file. Every child, and
everything it starts in turn (replica processes, kernels), carries a marker in its environment;
``stop()`` signals the groups in reverse start order, then sweeps ``/proc`` for any process that
still carries the marker, so nothing is left behind even when a daemon's own children were started
in new sessions.

A child started with a ``RestartPolicy`` is restarted when it exits, as systemd's
``Restart=always`` or compose's ``restart: unless-stopped`` would: ``supervise()`` (called
regularly by the owner's loop; no thread of its own) notices the exit, waits a backoff and starts
the same command again, logging both. A child that exits within ``min_uptime_s`` of starting
failed to start; after ``max_failed_starts`` such failures in a row it *crash-loops*, and
``supervise()`` says so instead of restarting it (the owner then stops everything). A child that
ran longer than ``min_uptime_s`` before it died starts over with the shortest backoff.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

MARKER_VAR = "NOTEBOOKOS_SUPERVISOR_ID"


@dataclass(frozen=True)
class RestartPolicy:
    """When and how often a child that exited is started again (supervisord's ``startsecs`` and
    ``startretries``, with an exponential backoff between failed starts)."""

    backoff_initial_s: float = 0.5
    backoff_max_s: float = 10.0
    min_uptime_s: float = 10.0  # an exit sooner than this after a start is a failed start
    max_failed_starts: int = 5  # failed starts in a row that make a crash loop

    def backoff_s(self, failed_starts: int) -> float:
        """The wait before the next start after ``failed_starts`` failed starts in a row."""
        return min(self.backoff_max_s, self.backoff_initial_s * 2 ** max(0, failed_starts - 1))


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log_path: Path
    essential: bool
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    restart: RestartPolicy | None = None
    started_at: float = field(default_factory=time.monotonic)
    restarts: int = 0  # times this child was started again
    failed_starts: int = 0  # exits within min_uptime_s of a start, in a row
    restart_at: float | None = None  # monotonic time of the pending restart, if one is pending

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    @property
    def exit_description(self) -> str:
        code = self.proc.returncode
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"


def _say_on_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Supervisor:
    def __init__(self, log_dir: Path, say: Callable[[str], None] = _say_on_stderr) -> None:
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.marker = uuid.uuid4().hex
        self.children: list[Child] = []
        self.say = say

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        essential: bool = True,
        restart: RestartPolicy | None = None,
    ) -> Child:
        """Start ``argv`` as child ``name``; with ``restart``, ``supervise()`` restarts it."""
        child_env = dict(os.environ if env is None else env)
        child_env[MARKER_VAR] = self.marker
        log_path = self.log_dir / f"{name}.log"
        child = Child(name, self._spawn(list(argv), child_env, log_path), log_path, essential,
                      argv=list(argv), env=child_env, restart=restart)
        self.children.append(child)
        return child

    @staticmethod
    def _spawn(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )

    def wait_for_port(self, child: Child, host: str, port: int, timeout: float) -> None:
        """Wait until ``host:port`` accepts connections; raise if the child exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if child.proc.poll() is not None:
                raise RuntimeError(
                    f"{child.name} exited with code {child.proc.returncode} while starting; "
                    f"last lines of {child.log_path}:\n{child.tail()}"
                )
            with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
                return
            time.sleep(0.1)
        raise RuntimeError(f"{child.name} did not open {host}:{port} within {timeout:g} s; "
                           f"last lines of {child.log_path}:\n{child.tail()}")

    def first_dead(self) -> Child | None:
        """An essential child that has exited, if any."""
        for child in self.children:
            if child.essential and child.proc.poll() is not None:
                return child
        return None

    def supervise(self) -> str | None:
        """One pass: restart children that exited (after their backoff) and report it through
        ``say``. Returns why everything must stop (an essential child crash-loops, or exited and
        has no restart policy), else None."""
        now = time.monotonic()
        for child in self.children:
            if child.proc.poll() is None:
                continue
            if child.restart_at is None:
                why = self._exited(child, now)
                if why is not None:
                    return why
            if child.restart_at is not None and now >= child.restart_at:
                self._restart(child)
        return None

    def _exited(self, child: Child, now: float) -> str | None:
        """A child's exit, seen for the first time: schedule its restart, or say why not."""
        uptime = now - child.started_at
        policy = child.restart
        if policy is None:
            if not child.essential:
                child.restart_at = float("inf")  # seen; nothing to do
                return None
            return (f"{child.name} exited ({child.exit_description}); stopping. Last lines of "
                    f"{child.log_path}:\n{child.tail()}")
        child.failed_starts = child.failed_starts + 1 if uptime < policy.min_uptime_s else 0
        if child.failed_starts >= policy.max_failed_starts:
            return (f"{child.name} crash-loops: it exited {child.failed_starts} times in a row "
                    f"within {policy.min_uptime_s:g} s of starting (last: "
                    f"{child.exit_description}); stopping. Last lines of {child.log_path}:\n"
                    f"{child.tail()}")
        delay = policy.backoff_s(max(1, child.failed_starts))
        child.restart_at = now + delay
        self.say(f"notebookos up: {child.name} exited ({child.exit_description}) after "
                 f"{uptime:.1f} s; restarting it in {delay:g} s")
        return None

    def _restart(self, child: Child) -> None:
        child.restart_at = None
        child.restarts += 1
        with contextlib.suppress(OSError), open(child.log_path, "a") as log:
            log.write(f"--- notebookos up: restart {child.restarts} of {child.name} at "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')} ---\n")
        _signal_group(child.proc, signal.SIGKILL)  # whatever its group left behind
        try:
            child.proc = self._spawn(child.argv, child.env, child.log_path)
        except OSError as exc:
            child.restart_at = time.monotonic() + (child.restart.backoff_max_s
                                                   if child.restart else 10.0)
            self.say(f"notebookos up: could not restart {child.name}: {exc}; trying again")
            return
        child.started_at = time.monotonic()
        self.say(f"notebookos up: restarted {child.name} (pid {child.proc.pid}, restart "
                 f"{child.restarts})")

    def stop(self, grace_s: float = 10.0) -> list[int]:
        """Stop every child (reverse order), then kill any marked leftover. Returns their pids."""
        for child in reversed(self.children):
            child.restart_at = float("inf")  # no restart from here on
            _signal_group(child.proc, signal.SIGTERM)
            try:
                child.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(child.proc, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.proc.wait(timeout=5)
            _signal_group(child.proc, signal.SIGKILL)  # the rest of its group, if any
        leftovers = marked_processes(self.marker)
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return leftovers


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def marked_processes(marker: str, var: str = MARKER_VAR) -> list[int]:
    """Pids of live processes whose environment carries ``var=marker`` (Linux /proc)."""
    needle = f"{var}={marker}".encode()
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().split(") ", 1)[1][:1]
        except (OSError, IndexError):
            continue
        if state != "Z" and needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found
