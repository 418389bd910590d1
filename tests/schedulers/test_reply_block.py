"""The ``notebookos`` block the Global Scheduler adds to each cell's ``execute_reply`` (issue 16;
docs/kernel-protocol.md): the executor replica, its host, the GPUs committed for the cell and the
interactivity delay, as the JupyterLab extension reads them. Checked against the scheduler's own
status on a real cluster, and again after the executor is SIGKILLed: the next cell's block names
the survivor that ran it."""

from __future__ import annotations

import os
import signal
import time

import pytest
from sched_cluster import cluster_with_kernel, make_cluster_fixture, run_cell  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _cluster_with_kernel(make_cluster, hosts: int, gpus: int):  # noqa: ANN001, ANN202
    """A Global Scheduler, ``hosts`` Local Schedulers of 2 GPUs, and a kernel of ``gpus``."""
    return cluster_with_kernel(make_cluster, hosts, cell=None, gpus=gpus, prefix="r-host-")


def block_and_executor(cluster, kernel_id: str, kc, code: str) -> tuple[dict, object]:  # noqa: ANN001
    reply = run_cell(kc, code)["reply"]
    assert reply["content"]["status"] == "ok", reply["content"]
    status = cluster.kernel(kernel_id)
    executor = next(r for r in status.replicas if r.replica_id == status.executor_replica_id)
    return reply["metadata"]["notebookos"], executor


def test_the_reply_names_executor_host_gpus_and_delay(make_cluster) -> None:  # noqa: ANN001, F811
    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster, hosts=4, gpus=1)

    block, executor = block_and_executor(cluster, kernel_id, kc, "x = 1")
    assert block["role"] == "executor"
    assert block["replica_id"] == executor.replica_id
    assert block["host_id"] == executor.host_id
    assert len(block["gpu_device_ids"]) == 1 and block["gpu_device_ids"][0] in (0, 1)
    assert 0 <= block["interactivity_delay_ms"] < 30_000

    os.kill(executor.pid, signal.SIGKILL)
    block, survivor = block_and_executor(cluster, kernel_id, kc, "x + 1")
    assert survivor.replica_id != executor.replica_id
    assert (block["replica_id"], block["host_id"]) == (survivor.replica_id, survivor.host_id)
    assert len(block["gpu_device_ids"]) == 1


def test_each_cell_and_the_kernel_count_their_gpu_time(make_cluster) -> None:  # noqa: ANN001, F811
    """A cell's GPU time is its GPUs x commit -> reply (the reply block's ``gpu_seconds``); the
    kernel's status sums its cells' and says what reserving its GPUs since it started would
    have held (issue 34: the panel shows the two)."""
    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster, hosts=3, gpus=2)
    block, _ = block_and_executor(cluster, kernel_id, kc, "import time\ntime.sleep(0.5)")
    assert len(block["gpu_device_ids"]) == 2
    assert 2 * 0.5 <= block["gpu_seconds"] < 2 * 10, block  # two GPUs, half a second each
    short, _ = block_and_executor(cluster, kernel_id, kc, "1")
    assert short["gpu_seconds"] < block["gpu_seconds"]
    status = cluster.kernel(kernel_id)
    used = block["gpu_seconds"] + short["gpu_seconds"]
    assert used * 0.9 <= status.gpu_seconds_used <= used * 1.1 + 0.05, (used, status)
    # reserving two GPUs since the kernel started holds more than its cells did
    assert status.gpu_seconds_reserved > status.gpu_seconds_used
    assert status.gpu_seconds_reserved <= 2 * (time.time() - status.created_unix) + 0.01
