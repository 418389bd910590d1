"""What the Global Scheduler knows about each host beyond its accounting: address, liveness."""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from notebookos.proto import local_scheduler_pb2
from notebookos.proto import local_scheduler_pb2_grpc as ls_grpc
from notebookos.security import Connect

log = logging.getLogger(__name__)


@dataclass
class HostLink:
    host_id: str
    address: str
    instance_id: str
    gpus: list[dict[str, Any]]  # [{"device_id", "name", "vram_gb"}]
    virtual_gpus: bool
    prewarm_pool_size: int = 0  # prewarmed processes ready now (reported)
    prewarm_pool_target: int = 0  # how many the host is asked to keep
    last_heartbeat: float = field(default_factory=time.time)
    draining: bool = False
    metrics_address: str = ""  # host:port of the LS's /metrics (empty: it serves none)
    # opens a channel to the host with the Global Scheduler's credentials (mutual TLS)
    connect: Connect = field(kw_only=True, repr=False)
    _stub: ls_grpc.LocalSchedulerStub | None = None
    _channel: grpc.Channel | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # releases sent and not answered yet, with the replica each is for
    _releases: list[tuple[tuple[str, int], futures.Future]] = field(default_factory=list)
    _held_releases: list[local_scheduler_pb2.ReleaseGpusRequest] = field(default_factory=list)
    # which hold the timer set last is for: one set for an earlier hold (whose releases a
    # commit took or carried) sends nothing (``_send_held_releases``)
    _hold_generation: int = 0
    # What this link's commits bound, by the host's request id: ((kernel, replica), device ids,
    # the host instance that bound them); the newest COMMITS_KEPT
    _commitments: OrderedDict[str, tuple[tuple[str, int], list[int], str]] = field(
        default_factory=OrderedDict)
    # a cell's request id -> the host's request id of the commitment it took over
    _taken_over: dict[str, str] = field(default_factory=dict)
    # Since when the host's Local Scheduler does not answer (0: it does): a ``WatchHost`` call
    # held open on it fails the moment its connection closes (the daemon died), long before
    # the heartbeat timeout; a probe that waits for the channel clears it once it answers.
    # Event-driven: gRPC's completion queue reports both, nothing here wakes to look.
    unreachable_since: float = 0.0
    # Since when the host answers nothing at all (0: it does, or it only refused): the held call
    # failed for want of an answer to gRPC's keepalive pings ("ping timeout"), as when its
    # machine or its network is gone; a daemon that exited closes its connection instead.
    # check_hosts declares such a host lost after global_scheduler.silent_host_timeout_s.
    silent_since: float = 0.0
    # Called (on gRPC's thread, with the host id) when the held call failed because the host's
    # connection was closed or reset, not for want of an answer: a daemon that exited alone,
    # or its whole node killed (host_registry.py's node probe tells which).
    on_reset: Callable[[str], None] | None = field(default=None, kw_only=True, repr=False)
    # Called (on gRPC's thread) when ``unreachable_since`` or ``silent_since`` is set: a
    # deadline of the host monitor came closer (host_monitor.py).
    on_liveness: Callable[[], None] | None = field(default=None, kw_only=True, repr=False)
    _watch_call: grpc.Future | None = None
    _closed: bool = False

    def watch(self) -> None:
        """Hold a ``WatchHost`` call open on the host (its end says the daemon is gone)."""
        self._watch_call_start(held=True)

    def _watch_call_start(self, *, held: bool) -> None:
        with self._lock:
            if self._closed:
                return
            stub = self._stub_locked()
        request = local_scheduler_pb2.WatchHostRequest(answer_now=not held)
        # held: fails at once if the daemon is not there now; a probe waits for the channel
        call = stub.WatchHost.future(request, wait_for_ready=not held)
        with self._lock:
            closed = self._closed
            if not closed:
                self._watch_call = call
        if closed:  # closed meanwhile (its channel closes or has closed): no watch now
            call.cancel()
            return
        call.add_done_callback(lambda done: self._watch_call_done(done, held))

    def _watch_call_done(self, call: grpc.Future, held: bool) -> None:
        """On gRPC's thread: a held call ended (the daemon is gone or stopping), or a probe was
        answered (it is back) or failed."""
        with self._lock:
            if self._closed or call is not self._watch_call or call.cancelled():
                return
        failed = call.exception() is not None
        if held and not failed:  # answered: the daemon stops, or let another watch in: check
            self._watch_call_start(held=False)
            return
        if failed:
            changed = False
            if not self.unreachable_since:
                self.unreachable_since = time.time()
                changed = True
                log.warning("host %s: its Local Scheduler at %s does not answer (%s)",
                            self.host_id, self.address, _why(call.exception()))
            went_silent = held and not self.silent_since and _unanswered(call.exception())
            if went_silent:
                self.silent_since = time.time()
                changed = True
                log.warning("host %s answers no keepalive ping: its machine or its network may "
                            "be gone", self.host_id)
            if changed and self.on_liveness is not None:
                self.on_liveness()
            if not went_silent and held and self.on_reset is not None:
                self.on_reset(self.host_id)
            if not held:  # a probe failed (not for want of a connection): try again later
                _release_timer().after(1.0, lambda: self._watch_call_start(held=False))
            else:
                self._watch_call_start(held=False)
            return
        if self.unreachable_since:
            log.info("host %s: its Local Scheduler answers again", self.host_id)
            # An answer is as good as a heartbeat: a host that hung longer than the heartbeat
            # timeout and answers again must not be declared lost for the heartbeats it missed
            # while hung, before its next heartbeat can arrive.
            self.last_heartbeat = max(self.last_heartbeat, time.time())
        self.unreachable_since = 0.0
        self.silent_since = 0.0
        self._watch_call_start(held=True)

    def _stop_watch(self) -> None:
        with self._lock:
            call, self._watch_call = self._watch_call, None
        if call is not None:
            call.cancel()
        self.unreachable_since = 0.0
        self.silent_since = 0.0

    def readdress(self, address: str) -> Callable[[], None]:
        """The host's Local Scheduler restarted (at a new address, or the same): calls go there
        from now on, on a fresh channel with a fresh watch. Returns the slow part, to be run
        without the Global Scheduler's lock: the old channel closed (which waits for gRPC's
        thread) and the new watch started (which starts the channel's thread)."""
        with self._lock:
            self.address = address
            channel, self._channel, self._stub = self._channel, None, None
            call, self._watch_call = self._watch_call, None
        self.unreachable_since = 0.0
        self.silent_since = 0.0

        def finish() -> None:
            if call is not None:
                call.cancel()
            if channel is not None:
                channel.close()
            self.watch()
        return finish

    @property
    def stub(self) -> ls_grpc.LocalSchedulerStub:
        with self._lock:
            return self._stub_locked()

    def _stub_locked(self) -> ls_grpc.LocalSchedulerStub:
        if self._stub is None:
            self._channel = self.connect(self.address)
            self._stub = ls_grpc.LocalSchedulerStub(self._channel)
        return self._stub

    def release_gpus_async(self, request: local_scheduler_pb2.ReleaseGpusRequest) -> None:
        """Release a cell's GPUs off the cell's critical path. The release is held back for
        ``RELEASE_HOLD_S``: the next commit on this host carries it (one call instead of two, as
        when a notebook runs cells back to back), or it goes out on its own when the hold ends.
        Either way the host sees it before any later commit; the Global Scheduler's accounting
        counts the GPUs free at once. A next cell of the same replica that wants as many GPUs
        within the hold takes the commitment over instead (``take_over_held``): no call at
        all, and this release then names the host's request id of the commitment."""
        with self._lock:
            host_request = self._taken_over.pop(request.request_id, None)
            if host_request is not None:  # the host knows this cell's GPUs by that id
                request = local_scheduler_pb2.ReleaseGpusRequest(
                    kernel_id=request.kernel_id, replica_id=request.replica_id,
                    request_id=host_request, all_requests=request.all_requests)
            first = not self._held_releases
            self._held_releases.append(request)
            if first:
                self._hold_generation += 1
                generation = self._hold_generation
        if first:
            _release_timer().after(RELEASE_HOLD_S,
                                   lambda: self._send_held_releases(generation))

    def _take_held_releases(self) -> list[local_scheduler_pb2.ReleaseGpusRequest]:
        with self._lock:
            held, self._held_releases = self._held_releases, []
            self._forget_commitments(held)
        return held

    def _forget_commitments(self, releases: list[local_scheduler_pb2.ReleaseGpusRequest]) -> None:
        """Lock held: these releases go to the host now, their commitments end."""
        for r in releases:
            self._commitments.pop(r.request_id, None)

    def take_over_held(self, kernel_id: str, replica_id: int, request_id: str,
                       gpus: int) -> list[int] | None:
        """The devices of a commitment this replica's previous cell left held for release, when
        the new cell wants as many: the release is dropped and the cell keeps the devices (no
        call to the host; its release later names the host's request id). None otherwise.
        Never blocks (this link's lock only): the fronts' loop calls it (``_try_held``)."""
        with self._lock:
            for i, r in enumerate(self._held_releases):
                if (r.kernel_id, r.replica_id) != (kernel_id, replica_id) or r.all_requests:
                    continue
                owner, device_ids, instance = self._commitments.get(
                    r.request_id, (None, [], ""))
                if owner != (kernel_id, replica_id) or len(device_ids) != gpus \
                        or instance != self.instance_id:
                    return None  # bound elsewhere, or by a host instance that is gone
                del self._held_releases[i]
                self._taken_over[request_id] = r.request_id
                while len(self._taken_over) > COMMITS_KEPT:
                    self._taken_over.pop(next(iter(self._taken_over)))
                return list(device_ids)
        return None

    def _send_held_releases(self, generation: int | None = None) -> None:
        """The hold ended with no commit to carry them: send them. Taken and registered as
        sent in one step: in between, a commit found them neither held nor on their way, went
        out before them, and the host refused it (the replica still held the previous cell's
        GPUs), so the cell left its sticky executor.

        ``generation``: the hold the timer was set for. The releases of an earlier hold were
        taken by a commit (or taken over by the next cell) meanwhile; what is held now is a
        later hold's, whose own timer sends it: sent by the earlier timer, it was held for less
        than RELEASE_HOLD_S, and a notebook's cells back to back lost their take-over (29% of
        them paid a CommitGpus call, p90 1.9 ms before the cell was sent, issue 36)."""
        stub = self.stub  # its property takes the lock
        with self._lock:
            if generation is not None and generation != self._hold_generation:
                return
            held, self._held_releases = self._held_releases, []
            self._forget_commitments(held)
            self._submit_releases(stub, held)

    def _send_releases(self, requests: list[local_scheduler_pb2.ReleaseGpusRequest]) -> None:
        """Send releases without waiting for the answers (``commit_gpus`` waits for them)."""
        stub = self.stub
        with self._lock:
            self._submit_releases(stub, requests)

    def _submit_releases(self, stub: ls_grpc.LocalSchedulerStub,
                         requests: list[local_scheduler_pb2.ReleaseGpusRequest]) -> None:
        """Lock held: submit each release and register its future (``_report_release`` takes
        no lock, so a future already done may call it here)."""
        self._releases = [(o, f) for o, f in self._releases if not f.done()]
        for request in requests:
            future = _release_pool().submit(stub.ReleaseGpus, request, timeout=5)
            future.add_done_callback(self._report_release)
            self._releases.append(((request.kernel_id, request.replica_id), future))

    def releasing(self, kernel_id: str, replica_id: int) -> bool:
        """Whether a release for this replica is held or on its way: the host may still report
        GPUs the Global Scheduler has already released (not an orphaned commitment)."""
        with self._lock:
            return (any((r.kernel_id, r.replica_id) == (kernel_id, replica_id)
                        for r in self._held_releases)
                    or any(o == (kernel_id, replica_id) and not f.done()
                           for o, f in self._releases))

    def _report_release(self, future: futures.Future) -> None:
        try:
            future.result()
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:  # the replica stopped: nothing held
                log.debug("release of GPUs on %s: %s", self.host_id, exc.details())
                return
            log.warning("release of GPUs on %s failed: %s", self.host_id, exc.details())
        except Exception as exc:  # noqa: BLE001 - cancelled at shutdown
            log.info("release of GPUs on %s did not finish: %s", self.host_id, exc)

    def commit_gpus(self, kernel_id: str, replica_id: int, request_id: str, gpus: int, *,
                    shareable: bool = False) -> tuple[list[int] | None, str]:
        """Ask this host to commit ``gpus`` GPUs to a replica for one request, after every
        release asked for before (held releases ride on the commit): (device ids, "") or
        (None, why not). ``shareable``: one other kernel's cell may later share them."""
        ids, _, reason = self.commit_gpus_shared(kernel_id, replica_id, request_id, gpus,
                                                 shareable=shareable)
        return ids, reason

    def commit_gpus_shared(self, kernel_id: str, replica_id: int, request_id: str, gpus: int,
                           *, shareable: bool = False, share: bool = False,
                           preferred: list[int] | None = None
                           ) -> tuple[list[int] | None, list[int], str]:
        """``commit_gpus`` that may join devices another cell holds (``share``: the devices of
        ``preferred``): (device ids, the ones shared, "") or (None, [], why not)."""
        if not shareable and not share and not preferred:
            taken = self.take_over_held(kernel_id, replica_id, request_id, gpus)
            if taken is not None:
                return taken, [], ""
        held = self._take_held_releases()
        self._wait_for_sent_releases()
        try:
            resp = self.stub.CommitGpus(local_scheduler_pb2.CommitGpusRequest(
                kernel_id=kernel_id, replica_id=replica_id, request_id=request_id, gpus=gpus,
                release_first=held, shareable=shareable, share=share,
                preferred_device_ids=preferred or []), timeout=5)
        except grpc.RpcError as exc:
            self._send_releases(held)  # the host may not have applied them (twice is harmless)
            return None, [], f"host {self.host_id}: {exc.details()}"
        if not resp.committed:
            return None, [], f"host {self.host_id}: {resp.reason}"
        if not shareable and not share:
            with self._lock:
                self._commitments[request_id] = ((kernel_id, replica_id),
                                                 list(resp.device_ids), self.instance_id)
                while len(self._commitments) > COMMITS_KEPT:
                    self._commitments.popitem(last=False)
        return list(resp.device_ids), list(resp.shared_device_ids), ""

    def _wait_for_sent_releases(self, timeout: float = 5.0) -> None:
        """Wait until every release sent to this host so far has been answered (or failed)."""
        with self._lock:
            pending = [f for _, f in self._releases]
            self._releases = []
        for future in pending:
            try:
                future.result(timeout=timeout)
            except Exception:  # noqa: BLE001 - reported by _report_release
                pass

    @property
    def ip(self) -> str:
        return self.address.rpartition(":")[0] or "127.0.0.1"

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channel, self._channel, self._stub = self._channel, None, None
        self._stop_watch()
        # Not under the lock: closing a channel waits for gRPC's thread, which may be running a
        # watch's callback that takes the lock (a Local Scheduler that answered its held watch
        # as it deregistered, on a drained Swarm node: the Global Scheduler froze for good,
        # its registry lock held by the DeregisterHost call that closed this link).
        if channel is not None:
            channel.close()

    def to_doc(self, capacity: dict[str, Any]) -> dict[str, Any]:
        return {"host_id": self.host_id, "address": self.address,
                "instance_id": self.instance_id, "gpus": self.gpus,
                "virtual_gpus": self.virtual_gpus, "capacity": capacity,
                "prewarm_pool_size": self.prewarm_pool_size,
                "prewarm_pool_target": self.prewarm_pool_target,
                "metrics_address": self.metrics_address}


# How long a cell's GPU release waits for the next commit on its host to ride on: long enough to
# stay out of the cell's last Raft round and to meet the next cell of a notebook run back to back.
RELEASE_HOLD_S = 0.02
COMMITS_KEPT = 1024  # commitments remembered per host (one per replica executing at most)

_POOL: futures.ThreadPoolExecutor | None = None


def _why(exc: BaseException | None) -> str:
    if isinstance(exc, grpc.RpcError):
        return f"{exc.code().name}: {exc.details()}"
    return repr(exc)


def _unanswered(exc: BaseException | None) -> bool:
    """Whether a failed call failed for want of any answer (its keepalive ping timed out),
    rather than because the peer closed or refused the connection."""
    if not isinstance(exc, grpc.RpcError) or exc.code() is not grpc.StatusCode.UNAVAILABLE:
        return False
    details = (exc.details() or "").lower()
    return "ping timeout" in details or "keepalive" in details

_POOL_LOCK = threading.Lock()
_TIMER: _DelayedCalls | None = None


class _DelayedCalls:
    """One daemon thread running callbacks after a delay (a ``threading.Timer`` is a thread
    per call)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, Any]] = []
        self._seq = 0
        threading.Thread(target=self._run, daemon=True, name="gs-release-timer").start()

    def after(self, delay_s: float, call: Any) -> None:
        with self._cond:
            self._seq += 1
            entry = (time.monotonic() + delay_s, self._seq, call)
            heapq.heappush(self._due, entry)
            # The thread sleeps until the first call is due: only a new first one moves that.
            # A notebook's cells back to back each add a release due after the ones held
            # before, and woke the thread for nothing once per cell (issue 36).
            if self._due[0] is entry:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._cond.wait(None if not self._due else
                                    self._due[0][0] - time.monotonic())
                _, _, call = heapq.heappop(self._due)
            try:
                call()
            except Exception:  # noqa: BLE001 - one failed release must not stop the others
                log.exception("a delayed GPU release failed")


def _release_timer() -> _DelayedCalls:
    global _TIMER
    with _POOL_LOCK:
        if _TIMER is None:
            _TIMER = _DelayedCalls()
        return _TIMER


def _release_pool() -> futures.ThreadPoolExecutor:
    """Threads that send GPU releases (a grpc future would start a thread per call)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="gs-release")
        return _POOL
