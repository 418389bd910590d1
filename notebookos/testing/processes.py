"""Process and port helpers for launching real services in tests and benchmarks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

from notebookos.ports import free_ports


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, from below the ephemeral range (see
    ``notebookos.ports``: outgoing connections cannot take it before the daemon binds it)."""
    return free_ports(1)[0]


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen | None = None) -> bool:
    """Wait until something accepts on 127.0.0.1:port; False on timeout or if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie waiting for its parent to
    reap it counts as gone: it runs nothing and holds no port)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no procfs here: the signal check is all there is
    return state not in (b"Z", b"X")


def kill_group(proc: subprocess.Popen, timeout: float = 5.0, sig: int = signal.SIGTERM) -> None:
    """Signal a process started with start_new_session=True and everything it spawned."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=timeout)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=timeout)
