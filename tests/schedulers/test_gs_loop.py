"""The Global Scheduler's gRPC server and host monitor on its loop (issue 32): a real daemon in
this process (so its threads can be named) and real Local Schedulers heartbeating to it.

- it serves gRPC from the fronts' loop: no host-monitor thread, and heartbeats take no pool
  thread (the synchronous server ran each call on one of 32 pool threads);
- an idle scheduler with healthy hosts checks them only when a heartbeat deadline could pass
  (the thread it replaces looked every 0.75 s with these settings), and still drops a host
  whose Local Scheduler died, at its deadline.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from sched_cluster import Cluster

from notebookos.config import load_config
from notebookos.global_scheduler.daemon import GlobalSchedulerDaemon

HOSTS = 3


@pytest.fixture
def gs_in_process(tmp_path: Path) -> Iterator[tuple[Cluster, GlobalSchedulerDaemon, list[float]]]:
    cluster = Cluster(tmp_path)  # heartbeats every 0.3 s, heartbeat timeout 3 s
    config = load_config(env=cluster.env, overrides={
        "global_scheduler.host": "127.0.0.1",
        "global_scheduler.grpc_port": cluster.gs_port,
        "global_scheduler.metrics_port": 0,
        "cluster.state_dir": str(tmp_path / "state"),
    })
    daemon = GlobalSchedulerDaemon(config)
    checks: list[float] = []
    check_hosts = daemon.service.check_hosts

    def counted() -> None:  # whoever checks the hosts calls this
        checks.append(time.monotonic())
        check_hosts()

    daemon.service.check_hosts = counted  # type: ignore[method-assign]
    daemon.start()
    try:
        for i in range(HOSTS):
            cluster.start_ls(f"host-{i}")
        cluster.wait_hosts(HOSTS)
        yield cluster, daemon, checks
    finally:
        cluster.close()
        daemon.stop()


def _names() -> list[str]:
    return [t.name for t in threading.enumerate()]


def test_the_scheduler_serves_grpc_from_its_loop_and_heartbeats_take_no_thread(gs_in_process):
    cluster, daemon, _ = gs_in_process
    assert "host-monitor" not in _names()
    assert isinstance(daemon.server, grpc.aio.Server)
    pool_before = sorted(n for n in _names() if n.startswith("gs-grpc"))
    threads_before = threading.active_count()
    time.sleep(2.0)  # about 20 heartbeats from the 3 hosts
    assert sorted(n for n in _names() if n.startswith("gs-grpc")) == pool_before
    assert threading.active_count() <= threads_before
    assert len(cluster.status().hosts) == HOSTS


def test_an_idle_scheduler_checks_its_healthy_hosts_only_when_a_deadline_could_pass(
        gs_in_process):
    cluster, daemon, checks = gs_in_process
    time.sleep(0.5)
    checks.clear()
    time.sleep(4.5)  # heartbeats every 0.3 s, timeout 3 s: the earliest deadline is ~2.7 s on
    assert len(checks) <= 3, f"{len(checks)} host checks in 4.5 s"
    assert len(cluster.status().hosts) == HOSTS  # none was dropped meanwhile

    # a Local Scheduler killed: its host is still dropped at its deadline
    os.killpg(cluster.ls["host-0"].pid, signal.SIGKILL)
    killed = time.monotonic()
    cluster.wait(lambda: len(cluster.status().hosts) == HOSTS - 1, 10, "host-0 dropped")
    assert time.monotonic() - killed < 3 + 1.5
    assert "host-0" not in {h.host_id for h in cluster.status().hosts}
