"""pysyncobj replaces ``socket.inet_ntop`` with a Windows-only version on import; a replica is the
notebook's own process, so user code calling it (or psutil) broke. Found when a test counting
connections with psutil failed in the full suite after another test had imported the Raft log."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import socket
import notebookos.kernel.raft_log  # imports pysyncobj and its TCP transport
import pysyncobj.tcp_connection
import psutil
assert socket.inet_ntop(socket.AF_INET, bytes([127, 0, 0, 1])) == "127.0.0.1"
psutil.Process().net_connections(kind="tcp")
print("ok")
"""


def test_socket_inet_ntop_still_works_after_the_raft_log_is_imported() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
