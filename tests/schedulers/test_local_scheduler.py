"""One Local Scheduler (with a Global Scheduler to register with) driven over gRPC: registration,
replica processes, per-cell GPU binding with device ids, release on death, the prewarm pool,
bad input."""

from __future__ import annotations

import os
import signal
import socket
import time
import uuid

import grpc
import pytest
from sched_cluster import make_cluster_fixture  # noqa: F401 - fixture

from notebookos.global_scheduler.front import ReplicaEndpoint
from notebookos.global_scheduler.hosts import HostLink
from notebookos.global_scheduler.readiness import wait_until_ready
from notebookos.proto import common_pb2, local_scheduler_pb2
from notebookos.proto import local_scheduler_pb2_grpc as ls_grpc
from notebookos.testing.credentials import connect
from notebookos.testing.processes import pid_alive

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def host(make_cluster):  # noqa: ANN001, ANN201
    cluster = make_cluster()
    cluster.start_gs()
    cluster.start_ls("solo", gpus=2)
    cluster.wait_hosts(1)
    address = cluster.status().hosts[0].address
    channel = connect(address)
    yield cluster, ls_grpc.LocalSchedulerStub(channel)
    channel.close()


def _start(stub, kernel_id: str, **kw) -> local_scheduler_pb2.StartReplicaResponse:  # noqa: ANN001
    key = kw.pop("key", "k" * 32)
    raft_address = kw.pop("raft_address", "127.0.0.1:0")
    return stub.StartReplica(local_scheduler_pb2.StartReplicaRequest(
        kernel_id=kernel_id, replica_id=1, raft_address=raft_address, key=key,
        resources=common_pb2.ResourceSpec(millicpus=100, memory_mb=64, gpus=1), **kw),
        timeout=60)


def _ready(resp, key: str = "k" * 32) -> bool:  # noqa: ANN001
    c = resp.connection
    endpoint = ReplicaEndpoint(1, c.ip, c.shell_port, c.iopub_port, c.stdin_port, c.control_port)
    return wait_until_ready([endpoint], key, "hmac-sha256", 60) == {1}


def _commit(stub, kernel_id: str, request_id: str, gpus: int):  # noqa: ANN001, ANN202
    return stub.CommitGpus(local_scheduler_pb2.CommitGpusRequest(
        kernel_id=kernel_id, replica_id=1, request_id=request_id, gpus=gpus), timeout=10)


def _host_status(stub):  # noqa: ANN001, ANN202
    return stub.GetHostStatus(local_scheduler_pb2.GetHostStatusRequest(), timeout=10)


def test_registration_gpu_binding_and_release_when_the_replica_dies(host):
    cluster, stub = host
    status = _host_status(stub)
    assert status.registered and status.host.virtual_gpus
    assert [g.device_id for g in status.host.gpus] == [0, 1]
    gs_view = cluster.status().hosts[0]
    assert gs_view.host_id == "solo" and gs_view.capacity.gpus == 2

    a, b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    ra, rb = _start(stub, a), _start(stub, b)
    assert ra.pid > 0 and rb.pid > 0 and ra.pid != rb.pid
    assert _ready(ra) and _ready(rb)

    got = _commit(stub, a, "cell-1", 2)
    assert got.committed and sorted(got.device_ids) == [0, 1] and got.gpus_idle == 0
    again = _commit(stub, a, "cell-1", 2)  # idempotent per request id
    assert again.committed and list(again.device_ids) == list(got.device_ids)
    refused = _commit(stub, b, "cell-2", 1)
    assert not refused.committed and "0 of 2 idle" in refused.reason
    released = stub.ReleaseGpus(local_scheduler_pb2.ReleaseGpusRequest(
        kernel_id=a, replica_id=1, request_id="cell-1"), timeout=10)
    assert sorted(released.released_device_ids) == [0, 1]
    got_b = _commit(stub, b, "cell-2", 1)
    assert got_b.committed and list(got_b.device_ids) == [0]
    assert _host_status(stub).host.gpus_committed == 1

    os.kill(rb.pid, signal.SIGKILL)  # dies holding GPU 0: the LS releases it at once
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        s = _host_status(stub)
        if s.host.gpus_committed == 0 and all(r.kernel_id != b for r in s.replicas):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"GPUs not released after the replica died: {s}")
    assert "died" in cluster.log("solo")


def test_a_raft_port_in_use_fails_the_start_at_once_and_no_replica_dies(host):
    """A replica told to listen for Raft on a taken port would die at start (and count as a
    replica death): the host refuses the start instead, naming the port."""
    cluster, stub = host
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(grpc.RpcError) as err:
            _start(stub, f"t-{uuid.uuid4().hex[:6]}", raft_address=f"127.0.0.1:{port}")
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert f"cannot listen for Raft on 127.0.0.1:{port}" in err.value.details()
    assert not _host_status(stub).replicas
    assert "died" not in cluster.log("solo")


def test_a_commit_applies_the_releases_it_carries_first(host):
    """The Global Scheduler holds a cell's release back and sends it with the next commit."""
    _, stub = host
    a, b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    ra, rb = _start(stub, a), _start(stub, b)
    assert _ready(ra) and _ready(rb)
    assert _commit(stub, a, "cell-1", 2).committed
    release_a = local_scheduler_pb2.ReleaseGpusRequest(kernel_id=a, replica_id=1,
                                                       request_id="cell-1")
    gone = local_scheduler_pb2.ReleaseGpusRequest(kernel_id="no-such-kernel", replica_id=1,
                                                  request_id="cell-0")
    got = stub.CommitGpus(local_scheduler_pb2.CommitGpusRequest(
        kernel_id=b, replica_id=1, request_id="cell-2", gpus=2,
        release_first=[gone, release_a]), timeout=10)
    assert got.committed and sorted(got.device_ids) == [0, 1], got
    assert not _commit(stub, a, "cell-3", 1).committed  # b holds both now
    states = {r.kernel_id: r.state for r in _host_status(stub).replicas}
    assert states[a] == common_pb2.REPLICA_STATE_IDLE
    assert states[b] == common_pb2.REPLICA_STATE_EXECUTING


def test_a_held_release_reaches_the_host_on_its_own_or_with_the_next_commit(host):
    """The Global Scheduler's side (HostLink) against a real Local Scheduler: a release waits
    for a commit to ride on, goes out alone when none comes, and is known as under way until
    the host has it (so a heartbeat showing the GPU still bound is not taken for an orphan)."""
    cluster, stub = host
    link = HostLink("solo", cluster.status().hosts[0].address, "test", [], True, connect=connect)
    kernel = f"k-{uuid.uuid4().hex[:6]}"
    assert _ready(_start(stub, kernel))
    try:
        assert link.commit_gpus(kernel, 1, "cell-1", 1)[0] is not None
        link.release_gpus_async(local_scheduler_pb2.ReleaseGpusRequest(
            kernel_id=kernel, replica_id=1, request_id="cell-1"))
        assert link.releasing(kernel, 1) and not link.releasing(kernel, 2)
        device_ids, reason = link.commit_gpus(kernel, 1, "cell-2", 2)  # carries the release
        assert device_ids is not None and sorted(device_ids) == [0, 1], reason
        assert not link.releasing(kernel, 1)
        link.release_gpus_async(local_scheduler_pb2.ReleaseGpusRequest(
            kernel_id=kernel, replica_id=1, request_id="cell-2"))
        deadline = time.monotonic() + 5  # no commit comes: it goes out on its own
        while _host_status(stub).host.gpus_committed:
            assert time.monotonic() < deadline, "the held release never reached the host"
            time.sleep(0.02)
        while link.releasing(kernel, 1):
            assert time.monotonic() < deadline, "the sent release stayed under way"
            time.sleep(0.02)
    finally:
        link.close()


def _counting_link(host) -> tuple[HostLink, str, list[str]]:  # noqa: ANN001
    """A HostLink to the fixture's host, a replica of a new kernel started there, and the
    request ids of the CommitGpus calls the link makes (in order)."""
    cluster, stub = host
    link = HostLink("solo", cluster.status().hosts[0].address, "test", [], True, connect=connect)
    kernel = f"k-{uuid.uuid4().hex[:6]}"
    assert _ready(_start(stub, kernel))
    calls: list[str] = []
    commit = link.stub.CommitGpus

    def counted(request, **kwargs):  # noqa: ANN001, ANN003, ANN202
        calls.append(request.request_id)
        return commit(request, **kwargs)

    link.stub.CommitGpus = counted
    return link, kernel, calls


def test_the_next_cell_of_a_replica_takes_over_its_held_commitment(host):
    """Cells run back to back: the next cell of the same replica, wanting as many GPUs, keeps
    the devices its predecessor's held release would have freed, without a call to the host;
    its own release then frees them on the host (named by the host's request id)."""
    _, stub = host
    link, kernel, calls = _counting_link(host)
    try:
        first, _ = link.commit_gpus(kernel, 1, "cell-1", 1)
        assert first is not None
        for n in (2, 3):  # each cell takes over its predecessor's commitment
            link.release_gpus_async(local_scheduler_pb2.ReleaseGpusRequest(
                kernel_id=kernel, replica_id=1, request_id=f"cell-{n - 1}"))
            device_ids, reason = link.commit_gpus(kernel, 1, f"cell-{n}", 1)
            assert device_ids == first, reason
            assert not link.releasing(kernel, 1)
        assert calls == ["cell-1"]
        assert _host_status(stub).host.gpus_committed == 1
        link.release_gpus_async(local_scheduler_pb2.ReleaseGpusRequest(
            kernel_id=kernel, replica_id=1, request_id="cell-3"))
        deadline = time.monotonic() + 5
        while _host_status(stub).host.gpus_committed:
            assert time.monotonic() < deadline, "cell-3's release did not free the host's GPU"
            time.sleep(0.02)
        # a commitment bound by a host instance that is gone is never taken over
        assert link.commit_gpus(kernel, 1, "cell-4", 1)[0] is not None
        link.release_gpus_async(local_scheduler_pb2.ReleaseGpusRequest(
            kernel_id=kernel, replica_id=1, request_id="cell-4"))
        link.instance_id = "restarted"
        assert link.commit_gpus(kernel, 1, "cell-5", 1)[0] is not None
        assert calls[-1] == "cell-5"
    finally:
        link.close()


def test_a_release_is_held_its_whole_time_whatever_an_earlier_holds_timer_does(host, monkeypatch):
    """A notebook's cells back to back: each release is held RELEASE_HOLD_S from its own
    start, not until the timer an earlier hold set fires (that hold's release was taken over
    meanwhile). Cut short, the release went out alone and the next cell called CommitGpus:
    29% of such cells through Jupyter (issue 36)."""
    from notebookos.global_scheduler import hosts

    monkeypatch.setattr(hosts, "RELEASE_HOLD_S", 0.4)
    link, kernel, calls = _counting_link(host)
    try:
        first, _ = link.commit_gpus(kernel, 1, "cell-1", 1)
        assert first is not None
        link.release_gpus_async(local_scheduler_pb2.ReleaseGpusRequest(
            kernel_id=kernel, replica_id=1, request_id="cell-1"))  # its timer: at 0.4 s
        time.sleep(0.1)
        assert link.commit_gpus(kernel, 1, "cell-2", 1)[0] == first  # taken over
        time.sleep(0.2)
        link.release_gpus_async(local_scheduler_pb2.ReleaseGpusRequest(
            kernel_id=kernel, replica_id=1, request_id="cell-2"))  # held from 0.3 s to 0.7 s
        time.sleep(0.2)  # 0.5 s: the first timer has fired
        assert link.commit_gpus(kernel, 1, "cell-3", 1)[0] == first
        assert calls == ["cell-1"], calls
    finally:
        link.close()


def test_a_commit_never_overtakes_a_release_being_sent(host, monkeypatch):
    """The hold timer takes a held release and sends it while a commit for the same replica
    comes: the commit must wait for that release, or the host refuses it (the replica still
    holds the previous cell's GPUs) and the cell leaves its sticky executor. The release is
    slowed between being taken and being sent to open that window."""
    import threading

    from notebookos.global_scheduler import hosts

    cluster, stub = host
    link = HostLink("solo", cluster.status().hosts[0].address, "test", [], True, connect=connect)
    kernel = f"k-{uuid.uuid4().hex[:6]}"
    assert _ready(_start(stub, kernel))
    real_pool = hosts._release_pool()

    class SlowPool:
        def submit(self, fn, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            time.sleep(0.5)
            return real_pool.submit(fn, *args, **kwargs)

    try:
        assert link.commit_gpus(kernel, 1, "cell-1", 2)[0] is not None  # both GPUs
        link.release_gpus_async(local_scheduler_pb2.ReleaseGpusRequest(
            kernel_id=kernel, replica_id=1, request_id="cell-1"))
        monkeypatch.setattr(hosts, "_release_pool", lambda: SlowPool())
        timer = threading.Thread(target=link._send_held_releases)  # noqa: SLF001 - the timer's call
        timer.start()
        time.sleep(0.1)  # the timer has taken the release and is sending it
        device_ids, reason = link.commit_gpus(kernel, 1, "cell-2", 2)
        timer.join(10)
        assert device_ids is not None and sorted(device_ids) == [0, 1], reason
    finally:
        link.close()


def test_prewarm_pool_promotes_a_warm_process(host):
    cluster, stub = host

    def wait_pool(ready: int) -> None:
        deadline = time.monotonic() + 60
        while _host_status(stub).prewarm_pool.ready != ready:
            assert time.monotonic() < deadline, _host_status(stub).prewarm_pool
            time.sleep(0.2)

    pool = stub.SetPrewarmPool(local_scheduler_pb2.SetPrewarmPoolRequest(target_size=1),
                               timeout=10)
    assert pool.target_size == 1
    wait_pool(1)
    kernel = f"warm-{uuid.uuid4().hex[:6]}"
    resp = _start(stub, kernel, use_prewarmed=True, require_prewarmed=True)
    assert resp.from_prewarm_pool
    assert _ready(resp)
    assert [r.pid for r in _host_status(stub).replicas if r.kernel_id == kernel] == [resp.pid]
    wait_pool(1)  # refilled after the promotion

    stub.SetPrewarmPool(local_scheduler_pb2.SetPrewarmPoolRequest(target_size=0), timeout=10)
    wait_pool(0)
    with pytest.raises(grpc.RpcError) as err:
        _start(stub, f"cold-{uuid.uuid4().hex[:6]}", use_prewarmed=True, require_prewarmed=True)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "prewarmed" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stub.SetPrewarmPool(local_scheduler_pb2.SetPrewarmPoolRequest(target_size=-1),
                            timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_bad_requests_get_clear_errors_and_the_daemon_lives(host):
    cluster, stub = host
    cases = [
        (dict(kernel_id="", replica_id=1, raft_address="127.0.0.1:0", key="k"),
         grpc.StatusCode.INVALID_ARGUMENT, "kernel_id"),
        (dict(kernel_id="x", replica_id=0, raft_address="127.0.0.1:0", key="k"),
         grpc.StatusCode.INVALID_ARGUMENT, "replica_id"),
        (dict(kernel_id="x", replica_id=1, raft_address="nowhere", key="k"),
         grpc.StatusCode.INVALID_ARGUMENT, "raft_address"),
        (dict(kernel_id="x", replica_id=1, raft_address="127.0.0.1:0", key="k",
              resources=common_pb2.ResourceSpec(gpus=-2)),
         grpc.StatusCode.INVALID_ARGUMENT, "gpus"),
        (dict(kernel_id="x", replica_id=1, raft_address="127.0.0.1:0", key="k",
              resources=common_pb2.ResourceSpec(gpus=3)),
         grpc.StatusCode.RESOURCE_EXHAUSTED, "gpus"),
    ]
    for fields, code, word in cases:
        with pytest.raises(grpc.RpcError) as err:
            stub.StartReplica(local_scheduler_pb2.StartReplicaRequest(**fields), timeout=10)
        assert err.value.code() == code, fields
        assert word in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        _commit(stub, "unknown", "r", 1)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as err:
        _commit(stub, "unknown", "r", 5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    kernel = f"dup-{uuid.uuid4().hex[:6]}"
    _start(stub, kernel)
    with pytest.raises(grpc.RpcError) as err:
        _start(stub, kernel)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert cluster.ls["solo"].poll() is None
    assert _host_status(stub).registered


def test_registers_again_with_a_new_global_scheduler_and_stops_replicas_it_does_not_know(host):
    cluster, stub = host
    kernel = f"old-{uuid.uuid4().hex[:6]}"
    resp = _start(stub, kernel)  # the GS never heard of this kernel
    cluster.gs.send_signal(signal.SIGKILL)
    cluster.gs.wait(10)
    cluster.start_gs(state="state-new")  # a Global Scheduler with an empty registry
    cluster.wait_hosts(1)
    assert cluster.status().hosts[0].host_id == "solo"
    # the Local Scheduler logs it once the new instance's answer is back, which may be just
    # after that instance lists the host
    cluster.wait(lambda: cluster.log("solo").count("registered host solo") >= 2, 10,
                 "the Local Scheduler to log its second registration")
    deadline = time.monotonic() + 20
    while any(r.kernel_id == kernel for r in _host_status(stub).replicas):
        assert time.monotonic() < deadline, "the unknown replica was not stopped"
        time.sleep(0.2)
    for _ in range(50):
        if not pid_alive(resp.pid):
            break
        time.sleep(0.1)
    assert not pid_alive(resp.pid), "the unknown replica's process outlived it"


def test_held_host_watches_are_bounded_and_the_oldest_is_answered(host):
    """``WatchHost`` holds a server thread while it waits for the daemon to stop: a caller
    holding more than MAX_HELD_WATCHES gets its oldest answered (the daemon keeps threads for
    everything else), and answer_now is answered at once."""
    from notebookos.local_scheduler.service import MAX_HELD_WATCHES

    _, stub = host
    held = [stub.WatchHost.future(local_scheduler_pb2.WatchHostRequest(), timeout=30)
            for _ in range(MAX_HELD_WATCHES + 2)]
    try:
        assert stub.WatchHost(local_scheduler_pb2.WatchHostRequest(answer_now=True),
                              timeout=5).instance_id
        deadline = time.monotonic() + 10
        while sum(f.done() for f in held) < 2:
            assert time.monotonic() < deadline, "no held watch was answered"
            time.sleep(0.05)
        assert all(f.exception() is None for f in held if f.done())
        # the others are still held (the cluster's Global Scheduler holds one watch too)
        assert sum(not f.done() for f in held) <= MAX_HELD_WATCHES
        assert _host_status(stub).host.host_id  # the daemon answers everything else
    finally:
        for f in held:
            f.cancel()


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_starts_in_progress_cost_the_host_no_thread_each(host):
    """Issue 32: a start used to hold a thread of the Local Scheduler until its replica bound
    its shell socket; now one loop watches every start (local_scheduler/ready_watch.py)."""
    cluster, stub = host
    pid = cluster.ls["solo"].pid
    first = _start(stub, f"warm-{uuid.uuid4().hex[:6]}")  # brings up what starts lazily
    assert _ready(first)
    time.sleep(0.5)  # its start's report sent
    before = _threads(pid)
    many = [_start(stub, f"many-{i}-{uuid.uuid4().hex[:6]}") for i in range(5)]
    during = _threads(pid)
    starting = sum(1 for r in _host_status(stub).replicas
                   if r.state == common_pb2.REPLICA_STATE_STARTING)
    assert starting >= 2, "the replicas started too fast for this test to mean anything"
    assert during <= before + 1, f"{during - before} more threads with {starting} starting"
    assert all(_ready(r) for r in many)
    deadline = time.monotonic() + 20
    while any(r.state == common_pb2.REPLICA_STATE_STARTING for r in _host_status(stub).replicas):
        assert time.monotonic() < deadline, "a ready replica still reported STARTING"
        time.sleep(0.1)
