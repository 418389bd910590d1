"""The Local Scheduler has one owner of replica events (issue 32): a replica's start, its
readiness and its exit are all learnt on one loop's thread (local_scheduler/ready_watch.py on the
launcher's loop, local_scheduler/exit_watch.py), whatever the number of replicas. Real processes
(a stand-in replica that binds its shell port, then exits), the real service and launcher."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from notebookos.local_scheduler import spawn
from notebookos.local_scheduler.gpus import Gpu
from notebookos.local_scheduler.launcher import ProcessLauncher
from notebookos.local_scheduler.prewarm import PrewarmPool
from notebookos.local_scheduler.service import HostInfo, LocalSchedulerService
from notebookos.proto import common_pb2, global_scheduler_pb2, local_scheduler_pb2

pytestmark = pytest.mark.timeout(90)

STAND_IN = '''
import json, socket, sys, time
with open(sys.argv[sys.argv.index("-f") + 1]) as f:
    c = json.load(f)
s = socket.socket()
s.bind((c["ip"], c["shell_port"]))
s.listen()
time.sleep(0.4)
sys.exit(3)
'''


class _Context:
    def abort(self, code, details):  # noqa: ANN001, ANN201
        raise AssertionError(f"StartReplica aborted: {code} {details}")


def test_starts_readiness_and_exits_are_learnt_on_one_thread(tmp_path: Path,
                                                             monkeypatch) -> None:  # noqa: ANN001
    """Each replica's STARTED (its shell socket listens) and DIED (its exit, with its code)
    are reported from the same one thread, the only one the Local Scheduler added for them:
    before, readiness came from the start watch's loop and exits from the exit watcher's
    thread (two owners of replica events, two threads)."""
    (tmp_path / "standin_replica.py").write_text(STAND_IN)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p))
    events: list[tuple[int, int, threading.Thread]] = []
    lock = threading.Lock()

    def report(event: global_scheduler_pb2.ReplicaEvent) -> None:
        with lock:
            events.append((event.kind, event.exit_code, threading.current_thread()))

    host = HostInfo("h", "127.0.0.1:1", 8000, 8000, [Gpu(0, "virtual", 1.0)], True)
    spawn.popen([sys.executable, "-c", "pass"]).wait()  # the process's one spawner thread
    before = threading.active_count()
    service = LocalSchedulerService(
        host, lambda on_exit: ProcessLauncher(tmp_path / "work", on_exit,
                                              module="standin_replica"),
        PrewarmPool(lambda: None, 0), report, ready_timeout_s=30)
    count = 8
    try:
        for i in range(count):
            service.StartReplica(local_scheduler_pb2.StartReplicaRequest(
                kernel_id=f"k{i}", replica_id=1, raft_address="127.0.0.1:0", key="k" * 32,
                resources=common_pb2.ResourceSpec(millicpus=100, memory_mb=64, gpus=0)),
                _Context())
        deadline = time.monotonic() + 60
        while len(events) < 2 * count:
            assert time.monotonic() < deadline, f"only {len(events)} events: {events}"
            time.sleep(0.05)
        added = threading.active_count() - before
        kinds = sorted((kind, code) for kind, code, _ in events)
        assert kinds == ([(global_scheduler_pb2.REPLICA_EVENT_KIND_STARTED, 0)] * count
                         + [(global_scheduler_pb2.REPLICA_EVENT_KIND_DIED, 3)] * count), kinds
        threads = {t.name for _, _, t in events}
        assert len(threads) == 1, f"replica events learnt on {sorted(threads)}"
        assert added <= 1, f"{added} threads for the replicas' events: " \
            f"{[t.name for t in threading.enumerate()]}"
    finally:
        service.close()
        service.launcher.close()
