"""Issue 32: no thread holds the Global Scheduler's lock (``service.lock``) while it blocks on
a Local Scheduler, so a host whose daemon stalls does not hold up the cells of kernels on
other hosts (the fronts' hooks take that lock on the one loop that serves every front)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time

import grpc
from sched_cluster import make_cluster_fixture, run_cell  # noqa: F401 - fixture

from notebookos.global_scheduler.registry_store import FileRegistryStore
from notebookos.global_scheduler.service import GlobalSchedulerService
from notebookos.policies.registry import get_policy
from notebookos.proto import common_pb2, global_scheduler_pb2

STALL_S = 5.0  # longer than the heartbeat timeout (3 s): the host is dropped meanwhile


def _latencies(kc, seconds: float) -> list[float]:  # noqa: ANN001
    took = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        assert run_cell(kc, "1", timeout=30)["reply"]["content"]["status"] == "ok"
        took.append(time.monotonic() - t0)
    return took


def _holds(path) -> dict:  # noqa: ANN001
    docs = [json.loads(p.read_text()) for p in path.parent.glob("holds-*.json")]
    return {site: row for doc in docs for site, row in doc["sites"].items()}


def test_a_stalled_local_scheduler_does_not_hold_up_another_hosts_kernel(make_cluster,
                                                                         tmp_path):
    """Kernel A on one host, kernel B on another. A's host's Local Scheduler is stopped
    (SIGSTOP) for longer than the heartbeat timeout, so the Global Scheduler drops that host,
    then resumed, so it registers again: meanwhile B's trivial cells run back to back and the
    slowest must stay within a bound, and no call site held the lock for long."""
    holds = tmp_path / "holds-{pid}.json"
    # reservation: one replica a kernel, its GPU bound for the session, one GPU a host: the
    # two kernels land on different hosts
    cluster = make_cluster({"NOTEBOOKOS_CLUSTER_POLICY": "reservation",
                            "NOTEBOOKOS_DEBUG_LOCK_HOLDS": str(holds)})
    cluster.start_gs()
    for i in range(2):
        cluster.start_ls(f"host-{i}", gpus=1, prewarm=0)
    cluster.wait_hosts(2)
    a, kca = cluster.start_kernel(gpus=1)
    b, kcb = cluster.start_kernel(gpus=1)
    for kc in (kca, kcb):
        assert run_cell(kc, "1")["reply"]["content"]["status"] == "ok"
    host_a = cluster.kernel(a).replicas[0].host_id
    host_b = cluster.kernel(b).replicas[0].host_id
    assert host_a != host_b, "both kernels on one host: the test needs them apart"
    calm = _latencies(kcb, 2.0)
    stalled = cluster.ls[host_a]
    os.kill(stalled.pid, signal.SIGSTOP)
    try:
        during = _latencies(kcb, STALL_S)
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
    after = _latencies(kcb, 4.0)  # A's host registers again meanwhile
    time.sleep(2.5)  # the lock's summary is written every 2 s
    sites = _holds(holds)
    longest = max(sites.items(), key=lambda kv: kv[1]["max_ms"])
    report = {"calm_max_ms": max(calm) * 1000, "during_max_ms": max(during) * 1000,
              "after_max_ms": max(after) * 1000, "cells": len(calm) + len(during) + len(after),
              "longest_hold": (longest[0], round(longest[1]["max_ms"], 1))}
    print(json.dumps(report))
    slowest = max(during + after)
    assert slowest < max(0.5, 5 * max(calm)), report
    # no site held the lock for long (before the fix the longest, 8.7 ms, was RegisterHost
    # opening A's host's channel; 50 ms leaves room for a loaded machine)
    assert longest[1]["max_ms"] < 50, report


# -- a host link's channel, slow to start and to close, is handled out of the lock ------------

SLOW_S = 0.4  # what a channel's start or close costs here (the loaded VM: up to 44 ms seen)


class _Context:
    def abort(self, code, details):  # noqa: ANN001, ANN201
        raise AssertionError(f"aborted: {code} {details}")

    def add_callback(self, callback) -> bool:  # noqa: ANN001
        return False


def _slow_connect(address: str) -> grpc.Channel:
    """A real channel whose opening and closing each take SLOW_S, as a channel's thread start
    and a close waiting for gRPC's thread do on a loaded machine."""
    time.sleep(SLOW_S)
    channel = grpc.insecure_channel(address)
    close = channel.close

    def slow_close() -> None:
        time.sleep(SLOW_S)
        close()

    channel.close = slow_close  # type: ignore[method-assign]
    return channel


def _register(host_id: str, instance: str) -> global_scheduler_pb2.RegisterHostRequest:
    return global_scheduler_pb2.RegisterHostRequest(
        host_id=host_id, address="127.0.0.1:9", instance_id=instance,  # port 9: refused
        capacity=common_pb2.ResourceSpec(millicpus=4000, memory_mb=4096, gpus=1),
        gpus=[common_pb2.GpuDevice(device_id=0, name="virtual", vram_gb=16)],
        virtual_gpus=True)


def test_a_host_links_channel_is_opened_and_closed_out_of_the_lock(tmp_path):
    """RegisterHost (a new host: its watch opens a channel; a restarted one: its old channel
    closes, a new one opens) and DeregisterHost (the channel closes) take the lock only for
    their decisions: while the channel work runs (SLOW_S each), another thread (a front's
    hook, on the fronts' loop) takes the lock at once. They used to do it under the lock."""
    service = GlobalSchedulerService(get_policy("notebookos"),
                                     FileRegistryStore(tmp_path / "registry.json"),
                                     connect=_slow_connect, heartbeat_timeout_s=60)
    context = _Context()
    waits: list[float] = []
    done = threading.Event()

    def take_the_lock() -> None:  # what each front hook does, from the loop
        while not done.is_set():
            t0 = time.monotonic()
            with service.lock:
                waits.append(time.monotonic() - t0)
            time.sleep(0.005)

    taker = threading.Thread(target=take_the_lock, daemon=True)
    taker.start()
    try:
        t0 = time.monotonic()
        asyncio.run(service.RegisterHost(_register("host-0", "one"), context))
        # restarted: readdressed
        asyncio.run(service.RegisterHost(_register("host-0", "two"), context))
        asyncio.run(service.DeregisterHost(global_scheduler_pb2.DeregisterHostRequest(
            host_id="host-0", reason="test"), context))
        took = time.monotonic() - t0
    finally:
        done.set()
        taker.join(5)
        service.close()
    assert took >= 3 * SLOW_S  # the channel work did run (open, close + open, close)
    assert "host-0" not in service.hosts
    assert max(waits) < SLOW_S / 2, f"the lock was held {max(waits) * 1000:.0f} ms"
