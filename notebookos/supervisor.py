"""Start, watch and stop a set of daemons as one unit (what ``notebookos up`` runs).

Each child runs in its own process group with its output in a log file. Every child, and
everything it starts in turn (replica processes, kernels), carries a marker in its environment;
``stop()`` signals the groups in reverse start order, then sweeps ``/proc`` for any process that
still carries the marker, so nothing is left behind even when a daemon's own children were started
in new sessions.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

MARKER_VAR = "NOTEBOOKOS_SUPERVISOR_ID"


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log_path: Path
    essential: bool

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Supervisor:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.marker = uuid.uuid4().hex
        self.children: list[Child] = []

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        essential: bool = True,
    ) -> Child:
        log_path = self.log_dir / f"{name}.log"
        child_env = dict(os.environ if env is None else env)
        child_env[MARKER_VAR] = self.marker
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=child_env, start_new_session=True,
            )
        child = Child(name, proc, log_path, essential)
        self.children.append(child)
        return child

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

    def stop(self, grace_s: float = 10.0) -> list[int]:
        """Stop every child (reverse order), then kill any marked leftover. Returns their pids."""
        for child in reversed(self.children):
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
