"""Control through the front and the Global Scheduler: interrupt_request on the control channel
and the InterruptKernel RPC stop a running cell; the kernel keeps its state; StopKernel stops
every replica and closes the front."""

from __future__ import annotations

import time

import grpc
import pytest
from sched_cluster import make_cluster_fixture, result_text, run_cell  # noqa: F401 - fixture

from notebookos.proto import global_scheduler_pb2
from notebookos.testing.processes import pid_alive

pytestmark = pytest.mark.timeout(120)


def _wait_reply(kc, msg_id: str, timeout: float = 30):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply
    raise AssertionError("no reply")


def _wait_started(kc, msg_id: str, timeout: float = 30) -> None:  # noqa: ANN001
    """Wait for the cell's execute_input: the user code runs from here on. (GPUs are committed
    earlier, before the replicas' election, and an interrupt then would find no running cell.)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if (msg["msg_type"] == "execute_input"
                and msg["parent_header"].get("msg_id") == msg_id):
            time.sleep(0.2)  # into the loop of the cell
            return
    raise AssertionError("the cell never started")


def test_interrupts_reach_the_executor_and_stop_kernel_cleans_up(make_cluster):
    cluster = make_cluster()
    cluster.start_gs()
    for i in range(3):
        cluster.start_ls(f"host-{i}")
    cluster.wait_hosts(3)
    kernel_id, kc = cluster.start_kernel(gpus=1)
    assert run_cell(kc, "kept = 'yes'")["reply"]["content"]["status"] == "ok"

    # interrupt_request on the front's control channel
    msg_id = kc.execute("import time\nfor _ in range(600): time.sleep(0.1)")
    cluster.wait(lambda: cluster.status().gpus_committed == 1, 20, "the cell running")
    _wait_started(kc, msg_id)
    started = time.monotonic()
    kc.control_channel.send(kc.session.msg("interrupt_request", {}))
    reply = _wait_reply(kc, msg_id)
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert time.monotonic() - started < 20
    cluster.wait(lambda: cluster.status().gpus_committed == 0, 10, "GPUs released")

    # the InterruptKernel RPC (SIGINT to the executor through its Local Scheduler)
    msg_id = kc.execute("import time\nfor _ in range(600): time.sleep(0.1)")
    cluster.wait(lambda: cluster.status().gpus_committed == 1, 20, "the cell running")
    _wait_started(kc, msg_id)
    answer = cluster.stub.InterruptKernel(
        global_scheduler_pb2.InterruptKernelRequest(kernel_id=kernel_id), timeout=10)
    assert answer.cell_was_running
    assert _wait_reply(kc, msg_id)["content"]["ename"] == "KeyboardInterrupt"
    assert result_text(run_cell(kc, "kept")) == "'yes'"

    # RestartKernel: fresh interpreters behind the same ports; the same client goes on.
    ports = cluster.kernel(kernel_id).connection
    old_pids = {r.pid for r in cluster.kernel(kernel_id).replicas}
    restarted = cluster.stub.RestartKernel(
        global_scheduler_pb2.RestartKernelRequest(kernel_id=kernel_id), timeout=90)
    assert restarted.connection.shell_port == ports.shell_port
    assert restarted.connection.iopub_port == ports.iopub_port
    assert len(restarted.status.replicas) == 3
    assert not old_pids & {r.pid for r in restarted.status.replicas}
    gone = run_cell(kc, "kept")["reply"]["content"]
    assert gone["status"] == "error" and gone["ename"] == "NameError"

    pids = [r.pid for r in cluster.kernel(kernel_id).replicas]
    cluster.stub.StopKernel(global_scheduler_pb2.StopKernelRequest(kernel_id=kernel_id),
                            timeout=60)
    with pytest.raises(grpc.RpcError) as err:
        cluster.kernel(kernel_id)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert not [pid for pid in pids if pid_alive(pid)]
    assert all(h.subscribed.gpus == 0 for h in cluster.status().hosts)
