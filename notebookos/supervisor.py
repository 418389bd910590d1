"""Start, watch, restart and stop a set of daemons as one unit (what ``notebookos up`` runs).

Each child runs in its own process group with its output in a log file. Every child, and
everything it starts in turn (replica processes, kernels), carries a marker in its environment;
``stop()`` signals the groups in reverse start order, then sweeps ``/proc`` for any process that
still carries the marker, so nothing is left behind even when a daemon's own children were started
in new sessions.

A child started with a ``RestartPolicy`` is restarted whenever it exits, as Kubernetes restarts a
container (``restartPolicy: Always`` with its CrashLoopBackOff): ``supervise()`` (called regularly
by the owner's loop; no thread of its own) notices the exit, waits a backoff and starts the same
command again, logging both. The backoff starts at ``backoff_initial_s`` and doubles with every
exit in a row, up to ``backoff_max_s``; it never gives up, and it never stops a sibling. A child
that became healthy (its readiness probe answered, or it stayed up ``healthy_after_s``) resets
its count: its next exit is restarted after ``backoff_initial_s`` again. Only ``stop()`` (Ctrl-C,
SIGTERM in ``notebookos up``) stops the set.

With a ``state_path`` the supervisor writes what it does to a small JSON file there on every
change (``read_state()`` reads it back): ``notebookos status`` and the JupyterLab server extension
show from it that a daemon is restarting, and when it is tried again, even while the Global
Scheduler itself is down.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MARKER_VAR = "NOTEBOOKOS_SUPERVISOR_ID"
STATE_VERSION = 1


def state_file(state_dir: Path) -> Path:
    """Where ``notebookos up`` keeps its supervisor's state file in a cluster's state directory
    (``notebookos status`` and the JupyterLab server extension read it there)."""
    return Path(state_dir) / "run" / "supervisor.json"


@dataclass(frozen=True)
class RestartPolicy:
    """When a child that exited is started again: Kubernetes' CrashLoopBackOff (from 1 s,
    doubling, up to 5 min; reset once the child served)."""

    backoff_initial_s: float = 1.0
    backoff_max_s: float = 300.0
    healthy_after_s: float = 10.0  # up this long (or ready): its next exit starts over

    def backoff_s(self, attempt: int) -> float:
        """The wait before restart ``attempt`` (1 after the first exit, 2 after the second exit
        in a row without a healthy run between them, ...)."""
        exponent = min(max(0, attempt - 1), 64)  # 2**64 x anything is past any cap
        return min(self.backoff_max_s, self.backoff_initial_s * 2 ** exponent)


def port_probe(host: str, port: int, timeout: float = 0.1) -> Callable[[], bool]:
    """A readiness probe: ``host:port`` accepts a TCP connection."""

    def probe() -> bool:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return True
        except OSError:
            return False

    return probe


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log_path: Path
    essential: bool
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    restart: RestartPolicy | None = None
    ready: Callable[[], bool] | None = None  # readiness probe; None: healthy after uptime only
    started_at: float = field(default_factory=time.monotonic)
    restarts: int = 0  # times this child was started again
    attempt: int = 0  # exits in a row without a healthy run between them
    healthy: bool = False  # this start became ready or stayed up healthy_after_s
    restart_at: float | None = None  # monotonic time of the pending restart, if one is pending
    last_exit: str = ""  # how it last exited, e.g. "killed by SIGKILL after 3.2 s"
    # children started one after another with the same stop group are stopped together: one
    # SIGTERM each, then the waits (Local Schedulers: one stopping alone drains its replicas
    # onto the others, host_drain.py; stopped together they move nothing)
    stop_group: str = ""

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

    @property
    def state(self) -> str:
        """``running`` (healthy), ``starting`` (not yet), ``restarting`` (waiting for its next
        start), ``exited`` (not restarted) or ``stopped``."""
        if self.proc.poll() is None:
            return "running" if self.healthy else "starting"
        if self.restart_at is None or self.restart_at == float("inf"):
            return "exited" if self.restart_at is None or self.restart is None else "stopped"
        return "restarting"


def _stop_batches(children: list[Child]) -> list[list[Child]]:
    """``children`` in order, adjacent ones of one non-empty ``stop_group`` batched."""
    batches: list[list[Child]] = []
    for child in children:
        if batches and child.stop_group and batches[-1][-1].stop_group == child.stop_group:
            batches[-1].append(child)
        else:
            batches.append([child])
    return batches


def _say_on_stderr(line: str) -> None:
    say_on_stderr(line)


def say_on_stderr(line: str) -> None:
    """Print ``line`` on stderr, never raising: a terminal or pipe that went away (the shell
    that started ``notebookos up`` closed, a ``| tee`` killed) made the print raise
    BrokenPipeError, and ``up`` died before it stopped its daemons, which ran on orphaned."""
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


class Supervisor:
    def __init__(self, log_dir: Path, say: Callable[[str], None] = _say_on_stderr,
                 state_path: Path | None = None, facts: Mapping[str, Any] | None = None) -> None:
        """``state_path``: where to write the state file (none without it); ``facts``: what
        else it carries (e.g. the Global Scheduler's address)."""
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.marker = uuid.uuid4().hex
        self.children: list[Child] = []
        self.say = say
        self.state_path = state_path
        self.facts = dict(facts or {})
        self._written: Any = None
        self._stopping = False

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        essential: bool = True,
        restart: RestartPolicy | None = None,
        ready: Callable[[], bool] | None = None,
        stop_group: str = "",
    ) -> Child:
        """Start ``argv`` as child ``name``; with ``restart``, ``supervise()`` restarts it.
        ``ready`` (e.g. ``port_probe``) says when a start became healthy before
        ``healthy_after_s``. Adjacent children of one ``stop_group`` stop together."""
        child_env = dict(os.environ if env is None else env)
        child_env[MARKER_VAR] = self.marker
        log_path = self.log_dir / f"{name}.log"
        child = Child(name, self._spawn(list(argv), child_env, log_path), log_path, essential,
                      argv=list(argv), env=child_env, restart=restart, ready=ready,
                      stop_group=stop_group)
        self.children.append(child)
        self.write_state()
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
        """One pass: note children that became healthy, restart children that exited (after
        their backoff) and report it through ``say``. Returns why everything must stop (only an
        essential child without a restart policy that exited), else None: a child with a
        policy is restarted however often it fails, and its siblings are left alone."""
        if self._stopping:
            return None
        now = time.monotonic()
        why = None
        for child in self.children:
            if child.proc.poll() is None:
                if not child.healthy:
                    self._check_health(child, now)
                continue
            if child.restart_at is None:
                why = why or self._exited(child, now)
            if child.restart_at is not None and now >= child.restart_at:
                self._restart(child)
        self.write_state()
        return why

    def _check_health(self, child: Child, now: float) -> None:
        policy = child.restart
        up_long = policy is not None and now - child.started_at >= policy.healthy_after_s
        ready = False
        if not up_long and child.ready is not None:
            try:
                ready = bool(child.ready())
            except Exception:  # noqa: BLE001 - a probe that fails says "not ready"
                ready = False
        if not (up_long or ready):
            return
        child.healthy = True
        if child.attempt:
            self.say(f"notebookos up: {child.name} is {'ready' if ready else 'up'} again "
                     f"(pid {child.proc.pid}); its restart backoff starts over")
        child.attempt = 0

    def _exited(self, child: Child, now: float) -> str | None:
        """A child's exit, seen for the first time: schedule its restart, or say why not."""
        uptime = now - child.started_at
        child.last_exit = f"{child.exit_description} after {uptime:.1f} s"
        policy = child.restart
        if policy is None:
            if not child.essential:
                child.restart_at = float("inf")  # seen; nothing to do
                return None
            return (f"{child.name} exited ({child.exit_description}); stopping. Last lines of "
                    f"{child.log_path}:\n{child.tail()}")
        if child.healthy or uptime >= policy.healthy_after_s:
            child.attempt = 0  # it served: start over
        child.attempt += 1
        delay = policy.backoff_s(child.attempt)
        child.restart_at = now + delay
        self.say(f"notebookos up: {child.name} exited ({child.exit_description}) after "
                 f"{uptime:.1f} s; restarting it in {delay:g} s (attempt {child.attempt})")
        return None

    def _restart(self, child: Child) -> None:
        child.restart_at = None
        child.restarts += 1
        with contextlib.suppress(OSError), open(child.log_path, "a") as log:
            log.write(f"--- notebookos up: restart {child.restarts} of {child.name} at "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')} (attempt {child.attempt}) ---\n")
        _signal_group(child.proc, signal.SIGKILL)  # whatever its group left behind
        try:
            proc = self._spawn(child.argv, child.env, child.log_path)
        except OSError as exc:
            policy = child.restart or RestartPolicy()
            child.attempt += 1
            delay = policy.backoff_s(child.attempt)
            child.restart_at = time.monotonic() + delay
            self.say(f"notebookos up: could not restart {child.name}: {exc}; trying again in "
                     f"{delay:g} s (attempt {child.attempt})")
            return
        child.proc = proc
        child.started_at = time.monotonic()
        child.healthy = False
        self.say(f"notebookos up: restarted {child.name} (pid {child.proc.pid}, restart "
                 f"{child.restarts}, attempt {child.attempt})")

    def serve(self, stop: threading.Event, interval_s: float = 0.2) -> str | None:
        """Supervise until ``stop`` is set (returns None) or a child without a restart policy
        makes everything stop (returns why). ``stop`` is seen within ``interval_s``, however
        long a backoff is pending."""
        while not stop.wait(interval_s):
            why = self.supervise()
            if why is not None:
                return why
        return None

    def stop(self, grace_s: float = 10.0) -> list[int]:
        """Stop every child (reverse order), then kill any marked leftover. Returns their pids."""
        self._stopping = True
        for child in reversed(self.children):
            child.restart_at = float("inf")  # no restart from here on
        self.write_state()
        for together in _stop_batches(list(reversed(self.children))):
            for child in together:
                _signal_group(child.proc, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            for child in together:
                try:
                    child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _signal_group(child.proc, signal.SIGKILL)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        child.proc.wait(timeout=5)
                _signal_group(child.proc, signal.SIGKILL)  # the rest of its group, if any
        leftovers = marked_processes(self.marker)
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if self.state_path is not None:
            with contextlib.suppress(OSError):
                self.state_path.unlink()
        return leftovers

    # -- the state file ---------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What the state file holds: the supervisor's pid and, per child, its state, pid,
        attempt (exits in a row), restarts, last exit and, while restarting, ``next_try_at``
        (wall-clock seconds since the epoch)."""
        wall, mono = time.time(), time.monotonic()
        daemons = []
        for child in self.children:
            entry: dict[str, Any] = {
                "name": child.name, "state": child.state, "pid": child.proc.pid,
                "attempt": child.attempt, "restarts": child.restarts,
                "last_exit": child.last_exit,
            }
            if entry["state"] == "restarting" and child.restart_at is not None:
                entry["next_try_at"] = round(wall + max(0.0, child.restart_at - mono), 3)
            daemons.append(entry)
        return {"version": STATE_VERSION, "supervisor_pid": os.getpid(),
                "stopping": self._stopping, **self.facts, "daemons": daemons}

    def write_state(self) -> None:
        """Write the state file if anything changed since the last write (atomically)."""
        if self.state_path is None:
            return
        doc = self.state()
        key = [{k: v for k, v in d.items() if k != "next_try_at"} for d in doc["daemons"]]
        key.append({"stopping": doc["stopping"]})
        if key == self._written:
            return
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_path.with_name(f".{self.state_path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(doc, indent=1))
            os.replace(tmp, self.state_path)
        except OSError as exc:
            self.say(f"notebookos up: could not write {self.state_path}: {exc}")
            return
        self._written = key


def read_state(path: Path) -> dict[str, Any] | None:
    """The state file a live supervisor wrote at ``path``; None when there is none, it cannot
    be read, or the process that wrote it is gone (a supervisor that was killed)."""
    try:
        doc = json.loads(Path(path).read_text())
        pid = int(doc["supervisor_pid"])
        os.kill(pid, 0)
    except PermissionError:
        return doc  # alive, another user's
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return doc if isinstance(doc.get("daemons"), list) else None


def retry_in_s(entry: Mapping[str, Any], now: float | None = None) -> float | None:
    """Seconds until a restarting daemon's next start (0 when due), None when not restarting."""
    if entry.get("state") != "restarting" or "next_try_at" not in entry:
        return None
    return max(0.0, float(entry["next_try_at"]) - (time.time() if now is None else now))


def describe(entry: Mapping[str, Any], now: float | None = None) -> str:
    """One daemon of the state file in words, e.g. ``global-scheduler: restarting, attempt 4,
    next try in 8 s (last exit: killed by SIGKILL after 3.1 s)``."""
    state = entry.get("state", "?")
    text = f"{entry.get('name', '?')}: {state}"
    wait = retry_in_s(entry, now)
    if wait is not None:
        text += f", attempt {entry.get('attempt', 0)}, next try in {wait:.0f} s"
    elif state in ("running", "starting"):
        text += f" (pid {entry.get('pid')})"
    if entry.get("restarts"):
        text += f", restarted {entry['restarts']} time(s)"
    if state != "running" and entry.get("last_exit"):
        text += f" (last exit: {entry['last_exit']})"
    return text


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
