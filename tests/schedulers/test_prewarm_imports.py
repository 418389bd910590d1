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

from sched_cluster import make_cluster_fixture, run_seen, stream_text  # noqa: F401 - the fixture

from notebookos.proto import global_scheduler_pb2
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


def test_a_preloaded_interpreter_does_not_load_cryptography() -> None:
    """Raft's crypto is libsodium's (kernel/raft_crypto.py): importing pysyncobj before the
    replica's package loaded `cryptography` through pysyncobj's encryptor (9 MB a replica)."""
    code = ("import sys\n"
            "from notebookos.local_scheduler.prewarm_main import preload\n"
            "preload('notebookos.kernel')\n"
            "assert 'pysyncobj' in sys.modules\n"
            "print(sorted(m for m in sys.modules if m.startswith('cryptography')))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


def test_a_hosts_preload_modules_are_imported_in_every_replica_it_starts(make_cluster) -> None:  # noqa: ANN001
    """``local_scheduler.preload_modules`` (torch, for a wake without torch's import: issue 34)
    reaches the fork server and the pool: the pool's replica and a forked one have it."""
    cluster = make_cluster({"NOTEBOOKOS_LOCAL_SCHEDULER_PRELOAD_MODULES": "colorsys, wave"})
    cluster.start_gs()
    for i in range(3):
        cluster.start_ls(f"host-{i}", prewarm=1)
    cluster.wait_hosts(3)

    def pools_full() -> bool:
        status = cluster.stub.GetClusterStatus(global_scheduler_pb2.GetClusterStatusRequest(),
                                               timeout=10)
        return all(host.prewarm_pool_size >= 1 for host in status.hosts)

    cluster.wait(pools_full, 120, "every host's prewarm pool filled")  # (a cold start: no preload)
    for _ in range(2):  # the first from the pools, the second forked while they refill
        _, kc = cluster.start_kernel(gpus=0)
        seen = run_seen(kc, "import sys\nprint('colorsys' in sys.modules, 'wave' in sys.modules)")
        assert stream_text(seen, "stdout") == "True True\n", seen["reply"]["content"]
