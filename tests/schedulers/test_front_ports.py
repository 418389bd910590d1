"""A kernel front's ports survive a Global Scheduler restart.

The fault campaign (benchmarks/chaos.py) caught a restarted Global Scheduler whose metrics server,
bound on port 0, got the port of a kernel's front: the OS had handed that port out for the
front's own port-0 bind, and it was free again while the Global Scheduler was down. The kernel
could not be restored and was dropped (its replicas orphaned, its notebook waiting forever for
the cell's reply). Fronts now bind ports drawn below the ephemeral range, a port briefly held
by another process is waited for, and one that stays taken gives the kernel new ports instead
of losing it. Real daemons and replicas on loopback.
"""

from __future__ import annotations

import signal
import socket
import threading
import time

import pytest
from jupyter_client import BlockingKernelClient
from sched_cluster import make_cluster_fixture, result_text, run_cell  # noqa: F401 - fixture
from test_front_iopub import _Hooks

from notebookos.global_scheduler.front import KernelFront
from notebookos.global_scheduler.service import FRONT_REBIND_WAIT_S
from notebookos.ports import allocation_range
from notebookos.proto.convert import connection_info_to_dict

pytestmark = pytest.mark.timeout(180)


def test_a_new_front_binds_below_the_ephemeral_range() -> None:
    low, high = allocation_range()
    if not high:
        pytest.skip("this machine's ephemeral port range leaves no room below it")
    front = KernelFront("k-ports", "key", "hmac-sha256", _Hooks())
    try:
        ports = list(front.ports.values())
        assert len(set(ports)) == 5
        assert all(low <= p < high for p in ports), (ports, low, high)
    finally:
        front.close()


def _hold(port: int) -> socket.socket:
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT, as ZMQ
    holder.bind(("127.0.0.1", port))
    holder.listen(1)
    return holder


def _restart_gs(cluster) -> None:  # noqa: ANN001
    cluster.gs.send_signal(signal.SIGKILL)
    cluster.gs.wait(10)


def test_a_restarted_global_scheduler_keeps_a_kernel_whose_front_port_is_taken(
        make_cluster) -> None:  # noqa: ANN001, F811
    cluster = make_cluster()
    cluster.start_gs()
    for i in range(3):
        cluster.start_ls(f"host-{i}")
    cluster.wait_hosts(3)
    kernel_id, kc = cluster.start_kernel(gpus=1)
    assert run_cell(kc, "data = [1, 2]")["reply"]["content"]["status"] == "ok"
    old_ports = connection_info_to_dict(cluster.kernel(kernel_id).connection)

    # Held for a moment while the Global Scheduler comes back: it waits, re-binds the same port,
    # and the notebook's own client goes on with its state.
    _restart_gs(cluster)
    holder = _hold(old_ports["shell_port"])
    releaser = threading.Timer(1.5, holder.close)
    releaser.start()
    cluster.start_gs(state="state")
    releaser.join()
    cluster.wait_hosts(3)
    assert cluster.kernel(kernel_id).connection.shell_port == old_ports["shell_port"]
    assert result_text(run_cell(kc, "data + [3]")) == "[1, 2, 3]"

    # Held for good: the kernel is kept, on new ports, with its replicas and state; the log
    # says its clients must reconnect, and a client on the new ports runs its next cell.
    _restart_gs(cluster)
    holder = _hold(old_ports["iopub_port"])
    try:
        started = time.monotonic()
        cluster.start_gs(state="state")
        cluster.wait(lambda: cluster.kernel(kernel_id).connection.iopub_port
                     != old_ports["iopub_port"], FRONT_REBIND_WAIT_S + 30, "the kernel on new ports")
        assert time.monotonic() - started >= FRONT_REBIND_WAIT_S - 1  # it waited for the port
        cluster.wait_hosts(3)
        status = cluster.kernel(kernel_id)
        assert len(status.replicas) == 3
        assert "clients must reconnect" in cluster.log("gs")
        info = connection_info_to_dict(status.connection)
        info["key"] = kc.session.key.decode()
        client = BlockingKernelClient()
        client.load_connection_info(info)
        client.start_channels()
        cluster.clients.append(client)
        assert result_text(run_cell(client, "len(data)")) == "2"
    finally:
        holder.close()
