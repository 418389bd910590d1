"""The notebook check shared by the compose, the Swarm and the multi-node ansible tests: a kernel
made through JupyterLab's REST API, cells over its websocket, its three replicas in containers on
three Local Schedulers, the executor's container SIGKILLed (on whichever engine runs it), and the
next cell seeing the same variables."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from notebookos.testing.deployment import (
    Deployment,
    output_text,
    run,
    run_cells,
    start_kernel,
    stop_kernel,
)

ROOT = Path(__file__).resolve().parents[2]


def kernel_of(status: dict, kernel_id: str) -> dict:
    return next(k for k in status["kernels"] if k["id"] == kernel_id)


def check_notebook(dep: Deployment) -> str:
    """Returns the kernel id (still running) after the whole check."""
    port, token = dep.jupyter_port, dep.token()
    kernel_id = asyncio.run(start_kernel(port, token))
    first = asyncio.run(run_cells(port, token, kernel_id, [
        "import os\nx = 41\nwho = os.getuid()",
        "print(x, who)",
    ]))
    assert [r["reply"]["status"] for r in first] == ["ok", "ok"], first
    assert output_text(first[1]).split() == ["41", "1000"], first  # replicas are not root

    containers = dep.replica_containers(kernel_id)
    assert len(containers) == 3, containers
    assert len({c["host_id"] for c in containers.values()}) == 3, containers
    kernel = kernel_of(dep.status(), kernel_id)
    assert {r["replica_id"]: r["host_id"] for r in kernel["replicas"]} == \
        {rid: c["host_id"] for rid, c in containers.items()}
    labels = [run([*dep.docker_of(c), "inspect", "--format",
                   "{{index .Config.Labels \"notebookos.role\"}} {{.Config.User}} "
                   "{{.HostConfig.NanoCpus}} {{.HostConfig.CpuQuota}} {{.HostConfig.CpuPeriod}} "
                   "{{.HostConfig.Memory}}", c["id"]]).stdout.strip()
              for c in containers.values()]
    for line in labels:
        role, user, nano_cpus, quota, period, memory = line.split()
        assert role in ("replica", "prewarm") and user == "1000:1000", line
        # 1 CPU and 2 GB, the kernelspec's request: set at creation (a cold container) or
        # when a prewarmed container is promoted
        cpus = int(nano_cpus) / 1e9 if role == "replica" else int(quota) / int(period)
        assert cpus == 1.0 and int(memory) == 2048 << 20, line

    executor = kernel["executor"]
    assert executor in containers, kernel
    docker = dep.docker_of(containers[executor])  # the engine that runs it
    run([*docker, "kill", "--signal", "KILL", containers[executor]["id"]])
    after = asyncio.run(run_cells(port, token, kernel_id, ["x + 1"]))
    assert after[0]["reply"]["status"] == "ok", after
    assert output_text(after[0]).strip() == "42", after

    deadline = time.monotonic() + 60  # the lost replica is replaced, in a container of its own
    while time.monotonic() < deadline:
        now = dep.replica_containers(kernel_id)
        if len(now) == 3 and executor not in now:
            break
        time.sleep(1)
    else:
        raise AssertionError(f"no replacement replica container: {dep.replica_containers(kernel_id)}")
    assert containers[executor]["name"] not in run([*docker, "ps", "-a", "--format",
                                                    "{{.Names}}"]).stdout  # removed
    return kernel_id


def stop_and_check_removed(dep: Deployment, kernel_id: str) -> None:
    asyncio.run(stop_kernel(dep.jupyter_port, dep.token(), kernel_id))
    deadline = time.monotonic() + 60
    while dep.replica_containers(kernel_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not dep.replica_containers(kernel_id)
