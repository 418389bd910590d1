"""A notebook through jupyter_client and nbclient on the per-cell container policies: every cell
runs in its own container (batch: cold, lcp: a warm process) restored from the previous cell's
checkpoint, and the notebook sees one ordinary kernel: kernel_info answered while parked, outputs
complete, state carried from cell to cell, a clean shutdown."""

from __future__ import annotations

import time
from collections.abc import Iterator

import nbformat
import pytest
from nbclient import NotebookClient
from nbos_cluster import Cluster, running_cluster

from notebookos.proto import common_pb2, global_scheduler_pb2, global_scheduler_pb2_grpc
from notebookos.testing.credentials import connect

pytestmark = pytest.mark.timeout(240)

CELLS = [
    "import math\nhistory = []",
    "def step(x):\n    history.append(x)\n    return x * 2",
    "value = step(21)\nprint('value', value)",
    "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\np = Point(3, 4)",
    "print(math.hypot(p.x, p.y), history)",
    "value + len(history)",
]


@pytest.fixture(params=["batch", "lcp"])
def cell_cluster(request, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(
            tmp_path_factory.mktemp(request.param), hosts=2,
            settings={"cluster.policy": request.param,
                      "global_scheduler.warm_containers_per_host": 1}) as cluster:
        yield cluster


def kernel_status(address: str, kernel_id: str) -> common_pb2.KernelStatus:
    with connect(address) as channel:
        return global_scheduler_pb2_grpc.GlobalSchedulerStub(channel).GetKernelStatus(
            global_scheduler_pb2.GetKernelStatusRequest(kernel_id=kernel_id), timeout=10)


def test_a_notebook_runs_one_container_per_cell(cell_cluster: Cluster) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {"name": "notebookos", "display_name": "NotebookOS",
                                 "language": "python"}
    client = NotebookClient(nb, kernel_name="notebookos", timeout=120)
    seen: list[tuple[int, float, float]] = []

    def after_cell(cell, cell_index, **_: object) -> None:
        deadline = time.monotonic() + 30
        while True:  # the cell's container stops once its checkpoint is durable
            status = kernel_status(cell_cluster.address, client.km.kernel_id)
            if status.state == common_pb2.KERNEL_STATE_PARKED or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert status.state == common_pb2.KERNEL_STATE_PARKED and not status.replicas
        seen.append((status.last_cell_pid, status.last_container_start_ms,
                     status.last_interactivity_delay_ms))

    client.on_cell_executed = after_cell
    client.execute()
    assert nb.cells[2].outputs[0]["text"] == "value 42\n"
    assert nb.cells[4].outputs[0]["text"] == "5.0 [21]\n"
    assert nb.cells[5].outputs[0]["data"]["text/plain"] == "43"
    assert [c.execution_count for c in nb.cells] == list(range(1, len(CELLS) + 1))
    assert len({pid for pid, _, _ in seen}) == len(CELLS)  # a new container for every cell
    assert all(delay >= start > 0 for _, start, delay in seen)
    print("container start ms:", [round(s) for _, s, _ in seen],
          "interactivity delay ms:", [round(d) for _, _, d in seen])
