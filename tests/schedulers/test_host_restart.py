"""A Local Scheduler restarted under the same host id (by `notebookos up`, systemd, compose) is
taken back at once, with the replicas that outlived its old instance; a second live
daemon claiming a host id that is in use is still refused; a replica left on a host by a Global
Scheduler that died mid-replacement is stopped (real daemons and replicas)."""

from __future__ import annotations

import signal
import time

import pytest
from sched_cluster import make_cluster_fixture, result_text, run_cell  # noqa: F401 - fixture

from notebookos.proto import common_pb2, local_scheduler_pb2
from notebookos.proto import local_scheduler_pb2_grpc as ls_grpc
from notebookos.testing.credentials import connect
from notebookos.testing.processes import free_port, pid_alive

pytestmark = pytest.mark.timeout(180)

# Far longer than the test waits: a registration may only succeed because the old instance was
# recognised as gone, never because it stopped heartbeating long enough ago.
SLOW_HEARTBEAT_TIMEOUT = {"NOTEBOOKOS_GLOBAL_SCHEDULER_HEARTBEAT_TIMEOUT_S": "60"}


def _kernel_with_state(cluster):  # noqa: ANN001, ANN202
    kernel_id, kc = cluster.start_kernel(gpus=1)
    assert run_cell(kc, "data = {'a': 1}\ndata['b'] = 2")["reply"]["content"]["status"] == "ok"
    return kernel_id, kc


def _address_of(cluster, host_id: str) -> str | None:  # noqa: ANN001
    return next((h.address for h in cluster.status().hosts if h.host_id == host_id), None)


def _whole_again(cluster, kernel_id: str, dead_pid: int) -> bool:  # noqa: ANN001
    status = cluster.kernel(kernel_id)
    pids = [r.pid for r in status.replicas]
    return len(pids) == 3 and dead_pid not in pids and all(pids) and status.state in (2, 3)


def test_a_second_live_daemon_is_refused_and_takes_over_at_once_when_the_first_dies(
        make_cluster):  # noqa: ANN001
    cluster = make_cluster(SLOW_HEARTBEAT_TIMEOUT)
    cluster.start_gs()
    for i in range(4):
        cluster.start_ls(f"host-{i}")
    cluster.wait_hosts(4)
    kernel_id, kc = _kernel_with_state(cluster)
    executor = cluster.kernel(kernel_id).executor_replica_id
    victim = next(r for r in cluster.kernel(kernel_id).replicas if r.replica_id == executor)
    original = _address_of(cluster, victim.host_id)
    first = cluster.ls[victim.host_id]

    # Two live daemons claim one host id: the second is refused, the first keeps the host.
    cluster.start_ls(victim.host_id)
    cluster.wait(lambda: "refused host" in cluster.log(victim.host_id), 30,
                 "the second daemon to be refused")
    assert _address_of(cluster, victim.host_id) == original
    assert cluster.kernel(kernel_id).state in (2, 3)

    # The first dies: the second one (still trying) is accepted at once, not after the
    # heartbeat timeout, and the replica that died with the first is replaced.
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    killed = time.monotonic()
    cluster.wait(lambda: _address_of(cluster, victim.host_id) not in (None, original), 15,
                 "the restarted daemon registered")
    assert time.monotonic() - killed < 15
    cluster.wait(lambda: _whole_again(cluster, kernel_id, victim.pid), 90,
                 "the lost replica replaced")
    assert result_text(run_cell(kc, "data['c'] = 3\nsorted(data.items())")) == (
        "[('a', 1), ('b', 2), ('c', 3)]")


def test_a_daemon_restarted_at_the_same_address_takes_its_replicas_back(
        make_cluster):  # noqa: ANN001
    """The replicas outlive the SIGKILLed daemon; the new instance finds them in its records
    and reports them, and the Global Scheduler keeps them (issue 33: 0 replicas lost)."""
    cluster = make_cluster(SLOW_HEARTBEAT_TIMEOUT)
    cluster.start_gs()
    port = free_port()
    fixed = ["local-scheduler", "--host-id", "host-fixed", "--port", str(port),
             "--global-scheduler", cluster.gs_address, "--virtual-gpus", "2",
             "--state-dir", str(cluster.workdir / "state")]
    cluster.ls["host-fixed"] = cluster._spawn("host-fixed", fixed)  # noqa: SLF001
    for i in range(2):  # three hosts: each holds a replica
        cluster.start_ls(f"host-{i}")
    cluster.wait_hosts(3)
    kernel_id, kc = _kernel_with_state(cluster)
    before = {r.replica_id: (r.host_id, r.pid) for r in cluster.kernel(kernel_id).replicas}
    victim = next(r for r in cluster.kernel(kernel_id).replicas if r.host_id == "host-fixed")

    cluster.ls["host-fixed"].send_signal(signal.SIGKILL)
    cluster.ls["host-fixed"].wait(10)
    assert pid_alive(victim.pid)
    cluster.ls["host-fixed"] = cluster._spawn("host-fixed", fixed)  # noqa: SLF001
    restarted = time.time()
    cluster.wait(lambda: "recovered replica" in cluster.log("host-fixed") and any(
        h.host_id == "host-fixed" and h.last_heartbeat_unix > restarted
        for h in cluster.status().hosts), 30, "the new instance to take its replica back")
    assert {r.replica_id: (r.host_id, r.pid)
            for r in cluster.kernel(kernel_id).replicas} == before
    assert _address_of(cluster, "host-fixed") == f"127.0.0.1:{port}"
    assert result_text(run_cell(kc, "data['c'] = 3\nsorted(data.items())")) == (
        "[('a', 1), ('b', 2), ('c', 3)]")


def test_a_replica_of_a_known_kernel_that_nobody_placed_on_a_host_is_stopped(make_cluster):  # noqa: ANN001
    """What a Global Scheduler that died mid-replacement leaves behind: a replica process of the
    kernel on a host, unknown to the new instance. It must not hold the host (the next
    replacement there is refused while it runs) nor linger: it is stopped."""
    cluster = make_cluster()
    cluster.start_gs()
    for i in range(4):
        cluster.start_ls(f"host-{i}")
    cluster.wait_hosts(4)
    kernel_id, kc = _kernel_with_state(cluster)
    used = {r.host_id for r in cluster.kernel(kernel_id).replicas}
    spare = next(h for h in cluster.status().hosts if h.host_id not in used)
    with connect(spare.address) as channel:
        stub = ls_grpc.LocalSchedulerStub(channel)
        stranger = stub.StartReplica(local_scheduler_pb2.StartReplicaRequest(
            kernel_id=kernel_id, replica_id=99, raft_address="127.0.0.1:0", key="k" * 32,
            resources=common_pb2.ResourceSpec(millicpus=100, memory_mb=64, gpus=1)), timeout=60)

        def listed() -> bool:
            status = stub.GetHostStatus(local_scheduler_pb2.GetHostStatusRequest(), timeout=10)
            return any(r.replica_id == 99 for r in status.replicas)

        cluster.wait(lambda: not listed(), 30, "the stranger replica stopped")
    cluster.wait(lambda: not pid_alive(stranger.pid), 10, "the stranger's process gone")
    assert "did not place there; stopping it" in cluster.log("gs")
    # the kernel's own replicas are untouched
    assert {r.host_id for r in cluster.kernel(kernel_id).replicas} == used
    assert result_text(run_cell(kc, "sorted(data)")) == "['a', 'b']"
