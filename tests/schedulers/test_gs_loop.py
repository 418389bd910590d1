"""The Global Scheduler's gRPC server and host monitor on its loop (issue 32): a real daemon in
this process (so its threads can be named) and real Local Schedulers heartbeating to it.

- it serves gRPC from the fronts' loop: no host-monitor thread, and heartbeats take no pool
  thread (the synchronous server ran each call on one of 32 pool threads);
- an idle scheduler with healthy hosts checks them only when a heartbeat deadline could pass
  (the thread it replaces looked every 0.75 s with these settings), and still drops a host
  whose Local Scheduler died, at its deadline;
- the kernel life cycle's handlers (start, restart, wake, migrate, stop, interrupt) run on the
  loop: they hand the ``gs-grpc`` pool nothing, and a start makes no thread of its own;
- a start's and a wake's wait for their replicas holds no ``gs-work`` thread;
- so do the host calls (register, deregister, drain).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from sched_cluster import Cluster, run_cell, run_seen, stream_text

from notebookos.config import load_config
from notebookos.global_scheduler.daemon import GlobalSchedulerDaemon
from notebookos.global_scheduler.front_loop import FrontLoop
from notebookos.proto import common_pb2, global_scheduler_pb2
from notebookos.testing.credentials import join_token_metadata

HOSTS = 3


@pytest.fixture
def gs_in_process(tmp_path: Path) -> Iterator[tuple[Cluster, GlobalSchedulerDaemon, list[float]]]:
    yield from _gs_in_process(tmp_path, {})


@pytest.fixture
def gs_one_replica(tmp_path: Path) -> Iterator[tuple[Cluster, GlobalSchedulerDaemon, list[float]]]:
    """As ``gs_in_process``, with one replica a kernel (many kernels on a small machine)."""
    yield from _gs_in_process(tmp_path, {"cluster.replicas_per_kernel": 1})


@pytest.fixture
def gs_hibernating(tmp_path: Path) -> Iterator[tuple[Cluster, GlobalSchedulerDaemon, list[float]]]:
    """As ``gs_in_process``, with kernels that hibernate after 3 s without a cell."""
    yield from _gs_in_process(tmp_path, {"global_scheduler.hibernate_after_s": 3.0})


@pytest.fixture
def gs_per_cell(tmp_path: Path) -> Iterator[tuple[Cluster, GlobalSchedulerDaemon, list[float]]]:
    """As ``gs_in_process``, under ``batch``: a container per cell (cell_containers.py)."""
    yield from _gs_in_process(tmp_path, {"cluster.policy": "batch"})


def _gs_in_process(tmp_path: Path, overrides: dict
                   ) -> Iterator[tuple[Cluster, GlobalSchedulerDaemon, list[float]]]:
    cluster = Cluster(tmp_path)  # heartbeats every 0.3 s, heartbeat timeout 3 s
    config = load_config(env=cluster.env, overrides={
        "global_scheduler.host": "127.0.0.1",
        "global_scheduler.grpc_port": cluster.gs_port,
        "global_scheduler.metrics_port": 0,
        "cluster.state_dir": str(tmp_path / "state"),
        **overrides,
    })
    daemon = GlobalSchedulerDaemon(config)
    checks: list[float] = []
    check_hosts = daemon.service.check_hosts

    def counted() -> None:  # whoever checks the hosts calls this
        checks.append(time.monotonic())
        check_hosts()

    daemon.service.check_hosts = counted  # type: ignore[method-assign]
    daemon.start()
    try:
        for i in range(HOSTS):
            cluster.start_ls(f"host-{i}")
        cluster.wait_hosts(HOSTS)
        yield cluster, daemon, checks
    finally:
        cluster.close()
        daemon.stop()


def _names() -> list[str]:
    return [t.name for t in threading.enumerate()]


def test_the_scheduler_serves_grpc_from_its_loop_and_heartbeats_take_no_thread(gs_in_process):
    cluster, daemon, _ = gs_in_process
    assert "host-monitor" not in _names()
    assert isinstance(daemon.server, grpc.aio.Server)
    pool_before = sorted(n for n in _names() if n.startswith("gs-grpc"))
    threads_before = threading.active_count()
    time.sleep(2.0)  # about 20 heartbeats from the 3 hosts
    assert sorted(n for n in _names() if n.startswith("gs-grpc")) == pool_before
    assert threading.active_count() <= threads_before
    assert len(cluster.status().hosts) == HOSTS


def test_an_idle_scheduler_checks_its_healthy_hosts_only_when_a_deadline_could_pass(
        gs_in_process):
    cluster, daemon, checks = gs_in_process
    time.sleep(0.5)
    checks.clear()
    time.sleep(4.5)  # heartbeats every 0.3 s, timeout 3 s: the earliest deadline is ~2.7 s on
    assert len(checks) <= 3, f"{len(checks)} host checks in 4.5 s"
    assert len(cluster.status().hosts) == HOSTS  # none was dropped meanwhile

    # a Local Scheduler killed: its host is still dropped at its deadline
    os.killpg(cluster.ls["host-0"].pid, signal.SIGKILL)
    killed = time.monotonic()
    cluster.wait(lambda: len(cluster.status().hosts) == HOSTS - 1, 10, "host-0 dropped")
    assert time.monotonic() - killed < 3 + 1.5
    assert "host-0" not in {h.host_id for h in cluster.status().hosts}


def _hold_lock(service, seconds: float, change=None, board_current: bool = True,  # noqa: ANN001
               ) -> tuple[threading.Thread, threading.Event]:
    """A thread that takes ``service.lock`` as a pool thread does, makes ``change`` and keeps
    the lock ``seconds``. With ``board_current`` it takes it at a moment the status board is
    current (the loop made it again since the last release), as a hold starting between two
    changes finds it."""
    held = threading.Event()
    ended = threading.Event()  # set at the end of the hold, the lock still held

    def current() -> bool:  # main had no board: any moment will do
        board = getattr(service, "_board", None)
        return board is None or board.version == getattr(service.lock, "version", 0)

    def hold() -> None:
        deadline = time.monotonic() + 5
        while True:
            with service.lock:
                if not board_current or current() or time.monotonic() > deadline:
                    if change is not None:
                        change()
                    held.set()
                    time.sleep(seconds)
                    ended.set()
                    return
            time.sleep(0.005)

    thread = threading.Thread(target=hold, name="gs-work-hold", daemon=True)
    thread.hold_ended = ended  # type: ignore[attr-defined]
    thread.start()
    assert held.wait(10)
    return thread, held


def test_status_queries_are_answered_at_once_while_a_thread_holds_the_lock(gs_in_process):
    """The status queries are coroutines on the loop that never wait on ``service.lock``
    while a thread holds it long: they answer from the status board, the state as of the last
    release (the holder's change is in progress, so not in it); the heartbeats arriving
    meanwhile await the lock without stopping the loop. The change shows once let go. On the
    synchronous handlers, each query waited in a pool thread for the whole hold (and the
    first heartbeat stopped the loop)."""
    cluster, daemon, _ = gs_in_process
    service = daemon.service
    assert len(cluster.status().hosts) == HOSTS  # a dashboard polls: the board is kept
    time.sleep(0.3)

    def drain() -> None:
        service.hosts["host-1"].draining = True

    thread, _ = _hold_lock(service, 3.0, drain)
    started = time.monotonic()
    status = cluster.status()
    kernels = cluster.stub.ListKernels(global_scheduler_pb2.ListKernelsRequest(), timeout=10)
    with pytest.raises(grpc.RpcError) as missing:
        cluster.stub.GetKernelStatus(global_scheduler_pb2.GetKernelStatusRequest(
            kernel_id="no-such-kernel"), timeout=10)
    took = time.monotonic() - started
    assert thread.is_alive(), "the hold ended before the queries were answered"
    assert took < 1.0, f"the status queries took {took:.2f} s while a thread held the lock"
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(status.hosts) == HOSTS and not list(kernels.kernels)
    assert not any(h.draining for h in status.hosts)  # the hold's change is not done yet
    thread.join()
    assert {h.host_id for h in cluster.status().hosts if h.draining} == {"host-1"}
    with service.lock:
        service.hosts["host-1"].draining = False


def test_a_status_query_never_answers_from_a_board_older_than_the_last_release(
        gs_in_process):
    """With no cluster-wide query lately the board is not kept: a query while a thread holds
    the lock, after a change was let go, awaits the release (on the loop, holding no thread)
    and answers the state after it, never the older board."""
    cluster, daemon, _ = gs_in_process
    service = daemon.service
    cluster.status()
    service._board_watched_until = 0.0  # noqa: SLF001 - no dashboard: the board goes stale
    with service.lock:
        service.hosts["host-2"].draining = True  # let go: the board is now older than this
    thread, _ = _hold_lock(service, 1.5, board_current=False)
    status = cluster.status()
    # it waited for the hold to end (the thread itself may not have finished yet: after its
    # release it fires the lock's signal and refreshes the board, and the loop may answer
    # first; on a loaded machine it did)
    assert thread.hold_ended.is_set()
    assert {h.host_id for h in status.hosts if h.draining} == {"host-2"}
    with service.lock:
        service.hosts["host-2"].draining = False


def test_status_queries_stops_and_interrupts_take_no_pool_thread(gs_in_process):
    """GetKernelStatus, ListKernels, GetClusterStatus, StopKernel and InterruptKernel run on
    the loop: calls from several clients at once make no ``gs-grpc`` thread (each synchronous
    handler held one for its call). Unknown kernels are refused as before."""
    cluster, _, _ = gs_in_process
    pool_before = sorted(n for n in _names() if n.startswith("gs-grpc"))
    stub = cluster.stub
    codes: list[grpc.StatusCode] = []

    def client(n: int) -> None:
        for i in range(10):
            kernel_id = f"no-such-kernel-{n}-{i}"
            stub.GetClusterStatus(global_scheduler_pb2.GetClusterStatusRequest(), timeout=10)
            stub.ListKernels(global_scheduler_pb2.ListKernelsRequest(), timeout=10)
            for call, request in (
                    (stub.GetKernelStatus, global_scheduler_pb2.GetKernelStatusRequest),
                    (stub.StopKernel, global_scheduler_pb2.StopKernelRequest),
                    (stub.InterruptKernel, global_scheduler_pb2.InterruptKernelRequest)):
                try:
                    call(request(kernel_id=kernel_id), timeout=10)
                except grpc.RpcError as exc:
                    codes.append(exc.code())

    clients = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for t in clients:
        t.start()
    for t in clients:
        t.join(60)
    assert codes == [grpc.StatusCode.NOT_FOUND] * 4 * 10 * 3
    assert sorted(n for n in _names() if n.startswith("gs-grpc")) == pool_before


def test_a_stop_whose_client_gave_up_still_runs_to_its_end(gs_in_process):
    """StopKernel on the loop awaits the lock while a thread holds it; the client's deadline
    passing meanwhile does not cut the stop short (the handler's pool thread ran on before):
    once the lock is let go the kernel is stopped and forgotten."""
    from notebookos.global_scheduler.front import ReplicaEndpoint
    from notebookos.global_scheduler.kernels import KernelEntry, ReplicaLink
    from notebookos.resources import ResourceSpec

    cluster, daemon, _ = gs_in_process
    service = daemon.service
    with service.lock:  # a kernel as the registry knows it, its replicas on the three hosts
        entry = KernelEntry("k-gave-up", "key", "hmac-sha256", "python3", {})
        service.cluster.add_kernel(entry.kernel_id, ResourceSpec(millicpus=10, memory_mb=64))
        for rid in (1, 2, 3):
            host_id = f"host-{rid - 1}"
            endpoint = ReplicaEndpoint(rid, "127.0.0.1", 1, 2, 3, 4, host_id)
            entry.replicas[rid] = ReplicaLink(rid, host_id, endpoint, f"127.0.0.1:{rid}", 0,
                                              ready=True)
            service.cluster.place_replica(entry.kernel_id, rid, host_id)
        entry.state = "idle"
        service.kernels[entry.kernel_id] = entry
    assert cluster.kernel(entry.kernel_id).state == common_pb2.KERNEL_STATE_IDLE
    thread, _ = _hold_lock(service, 1.0, board_current=False)
    with pytest.raises(grpc.RpcError) as late:
        cluster.stub.StopKernel(global_scheduler_pb2.StopKernelRequest(
            kernel_id=entry.kernel_id), timeout=0.3)
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    thread.join()
    cluster.wait(lambda: entry.kernel_id not in service.kernels, 20, "the stop to end")
    with pytest.raises(grpc.RpcError) as gone:
        cluster.kernel(entry.kernel_id)
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


class _Watch:
    """What the daemon's threads did while a test ran: the callables handed to its ``gs-grpc``
    pool (each synchronous handler's call is one) and every thread name seen, sampled every
    5 ms."""

    def __init__(self, daemon: GlobalSchedulerDaemon) -> None:
        self.handed: list[Callable] = []
        self.names: set[str] = set()
        self._pool = daemon.grpc_pool
        self._submit = self._pool.submit
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="test-sampler", daemon=True)

    def __enter__(self) -> _Watch:
        def counted(fn, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            self.handed.append(fn)
            return self._submit(fn, *args, **kwargs)

        self._pool.submit = counted  # type: ignore[method-assign]
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._sampler.join()
        del self._pool.submit

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.names.update(_names())


def _start(cluster: Cluster, kernel_id: str, behind: bool) -> global_scheduler_pb2.StartKernelResponse:
    return cluster.stub.StartKernel(global_scheduler_pb2.StartKernelRequest(
        kernel_id=kernel_id, key=uuid.uuid4().hex, return_when_bound=behind,
        resources=common_pb2.ResourceSpec(millicpus=100, memory_mb=128)), timeout=90)


def test_starts_take_no_pool_thread_and_make_no_thread_of_their_own(gs_in_process):
    """StartKernel runs on the loop: two kernels started at once, one behind its front (as
    Jupyter's provisioner asks) and one answered once its replicas run, hand the ``gs-grpc``
    pool nothing, and the one behind its front starts its replicas in a task on the loop (a
    ``start-<kernel>`` thread did it before). Both kernels run a cell; a second start of the
    same kernel and a request without a key are refused as before."""
    cluster, daemon, _ = gs_in_process
    answers: dict[str, object] = {}

    def start(kernel_id: str, behind: bool) -> None:
        answers[kernel_id] = _start(cluster, kernel_id, behind)

    with _Watch(daemon) as watch:
        starts = [threading.Thread(target=start, args=(f"k-start-{b}", b)) for b in (True, False)]
        for t in starts:
            t.start()
        for t in starts:
            t.join(120)
        for kernel_id, answer in answers.items():
            kc = cluster.client(answer.connection)
            assert run_cell(kc, "print(6 * 7)")["reply"]["content"]["status"] == "ok", kernel_id
        with pytest.raises(grpc.RpcError) as again:
            _start(cluster, "k-start-True", True)
        with pytest.raises(grpc.RpcError) as keyless:
            cluster.stub.StartKernel(global_scheduler_pb2.StartKernelRequest(
                kernel_id="k-keyless"), timeout=10)
    assert sorted(answers) == ["k-start-False", "k-start-True"]
    assert again.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert keyless.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "key must not be empty" in keyless.value.details()
    assert not watch.handed, f"{len(watch.handed)} call(s) handed to the gs-grpc pool"
    assert not [n for n in watch.names if n.startswith("start-")]


def _waiting_for_readiness(prefixes: tuple[str, ...] = ("gs-work",)) -> int:
    """How many pool threads (named with one of ``prefixes``) wait now for replicas to answer
    (in readiness.py)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    waiting = 0
    for ident, frame in sys._current_frames().items():
        if not names.get(ident, "").startswith(prefixes):
            continue
        f = frame
        while f is not None and not f.f_code.co_filename.endswith("readiness.py"):
            f = f.f_back
        waiting += f is not None
    return waiting


@contextlib.contextmanager
def _peak_waiting_for_readiness(prefixes: tuple[str, ...] = ("gs-work",)) -> Iterator[list[int]]:
    """While the block runs, the most pool threads seen waiting for replicas to answer at once
    (sampled every 10 ms): ``peak[0]`` once the block ends."""
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak[0] = max(peak[0], _waiting_for_readiness(prefixes))

    sampler = threading.Thread(target=sample, name="test-sampler", daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()


def test_many_starts_wait_for_their_replicas_without_a_pool_thread(gs_one_replica):
    """A start waits for its replicas to answer on the loop: 20 kernels started at once behind
    their fronts (more than the 16 ``gs-work`` threads) all become idle, and no ``gs-work``
    thread waits for a replica meanwhile (each start held one for its whole wait before, and
    the starts past the 16th queued behind them)."""
    cluster, daemon, _ = gs_one_replica
    kernel_ids = [f"k-many-{i}" for i in range(20)]
    with _peak_waiting_for_readiness() as peak:
        starts = [threading.Thread(target=_start, args=(cluster, k, True)) for k in kernel_ids]
        for t in starts:
            t.start()
        for t in starts:
            t.join(120)
        deadline = time.monotonic() + 240
        states: dict[str, int] = {}
        while time.monotonic() < deadline:
            states = {k: cluster.kernel(k).state for k in kernel_ids}
            if all(s == common_pb2.KERNEL_STATE_IDLE for s in states.values()):
                break
            time.sleep(0.5)
    assert all(s == common_pb2.KERNEL_STATE_IDLE for s in states.values()), states
    assert peak[0] == 0, f"{peak[0]} gs-work thread(s) waited for replicas to answer"


def test_a_lost_replicas_replacement_waits_for_it_without_a_pool_thread(gs_in_process):
    """A replica killed (SIGKILL) is replaced by a coroutine on the loop: no ``gs-work`` thread
    waits for the new replica to answer (the recovery held one for its whole wait before),
    and the kernel is back to three replicas with its state kept."""
    cluster, daemon, _ = gs_in_process
    kernel_id = "k-replaced"
    kc = cluster.client(_start(cluster, kernel_id, False).connection)
    assert run_cell(kc, "x = 6 * 7")["reply"]["content"]["status"] == "ok"
    before = {r.replica_id: r.pid for r in cluster.kernel(kernel_id).replicas}
    victim = min(before)

    def replaced() -> bool:
        status = cluster.kernel(kernel_id)
        live = {r.replica_id for r in status.replicas if r.pid > 0}
        return (len(live) == 3 and victim not in live and max(live) > max(before)
                and status.state in (common_pb2.KERNEL_STATE_IDLE, common_pb2.KERNEL_STATE_BUSY))

    with _peak_waiting_for_readiness() as peak:
        os.kill(before[victim], signal.SIGKILL)
        cluster.wait(replaced, 90, "the lost replica's replacement")
    assert peak[0] == 0, f"{peak[0]} gs-work thread(s) waited for the replacement to answer"
    out = run_cell(kc, "print(x)")
    assert "".join(o["content"].get("text", "") for o in out["outputs"]) == "42\n"


def test_a_wake_waits_for_its_replicas_without_a_pool_thread(gs_hibernating):
    """A hibernated notebook's wake runs on the loop: two notebooks woken at once, one by
    WakeKernel and one by a cell, start their replicas from their checkpoints while no
    ``gs-work`` thread waits for a replica to answer (each wake held one for its whole wait
    before, the replicas' start and restore: seconds). Both wake with their state."""
    cluster, daemon, _ = gs_hibernating
    clients = {}
    for kernel_id in ("k-wake-grpc", "k-wake-cell"):
        kc = clients[kernel_id] = cluster.client(_start(cluster, kernel_id, False).connection)
        assert run_cell(kc, "x = 6 * 7")["reply"]["content"]["status"] == "ok"
    asleep = common_pb2.KERNEL_STATE_HIBERNATED
    cluster.wait(lambda: all(cluster.kernel(k).state == asleep for k in clients), 90,
                 "both kernels to hibernate")
    with _peak_waiting_for_readiness() as peak:
        woken = cluster.stub.WakeKernel(
            global_scheduler_pb2.WakeKernelRequest(kernel_id="k-wake-grpc"), timeout=10)
        by_cell = run_seen(clients["k-wake-cell"], "print(x)", timeout=120)
        cluster.wait(lambda: cluster.kernel("k-wake-grpc").state
                     == common_pb2.KERNEL_STATE_IDLE, 120, "the woken kernel to be idle")
        status = cluster.kernel("k-wake-grpc")
        after = run_seen(clients["k-wake-grpc"], "print(x)", timeout=120)
    assert peak[0] == 0, f"{peak[0]} gs-work thread(s) waited for replicas to answer"
    assert woken.waking
    assert "woke from hibernation in" in status.message and len(status.replicas) == 3
    for run in (by_cell, after):
        assert run["reply"]["content"]["status"] == "ok", run["reply"]["content"]
        assert stream_text(run, "stdout") == "42\n"


def test_a_cells_container_starts_without_a_pool_thread_waiting(gs_per_cell):
    """Under ``batch`` every cell starts a container of its own: its start (the container's
    wait to answer, seconds with a restore) is a coroutine on the loop, so no pool thread (the
    placement pool's, ``gs-work``) waits for it to answer; before, a placement thread blocked
    for each cell's container start. The second cell's container restores the first's state."""
    cluster, daemon, _ = gs_per_cell
    kc = cluster.client(_start(cluster, "k-per-cell", False).connection)
    pool_threads = ("gs-work", "place-")  # the gs-work pool's and the placement pool's
    with _peak_waiting_for_readiness(pool_threads) as peak:
        first = run_seen(kc, "x = 6 * 7", timeout=120)
        second = run_seen(kc, "print(x)", timeout=120)
    assert peak[0] == 0, f"{peak[0]} pool thread(s) waited for a container to answer"
    assert first["reply"]["content"]["status"] == "ok", first["reply"]["content"]
    assert second["reply"]["content"]["status"] == "ok", second["reply"]["content"]
    assert stream_text(second, "stdout") == "42\n"


def test_wakes_and_migrations_take_no_pool_thread(gs_in_process):
    """WakeKernel and MigrateReplica run on the loop: a wake asked of an awake kernel (and of
    an unknown one), a migration refused for its arguments and a real one (a replica moved to
    a fourth host, its Local Scheduler calls in the ``gs-work`` pool, its new replica waited
    for on the loop) hand the ``gs-grpc`` pool nothing, and no pool thread waits for the new
    replica to answer. The kernel runs a cell on its new replica set."""
    cluster, daemon, _ = gs_in_process
    kernel_id = "k-moved"
    kc = cluster.client(_start(cluster, kernel_id, False).connection)
    assert run_cell(kc, "x = 6 * 7")["reply"]["content"]["status"] == "ok"
    cluster.start_ls("host-3")
    cluster.wait_hosts(HOSTS + 1)
    moved_from = next(r.host_id for r in cluster.kernel(kernel_id).replicas if r.replica_id == 1)
    stub = cluster.stub
    with _peak_waiting_for_readiness() as peak, _Watch(daemon) as watch:
        awake = stub.WakeKernel(global_scheduler_pb2.WakeKernelRequest(kernel_id=kernel_id),
                                timeout=10)
        with pytest.raises(grpc.RpcError) as unknown:
            stub.WakeKernel(global_scheduler_pb2.WakeKernelRequest(kernel_id="k-none"),
                            timeout=10)
        with pytest.raises(grpc.RpcError) as bad:
            stub.MigrateReplica(global_scheduler_pb2.MigrateReplicaRequest(
                kernel_id=kernel_id, replica_id=0), timeout=10)
        moved = stub.MigrateReplica(global_scheduler_pb2.MigrateReplicaRequest(
            kernel_id=kernel_id, replica_id=1, target_host_id="host-3"), timeout=90)
    assert not awake.waking
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert moved.target_host_id == "host-3" and moved.replica.host_id == "host-3"
    # the migration's new replica is waited for on the loop (a gs-work thread waited before)
    assert peak[0] == 0, f"{peak[0]} gs-work thread(s) waited for the new replica to answer"
    hosts = {r.host_id for r in cluster.kernel(kernel_id).replicas}
    assert "host-3" in hosts and moved_from not in hosts
    assert not watch.handed, f"{len(watch.handed)} call(s) handed to the gs-grpc pool"
    assert run_cell(kc, "print(x)")["reply"]["content"]["status"] == "ok"


def test_restarts_wait_out_a_start_on_the_loop_and_take_no_pool_thread(gs_in_process):
    """RestartKernel runs on the loop: asked right after a start behind the front was
    answered (its replicas still starting), it waits the start out by awaiting the kernel's
    changes (the synchronous handler slept in a ``gs-grpc`` thread), then starts fresh
    replicas behind the same ports; a restart of a running kernel and of an unknown one hand
    the ``gs-grpc`` pool nothing either."""
    cluster, daemon, _ = gs_in_process
    stub = cluster.stub
    with _Watch(daemon) as watch:
        first = _start(cluster, "k-restarted", True)
        restarted = stub.RestartKernel(global_scheduler_pb2.RestartKernelRequest(
            kernel_id="k-restarted"), timeout=120)
        kc = cluster.client(first.connection)
        assert run_cell(kc, "x = 1")["reply"]["content"]["status"] == "ok"
        again = stub.RestartKernel(global_scheduler_pb2.RestartKernelRequest(
            kernel_id="k-restarted"), timeout=120)
        with pytest.raises(grpc.RpcError) as unknown:
            stub.RestartKernel(global_scheduler_pb2.RestartKernelRequest(kernel_id="k-none"),
                               timeout=10)
    assert restarted.connection.shell_port == first.connection.shell_port
    assert again.connection.shell_port == first.connection.shell_port
    assert again.status.state == common_pb2.KERNEL_STATE_IDLE and len(again.status.replicas) == 3
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    fresh = run_cell(kc, "print('x' in dir())")
    assert fresh["reply"]["content"]["status"] == "ok"
    assert "".join(o["content"].get("text", "") for o in fresh["outputs"]) == "False\n"
    assert not watch.handed, f"{len(watch.handed)} call(s) handed to the gs-grpc pool"
    assert not [n for n in watch.names if n.startswith("start-")]


def test_host_registrations_and_drains_take_no_pool_thread(gs_in_process):
    """RegisterHost, DeregisterHost and DrainHost run on the loop: a fourth host registering
    (and a registration refused for its capacity), a drain of a host running a replica (moved
    to the fourth host, its migration in the ``gs-work`` pool) and of an unknown host, and a
    deregistration of an unknown host and of the drained one hand the ``gs-grpc`` pool
    nothing. The kernel runs a cell on its new replica set."""
    cluster, daemon, _ = gs_in_process
    kernel_id = "k-drained"
    kc = cluster.client(_start(cluster, kernel_id, False).connection)
    assert run_cell(kc, "x = 6 * 7")["reply"]["content"]["status"] == "ok"
    stub, token = cluster.stub, join_token_metadata()
    drained = next(r.host_id for r in cluster.kernel(kernel_id).replicas if r.replica_id == 1)
    with _Watch(daemon) as watch:
        cluster.start_ls("host-3")
        cluster.wait_hosts(HOSTS + 1)
        with pytest.raises(grpc.RpcError) as no_gpus:
            stub.RegisterHost(global_scheduler_pb2.RegisterHostRequest(
                host_id="host-x", address="127.0.0.1:9", instance_id="x",
                capacity=common_pb2.ResourceSpec(millicpus=1000, memory_mb=1024)),
                timeout=10, metadata=token)
        moved = stub.DrainHost(global_scheduler_pb2.DrainHostRequest(
            host_id=drained, deadline_s=60), timeout=90, metadata=token)
        with pytest.raises(grpc.RpcError) as unknown_drain:
            stub.DrainHost(global_scheduler_pb2.DrainHostRequest(host_id="host-x", deadline_s=5),
                           timeout=10, metadata=token)
        with pytest.raises(grpc.RpcError) as unknown_gone:
            stub.DeregisterHost(global_scheduler_pb2.DeregisterHostRequest(host_id="host-x"),
                                timeout=10, metadata=token)
        gone = stub.DeregisterHost(global_scheduler_pb2.DeregisterHostRequest(
            host_id=drained, reason="test"), timeout=10, metadata=token)
    assert no_gpus.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "zero GPUs" in no_gpus.value.details()
    assert (moved.moved, moved.stayed) == (1, 0), moved
    assert unknown_drain.value.code() == grpc.StatusCode.NOT_FOUND
    assert unknown_gone.value.code() == grpc.StatusCode.NOT_FOUND
    assert gone.replicas_lost == 0
    hosts = {r.host_id for r in cluster.kernel(kernel_id).replicas}
    assert "host-3" in hosts and drained not in hosts
    assert not watch.handed, f"{len(watch.handed)} call(s) handed to the gs-grpc pool"
    assert run_cell(kc, "print(x)")["reply"]["content"]["status"] == "ok"


class _LoopLag:
    """The longest the fronts' loop took to run a callback handed to it, sampled every 20 ms
    from a thread of its own while the block runs: how long the loop stood still."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="loop-lag", daemon=True)

    def _sample(self) -> None:
        loop = FrontLoop.shared().loop
        while not self._done.is_set():
            ran = threading.Event()
            asked = time.monotonic()
            loop.call_soon_threadsafe(ran.set)
            ran.wait(30)
            self.longest = max(self.longest, time.monotonic() - asked)
            time.sleep(0.02)

    def __enter__(self) -> _LoopLag:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(35)


def test_a_cells_start_and_end_never_stop_the_loop_while_a_thread_holds_the_lock(
        gs_in_process):
    """The fronts' hooks for a cell (its ``execute_input``, its reply, its GPUs' release) are
    made on the loop without waiting for ``service.lock``: a cell that starts and ends while a
    thread holds the lock for 3 s stops the loop for none of it (each hook took the lock the
    blocking way, the loop and every front standing still until the hold ended), its reply
    reaches the client during the hold, and the changes are made, in order, once it ends
    (state_lock.LoopChanges): the kernel's GPUs are free again and no cell is left running."""
    cluster, daemon, _ = gs_in_process
    service = daemon.service
    kernel_id = "k-held"
    response = cluster.stub.StartKernel(global_scheduler_pb2.StartKernelRequest(
        kernel_id=kernel_id, key=uuid.uuid4().hex,
        resources=common_pb2.ResourceSpec(millicpus=100, memory_mb=128, gpus=1)), timeout=90)
    kc = cluster.client(response.connection)
    assert run_cell(kc, "import time")["reply"]["content"]["status"] == "ok"
    with _LoopLag() as lag:
        msg_id = kc.execute("time.sleep(1.0); print('done')")
        cluster.wait(lambda: any(e.executions for e in service.kernels.values()), 10,
                     "the cell to be placed")
        thread, _ = _hold_lock(service, 3.0, board_current=False)
        held = time.monotonic()
        reply = kc.get_shell_msg(timeout=30)
        replied = time.monotonic() - held
        answered_during_hold = not thread.hold_ended.is_set()
        thread.join()
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "ok"
    assert answered_during_hold, f"the reply waited for the thread's hold to end ({replied} s)"
    assert replied < 2.0, f"the cell ended {replied:.2f} s into the hold, not during it"
    assert lag.longest < 0.5, f"the loop stood still for {lag.longest:.2f} s on the lock"
    cluster.wait(lambda: service._loop_changes.pending() == 0, 10,  # noqa: SLF001
                 "the queued changes to be made")
    with service.lock:
        entry = service.kernels[kernel_id]
        assert not entry.executions and not entry.cell_arrived
    cluster.wait(lambda: sum(h.gpus_committed for h in cluster.status().hosts) == 0, 10,
                 "the cell's GPUs to be released")


def test_a_per_cell_containers_cell_waits_for_a_held_lock_without_stopping_the_loop(
        gs_per_cell):
    """Under ``batch`` a cell joins the cluster-wide cell queue (cell_containers.py): its
    arrival and the queue's dispatcher step take ``service.lock`` without blocking the loop
    (``StateLock.held``, ``LoopDispatcher(lock=...)``). A cell sent while a thread holds the
    lock for 2 s waits for it, the loop running on (the code before stood still for the whole
    hold), and runs once it is let go."""
    cluster, daemon, _ = gs_per_cell
    service = daemon.service
    kc = cluster.client(_start(cluster, "k-per-cell-held", False).connection)
    assert run_cell(kc, "x = 6 * 7", timeout=120)["reply"]["content"]["status"] == "ok"
    cluster.wait(lambda: service.kernels["k-per-cell-held"].state == "parked", 30,
                 "the kernel to park")
    with _LoopLag() as lag:
        thread, _ = _hold_lock(service, 2.0, board_current=False)
        msg_id = kc.execute("print(x)")
        thread.join()
        reply = kc.get_shell_msg(timeout=120)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "ok", reply["content"]
    assert lag.longest < 0.5, f"the loop stood still for {lag.longest:.2f} s on the lock"
