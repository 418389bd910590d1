"""`notebookos trace` shows a progress bar on a terminal and stays quiet off one."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

TRACE = [sys.executable, "-m", "notebookos.cli", "trace", "generate", "--hours", "400"]


def test_quiet_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    done = subprocess.run([*TRACE, "--out", str(tmp_path / "t.json")], capture_output=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stderr == b""
    assert done.stdout.decode().startswith("wrote ")


def test_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns
    try:
        proc = subprocess.Popen([*TRACE, "--out", str(tmp_path / "t.json")],
                                stdout=subprocess.DEVNULL, stderr=follower)
        os.close(follower)
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closed: the command exited
                break
            if not chunk:
                break
            seen += chunk
        assert proc.wait(timeout=120) == 0
    finally:
        os.close(leader)
    text = seen.decode(errors="replace")
    assert "generating" in text and "h/s" in text, text[-500:]
