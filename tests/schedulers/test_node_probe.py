"""node_probe.probe_ports: what a lost node's replica ports look like (refused) against a live
replica's (accepts, even while the process that listens is stopped: the kernel completes the
handshake)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from notebookos.global_scheduler import node_probe
from notebookos.testing.processes import free_port


def test_a_listening_port_accepts_and_a_closed_one_refuses() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        live = listening.getsockname()
        closed = ("127.0.0.1", free_port())
        started = time.monotonic()
        results = node_probe.probe_ports([live, closed, live], 1.0)
    assert results == {live: node_probe.ACCEPTS, closed: node_probe.REFUSED}
    assert time.monotonic() - started < 0.5  # neither waits for the deadline


def test_a_stopped_process_still_accepts() -> None:
    """A replica frozen (or busy in C code) is not a lost node."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", (
        "import socket, time\n"
        f"s = socket.create_server(('127.0.0.1', {port}))\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        os.kill(proc.pid, signal.SIGSTOP)
        assert node_probe.probe_ports([("127.0.0.1", port)], 1.0) == {
            ("127.0.0.1", port): node_probe.ACCEPTS}
        proc.kill()
        proc.wait(10)
        assert node_probe.probe_ports([("127.0.0.1", port)], 1.0) == {
            ("127.0.0.1", port): node_probe.REFUSED}
    finally:
        proc.kill()
        proc.wait(10)
