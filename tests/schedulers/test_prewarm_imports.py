"""A prewarmed or forked replica finds what it imports while it starts already imported.

The pool's replicas and the fork server's children are interpreters that ran ``preload``; what a
replica imports only after its order (ipykernel and IPython import psutil, sqlite3, pdb inside
``initialize()``) is paid at every start, three replicas at once. This test makes a replica in an
interpreter that ran ``preload`` and lists what its initialization imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from notebookos.testing.processes import free_port

# ipykernel.debugger would import debugpy (8.8 MB a replica); replicas hide it (kernel/app.py).
LAZY_ON_PURPOSE = {"ipykernel.debugger"}

SCRIPT = """
import json, os, sys
from jupyter_client.connect import write_connection_file
from notebookos.local_scheduler.prewarm_main import preload
preload("notebookos.kernel")
connection_file, raft_port, store, out = sys.argv[1:]
write_connection_file(connection_file, ip="127.0.0.1", key=b"k" * 16)
before = set(sys.modules)
from notebookos.kernel.app import ReplicaKernelApp
ReplicaKernelApp.instance().initialize([
    "-f", connection_file, "--replica-id", "1", "--raft-address", f"127.0.0.1:{raft_port}",
    "--kernel-id", "imports", "--store-url", f"file://{store}"])
with open(out, "w") as f:
    json.dump(sorted(set(sys.modules) - before), f)
os._exit(0)  # the replica's Raft and IOPub threads: nothing here needs them stopped cleanly
"""


def test_a_preloaded_interpreter_makes_a_replica_without_new_imports(tmp_path: Path) -> None:
    out = tmp_path / "imported.json"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "kernel.json"), str(free_port()),
         str(tmp_path / "store"), str(out)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = set(json.loads(out.read_text())) - LAZY_ON_PURPOSE
    assert not imported, (
        f"a replica's start imported {sorted(imported)} after preload: add them to "
        "START_IMPORTS in local_scheduler/prewarm_main.py (or, if the replica should not load "
        "them, to LAZY_ON_PURPOSE here, saying why)")
