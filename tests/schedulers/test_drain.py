"""A Local Scheduler stopped with SIGTERM (a Swarm drain, a maintenance stop) has the Global
Scheduler move its replicas to other hosts first, each once its running cell has finished
(issue 37); Local Schedulers stopping together (the whole cluster) move nothing and stop at once.
Real daemons and replicas on loopback."""

from __future__ import annotations

import re
import signal
import time

import pytest
from sched_cluster import (  # noqa: F401 - fixture
    cluster_with_kernel,
    make_cluster_fixture,
    result_text,
    run_cell,
    wait_started,
)

pytestmark = pytest.mark.timeout(180)


def _cluster_with_kernel(make_cluster, hosts: int):  # noqa: ANN001, ANN202
    return cluster_with_kernel(make_cluster, hosts)


def _executor_host(cluster, kernel_id: str) -> str:  # noqa: ANN001
    return next(r.host_id for r in cluster.kernel(kernel_id).replicas if r.executor)


def test_a_drained_host_moves_its_replicas_first_and_the_cell_running_there_finishes(
        make_cluster):  # noqa: ANN001
    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster, hosts=4)
    victim = _executor_host(cluster, kernel_id)
    msg_id = kc.execute("import time\n"
                        "data['runs'] = data.get('runs', 0) + 1\n"
                        "for _ in range(8):\n"
                        "    time.sleep(0.25)\n"
                        "data['b'] = 2\n"
                        "'done'")
    wait_started(kc, msg_id)
    cluster.ls[victim].send_signal(signal.SIGTERM)  # as Swarm stops a drained node's daemon

    reply = kc.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "ok", reply["content"]  # not failed, not run again
    assert cluster.ls[victim].wait(timeout=60) == 0

    gs_log = cluster.log("gs")
    assert re.search(rf"host {victim} drained: 1 replica\(s\) moved, 0 stayed", gs_log), gs_log
    assert re.search(rf"host {victim} removed \(shutdown\); 0 replica\(s\) lost", gs_log), gs_log
    replicas = cluster.kernel(kernel_id).replicas
    assert len(replicas) == 3 and all(r.pid > 0 for r in replicas)
    assert victim not in {r.host_id for r in replicas}
    assert len({r.host_id for r in replicas}) == 3
    assert result_text(run_cell(kc, "sorted(data.items())")) == \
        "[('a', 1), ('b', 2), ('runs', 1)]"


def test_local_schedulers_stopping_together_move_nothing_and_stop_at_once(make_cluster):  # noqa: ANN001
    """The whole cluster stopping (``notebookos up`` ending, ``docker compose down``): every
    host drains at once, none can take another's replicas, and each daemon stops within
    seconds rather than moving replicas onto hosts that are going too."""
    cluster, kernel_id, kc = _cluster_with_kernel(make_cluster, hosts=3)
    started = time.monotonic()
    for proc in cluster.ls.values():
        proc.send_signal(signal.SIGTERM)
    for proc in cluster.ls.values():
        assert proc.wait(timeout=30) == 0
    took = time.monotonic() - started
    assert took < 10, f"stopping together took {took:.1f} s"
    gs_log = cluster.log("gs")
    drained = re.findall(r"host host-\d drained: (\d+) replica\(s\) moved", gs_log)
    assert drained and all(moved == "0" for moved in drained), gs_log
    assert "migrating replica" not in gs_log, gs_log


def test_drain_host_refuses_bad_requests(make_cluster):  # noqa: ANN001
    import grpc

    from notebookos.proto import global_scheduler_pb2
    from notebookos.testing.credentials import join_token_metadata

    cluster = make_cluster()
    cluster.start_gs()
    cluster.start_ls("host-0")
    cluster.wait_hosts(1)
    with pytest.raises(grpc.RpcError) as unknown:
        cluster.stub.DrainHost(global_scheduler_pb2.DrainHostRequest(
            host_id="nowhere", deadline_s=5), timeout=10, metadata=join_token_metadata())
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as bad:
        cluster.stub.DrainHost(global_scheduler_pb2.DrainHostRequest(
            host_id="host-0", deadline_s=0), timeout=10, metadata=join_token_metadata())
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as stale:
        cluster.stub.DrainHost(global_scheduler_pb2.DrainHostRequest(
            host_id="host-0", instance_id="an-old-daemon", deadline_s=5), timeout=10,
            metadata=join_token_metadata())
    assert stale.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert len(cluster.status().hosts) == 1  # nothing drained


def test_a_host_that_answers_nothing_is_declared_lost_in_seconds_not_at_the_heartbeat_timeout(
        make_cluster):  # noqa: ANN001
    """Issue 37: a host whose machine or network is gone sends nothing, not even a reset. The
    Global Scheduler's keepalive pings find it within seconds (here: the host's Local Scheduler
    and the executor frozen with SIGSTOP, under a 20 s heartbeat timeout); its replicas are
    replaced and the next cell runs with the state the last one left."""
    import os

    cluster = make_cluster({"NOTEBOOKOS_GLOBAL_SCHEDULER_HEARTBEAT_TIMEOUT_S": "20"})
    cluster.start_gs()
    for i in range(4):
        cluster.start_ls(f"host-{i}")
    cluster.wait_hosts(4)
    kernel_id, kc = cluster.start_kernel(gpus=1)
    assert run_cell(kc, "data = {'a': 1}")["reply"]["content"]["status"] == "ok"
    victim = _executor_host(cluster, kernel_id)
    frozen = [cluster.ls[victim].pid, *(r.pid for r in cluster.kernel(kernel_id).replicas
                                        if r.host_id == victim)]
    started = time.monotonic()
    for pid in frozen:
        os.killpg(pid, signal.SIGSTOP)
    try:
        run = run_cell(kc, "data['b'] = 2\nsorted(data)", timeout=60)
        took = time.monotonic() - started
        assert result_text(run) == "['a', 'b']", run
        cluster.wait(lambda: victim not in {h.host_id for h in cluster.status().hosts}, 30,
                     "the silent host to be declared lost")
        lost_after = time.monotonic() - started
    finally:
        for pid in frozen:
            os.killpg(pid, signal.SIGCONT)
    gs_log = cluster.log("gs")
    assert f"host {victim} answers no keepalive ping" in gs_log, gs_log
    assert lost_after < 12, f"declared lost after {lost_after:.1f} s (heartbeat timeout 20 s)"
    assert took < 15, f"the next cell took {took:.1f} s"
    print(f"next cell {took:.2f} s, host declared lost after {lost_after:.2f} s")
