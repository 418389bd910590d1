"""nbclient runs a notebook on the notebookos kernel; a second run SIGKILLs the executor replica
between cells, and the notebook still completes with the same outputs (DESIGN section 4)."""

from __future__ import annotations

import os
import signal
import time

import nbformat
from nbclient import NotebookClient

from notebookos.proto import common_pb2, global_scheduler_pb2, global_scheduler_pb2_grpc
from notebookos.testing.credentials import connect

LIVE = (common_pb2.REPLICA_STATE_IDLE, common_pb2.REPLICA_STATE_STANDBY,
        common_pb2.REPLICA_STATE_EXECUTING)
CELLS = [
    "import math\nhistory = []",
    "def step(x):\n    history.append(x)\n    return x * 2",
    "value = step(21)\nprint('value', value)",
    "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\np = Point(3, 4)",
    "data = {'k': [1, 2, 3]}\ndata['k'].append(4)",
    "print(math.hypot(p.x, p.y), history, data)",
    "value + len(history)",
]


def notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {"name": "notebookos", "display_name": "NotebookOS",
                                 "language": "python"}
    return nb


def outputs_of(nb: nbformat.NotebookNode) -> list[list[dict]]:
    return [[{k: v for k, v in o.items() if k != "execution_count"} for o in cell.outputs]
            for cell in nb.cells]


def executor_pid(address: str, kernel_id: str, timeout: float = 60) -> int:
    """The executor's pid, once the kernel has all three replicas again: this test is about one
    replica dying at a time (losing two at once is a checkpoint rebuild, tested elsewhere)."""
    deadline = time.monotonic() + timeout
    with connect(address) as channel:
        stub = global_scheduler_pb2_grpc.GlobalSchedulerStub(channel)
        while True:
            status = stub.GetKernelStatus(
                global_scheduler_pb2.GetKernelStatusRequest(kernel_id=kernel_id), timeout=10)
            live = [r for r in status.replicas if r.state in LIVE and r.pid]
            if len(live) == 3 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert len(live) == 3, f"the kernel did not get back to 3 replicas: {status}"
    (executor,) = [r for r in status.replicas if r.executor]
    assert executor.pid > 0
    return executor.pid


def test_notebook_survives_executor_sigkill_between_cells(nbos_cluster) -> None:
    gs_address = nbos_cluster.address
    reference = notebook()
    NotebookClient(reference, kernel_name="notebookos", timeout=120).execute()
    expected = outputs_of(reference)
    assert expected[2] == [{"output_type": "stream", "name": "stdout", "text": "value 42\n"}]

    killed: list[int] = []
    nb = notebook()
    client = NotebookClient(nb, kernel_name="notebookos", timeout=120)

    def kill_executor(cell, cell_index, **_: object) -> None:
        if cell_index in (2, 4):  # twice: the survivors must carry on again
            pid = executor_pid(gs_address, client.km.kernel_id)
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    client.on_cell_executed = kill_executor
    client.execute()
    assert len(killed) == 2
    assert outputs_of(nb) == expected
    counts = [cell.execution_count for cell in nb.cells]
    assert counts == list(range(1, len(CELLS) + 1))  # execution_count stays continuous
