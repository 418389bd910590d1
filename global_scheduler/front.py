"""A distributed kernel's front: the five ZMQ sockets Jupyter Server talks to, and the routing.

To Jupyter Server the front *is* the kernel. Every front of the process is served by one loop
(front_loop.py: asyncio over epoll, no polling), which owns all its sockets: the five bound front
sockets (shell, control, stdin: ROUTER; iopub: XPUB; hb: REP echo) and, per replica, DEALER
sockets to its shell/control/stdin and a SUB socket on its iopub. Other threads hand a front
work as commands, run on the loop in order with the messages it routes.

Routing (DESIGN section 3):
- ``execute_request``: ``hooks.place_execute`` picks the executor and commits its GPUs. It runs on
  a thread of the placement pool (it may wait for GPUs, for CommitGpus, for a migration), one
  cell at a time and in order, so the loop keeps routing everything else meanwhile; an interrupt withdraws
  the cells not sent yet (an ``aborted`` reply each). The
  executor gets ``execute_request`` with ``metadata.gpu_device_ids``, every other replica gets
  ``yield_request``; each copy is re-signed with the kernel key. The client sees the executor's
  reply and IOPub only (one busy, one idle); the GPUs are released on the reply.
  When the executor is the replica that ran the previous cell, its committed LEAD decides the
  election alone, so the ``yield_request`` copies are held back for ``yield_hold_s``: a short
  cell finishes without them (two fewer requests and replies on the critical path, and two
  replicas left idle). They go out when the hold ends, or at once when the executor's replica
  is dropped, so for a longer cell, or a lost executor, the standbys watch the election exactly
  as before.
- other shell requests go to one live replica; ``interrupt_request``/``shutdown_request`` on control
  go to every replica (first reply forwarded); other control requests to one replica.
- stdin: ``input_request`` from the executor goes to the client; the ``input_reply`` goes back.
- IOPub while no client subscribes (after a (re)bind, until the client's SUB reconnects) is held
  in a bounded backlog and published on the client's subscription. The replicas hold theirs while
  this front is away (kernel/iopub.py), so a cell running across a Global Scheduler restart loses
  no output: for a request this instance did not route, the first replica publishing for it is
  taken as its executor (standbys publish nothing for a ``yield_request``), so the client sees
  the executor's busy, output and idle once.
A front bound while its replicas start (``starting``) answers kernel_info itself and holds every
other request until ``replicas_ready`` (or answers them with the reason, ``start_failed``).
Messages with a bad signature (either side) are dropped and counted; nothing here raises out of the
loop.
"""

from __future__ import annotations

import datetime
import hmac
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import zmq
from jupyter_client.session import Session

from notebookos.backlog import DEFAULT_MAX_BYTES, DEFAULT_MAX_MESSAGES, Backlog
from notebookos.global_scheduler.front_loop import FrontLoop
from notebookos.global_scheduler.front_sockets import FrontSockets
from notebookos.global_scheduler.kernel_info import starting_kernel_info
from notebookos.global_scheduler.placement_worker import PlacementPool
from notebookos.unrouted import UnroutedReplies

log = logging.getLogger(__name__)

BROADCAST_CONTROL = ("interrupt_request", "shutdown_request")
ALL_YIELDED = "NotebookOSAllReplicasYielded"  # docs/kernel-protocol.md
REPLICAS_LOST = "NotebookOSReplicasLost"  # every replica running a started cell was lost
START_FAILED = "NotebookOSStartFailed"  # the replicas of a kernel that was bound never came
MAX_RESUBMISSIONS = 3
# How long a sticky executor's cell runs before the standbys get their yield_request: longer than
# a trivial cell, far shorter than the replicas' own election timeouts (docs/kernel-protocol.md).
YIELD_HOLD_S = 0.2
# how long a re-bound front's IOPub waits after the last client (re)subscription
RESUBSCRIBE_QUIET_S = 0.3
# How long a shell reply for a client that is not connected is kept (a client reconnecting after
# a Global Scheduler restart is back within a second; one that left for good never is).
UNROUTED_KEEP_S = 60.0
# The username of the requests the Global Scheduler itself sends replicas (readiness.py,
# control.py); the front forwards clients' requests with their own headers.
GS_USERNAME = "notebookos-gs"
# How often a front retries what waits for a client (kept replies, IOPub held for a resubscribing
# client, requests deferred until IOPub is subscribed): only while there is such a thing.
RETRY_S = 0.05
# At most this many rounds over a front's sockets per turn on the loop: a front flooded with
# messages lets the other fronts in between.
MAX_ROUNDS = 64


class PlacementFailed(Exception):
    """No replica can run the request now; the message says why."""


@dataclass(frozen=True)
class ReplicaEndpoint:
    replica_id: int
    ip: str
    shell_port: int
    iopub_port: int
    stdin_port: int
    control_port: int
    host_id: str = ""  # where the replica runs (the executor's reply names it to the client)


class FrontHooks(Protocol):
    def place_execute(self, kernel_id: str, msg_id: str, metadata: dict) -> tuple[int, list[int]]:
        """(executor replica id, committed GPU device ids); raises PlacementFailed. Called on
        a thread of its own: it may wait (for GPUs, a migration). Optionally the hooks also
        have ``cancel_execute(kernel_id, msg_id)``: the cell was withdrawn, stop waiting."""

    def release_execute(self, kernel_id: str, msg_id: str) -> None: ...

    def execute_finished(self, kernel_id: str, replica_id: int, msg_id: str) -> None: ...

    def execute_started(self, kernel_id: str, replica_id: int, msg_id: str) -> None:
        """The executor published ``execute_input``: the cell's code starts now. Optionally
        the hooks also have ``message_dropped(kernel_id, reason)``: the front dropped a
        message (``bad_signature`` or ``malformed``); the Global Scheduler counts it. And
        ``shutdown_requested(kernel_id)``: a client asked the kernel to shut down, so its
        replicas are about to exit on purpose."""


@dataclass
class _ReplicaSockets:
    endpoint: ReplicaEndpoint
    shell: zmq.Socket
    control: zmq.Socket
    stdin: zmq.Socket
    iopub: zmq.Socket

    def close(self) -> None:
        for s in (self.shell, self.control, self.stdin, self.iopub):
            s.close(linger=0)


@dataclass
class _Pending:
    channel: str
    idents: list[bytes]
    msg_type: str
    source: int | None  # replica whose reply and IOPub the client sees (None: first to answer)
    asked: set[int] = field(default_factory=set)
    answered: set[int] = field(default_factory=set)
    last_reply: list[bytes] | None = None
    sent_unix: float = field(default_factory=time.time)
    client_msg: dict | None = None  # the client's request (resubmission, error replies)
    frames: list[bytes] = field(default_factory=list)  # its signed frames (re-routing)
    client_msg_id: str = ""  # the client's msg_id when this is a resubmission under a new id
    attempt: int = 0
    gpu_device_ids: list[int] = field(default_factory=list)  # committed for the executor
    held_yields: list[int] = field(default_factory=list)  # standbys not sent yield_request yet
    yields_due: float = 0.0  # monotonic time the held yield_request copies go out
    placement: _Waiting | None = None  # an execute request's arrival and wait for GPUs
    started: float = 0.0  # when its executor published execute_input (monotonic)
    # The executor's ``idle`` when it came before its execute_reply: (parent id, idents, frames)
    held_idle: tuple[str, list[bytes], list[bytes]] | None = None


@dataclass
class _Waiting:
    """An ``execute_request`` not sent to a replica yet: queued, or being placed (off the
    front's loop, which keeps routing everything else meanwhile)."""

    idents: list[bytes]
    msg: dict  # the client's request
    msg_id: str  # the client's msg_id, or a resubmission's
    attempt: int
    arrived: float = field(default_factory=time.monotonic)  # at the front (its first attempt)
    withdrawn: bool = False  # interrupted while waiting: answered ``aborted``, never sent
    wait_reason: str = ""  # why it waits for GPUs, once the scheduler said so (cell_waiting)
    placed_at: float = 0.0


def _retry_id(msg_id: str, attempt: int) -> str:
    """The id a request runs under when it is placed again (``<client id>:retry<attempt>``)."""
    return f"{msg_id.rsplit(':retry', 1)[0]}:retry{attempt}"


class KernelFront:
    # A started cell whose replicas were all lost fails with REPLICAS_LOST here; a front whose
    # placement answers for such a cell itself (per-cell containers) turns this off.
    fail_lost_started_cells = True

    def __init__(
        self,
        kernel_id: str,
        key: str,
        signature_scheme: str,
        hooks: FrontHooks,
        *,
        ip: str = "127.0.0.1",
        ports: dict[str, int] | None = None,
        starting: bool = False,
        kernel_info: dict | None = None,
        bound: FrontSockets | None = None,
    ) -> None:
        self.kernel_id = kernel_id
        self.hooks = hooks
        self.ip = ip
        self.session = Session(key=key.encode(), signature_scheme=signature_scheme,
                               username=GS_USERNAME)
        self.context = zmq.Context.instance()
        # The same identity across Global Scheduler restarts: a replica's reply to a request
        # routed by the previous instance is routed by its ROUTER to this one.
        self.identity = f"notebookos-gs-{kernel_id}".encode()
        self.bad_signatures = 0
        self.malformed = 0
        self.ports: dict[str, int] = {}
        self._sockets: dict[str, zmq.Socket] = {}
        self._replicas: dict[int, _ReplicaSockets] = {}
        self._pending: dict[str, _Pending] = {}
        self._iopub_source: OrderedDict[str, int] = OrderedDict()  # msg_id -> replica
        # requests whose source was learnt from the replicas (one published output for it, or
        # answered as its executor), not assigned by this front's routing: never reassigned
        self._source_seen: OrderedDict[str, bool] = OrderedDict()
        self._input_source: OrderedDict[str, int] = OrderedDict()  # input_request -> replica
        self._aliases: OrderedDict[str, dict] = OrderedDict()  # resubmitted id -> client header
        # Cells answered whose executor has not published idle yet (it is replicating what the
        # cell changed): election id -> (executor, the client's request)
        self._awaiting_idle: OrderedDict[str, tuple[int, dict]] = OrderedDict()
        # Attempts whose election failed and that run again under a new id: their replicas'
        # busy/idle are not the cell's (election id -> attempt)
        self._superseded: OrderedDict[str, int] = OrderedDict()
        # commands for the front's loop (deque: appends and pops are atomic, and an empty
        # check costs nothing on the hot path, unlike Queue.get_nowait's exception)
        self._commands: deque[Callable[[], None]] = deque()
        self._stop = threading.Event()
        # The loop serving this front once started (front_loop.py), the sockets it watches
        # (socket -> (name, replica id), socket -> fd) and the front's next timed duty.
        self._loop: FrontLoop | None = None
        self._watched: dict[zmq.Socket, tuple[str, int | None]] = {}
        self._watched_fds: dict[zmq.Socket, int] = {}
        self._watched_replicas: dict[int, _ReplicaSockets] | None = None
        # the same sockets in one zmq_poll: reading every socket's EVENTS in one C call
        self._poller = zmq.Poller()
        self._tick: Any = None  # asyncio.TimerHandle
        self._tick_due = 0.0
        self._closed = False
        # A kernel bound before its replicas are ready (``starting``): kernel_info is answered
        # here (``kernel_info``: a replica's reply content, else one made up), every other
        # request is held, in order, until ``replicas_ready`` or ``start_failed``.
        self.kernel_info = kernel_info
        self._starting = starting
        self._start_failure: str | None = None
        self._held_requests: deque[tuple[str, list[bytes], dict, list[bytes]]] = deque()
        # Execute requests are placed one at a time, in the order they came, each on a thread
        # of its own (placement may wait for GPUs): ``_placing`` is the one being placed.
        self._waiting: deque[_Waiting] = deque()
        self._placing: _Waiting | None = None
        self._placer = PlacementPool.shared()
        self._arrivals: OrderedDict[str, float] = OrderedDict()  # client msg_id -> monotonic
        # What each cell waited for before it was sent to its executor (client msg_id ->
        # {what: why}, in order): the replicas starting, GPUs, a migration. The reply says so.
        self._waited_for: OrderedDict[str, dict[str, str]] = OrderedDict()
        # Shell requests wait (briefly) until a client has subscribed to IOPub: after a restart
        # the front's XPUB is new, and what it publishes before the client's SUB reconnects is
        # lost (ZMQ's slow joiner), so the client would wait forever for the cell's idle.
        self._iopub_subscribed = False
        # Set by a client's first frame on any client socket (an IOPub subscription, a request,
        # a heartbeat) or by close(): a kernel's replicas may wait for it to start (lifecycle).
        self.client_attached = threading.Event()
        self._deferred: list[tuple[str, list[bytes]]] = []
        self._subscription_wait_s = 3.0
        # IOPub for clients: held while no client subscribes (see the module doc).
        self._iopub_topics: set[bytes] = set()
        self.iopub_held = Backlog(DEFAULT_MAX_MESSAGES, DEFAULT_MAX_BYTES)
        self._bound_at = time.monotonic()
        # A front re-bound on its old ports (a Global Scheduler restart) has several client
        # SUBs reconnecting at once (Jupyter Server's websocket and its activity watcher); XPUB
        # reports only the first, and what is published before a later one has subscribed is
        # lost to it. So, re-bound, IOPub waits until no subscription came for a short while.
        self._rebound = bool(ports)
        self._last_subscription = 0.0
        self.preferred_replica: int | None = None
        self.yield_hold_s = YIELD_HOLD_S
        self._holding: dict[str, _Pending] = {}  # execute requests whose yields are held back
        self._epoch = os.urandom(4).hex()  # this instance, in what it sends the replicas
        self._requests_seen: OrderedDict[str, str] = OrderedDict()  # msg_id -> session|date
        self._renamed = 0
        self._bind(ports or {}, bound)

    # -- setup ------------------------------------------------------------------------------

    def _bind(self, ports: dict[str, int], bound: FrontSockets | None) -> None:
        """The five client-facing sockets: ``bound`` (a spare set bound ahead, when given and no
        ``ports`` are asked for), else bound here (``front_sockets.FrontSockets``)."""
        if bound is None or ports:
            if bound is not None:
                bound.close()
            bound = FrontSockets(self.ip, ports)
        self._sockets, self.ports = bound.sockets, bound.ports
        # a reply for a client that has not (re)connected yet is kept, not dropped
        # (retried at most every poll interval, not on every message the loop handles)
        self._unrouted = UnroutedReplies(self._sockets["shell"], keep_s=UNROUTED_KEEP_S,
                                         retry_every_s=RETRY_S)

    def start(self) -> None:
        """Serve this front on the process's front loop from now on."""
        self._loop = FrontLoop.shared()
        self._loop.call(self._service)

    @property
    def _started(self) -> bool:
        return self._loop is not None and not self._closed

    def close(self) -> None:
        """Stop routing and close every socket (on the loop, waited for up to 5 s)."""
        self._stop.set()
        self.client_attached.set()  # a start waiting for a client goes on (and finds it gone)
        if self._loop is None or not self._loop.alive():
            self._close_sockets()
            return
        try:
            self._loop.run(self._close_sockets, timeout=5)
        except TimeoutError:  # the loop is held up: it closes them when it gets there
            log.warning("kernel %s: the front loop did not close the front within 5 s",
                        self.kernel_id)

    def _close_sockets(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._cancel_tick()
        for sock in list(self._watched):
            self._unwatch(sock)
        for sock in self._sockets.values():
            sock.close(linger=0)
        for r in self._replicas.values():
            r.close()
        self._replicas.clear()

    def _run_on_loop(self, command: Callable[[], None]) -> None:
        """Run ``command`` on the front's loop (in order with the messages it routes), or
        here when the front is not served by a loop."""
        if not self._started:
            command()
            return
        assert self._loop is not None
        self._commands.append(command)
        self._loop.call(self._service)

    def replicas_ready(self) -> None:
        """The replicas of a kernel bound while ``starting`` are connected (``set_replicas``):
        send them the requests held meanwhile, in the order they came."""
        def apply() -> None:
            self._starting = False
            if self._stop.is_set():
                return
            held, self._held_requests = self._held_requests, deque()
            for channel, idents, msg, msg_list in held:
                self._route_safely(channel, idents, msg, msg_list)

        self._run_on_loop(apply)

    def withdraw_waiting(self, why: str = "the kernel was interrupted") -> None:
        """Answer every execute request not sent to a replica yet with ``aborted`` (an
        interrupt while cells wait for GPUs); thread-safe."""
        self._run_on_loop(lambda: self._withdraw_waiting(why))

    def cell_waiting(self, msg_id: str, why: str) -> None:
        """The scheduler cannot place the cell ``msg_id`` now and keeps trying: tell the
        client (a note on stderr, in the cell's output) why it waits; thread-safe."""
        def apply() -> None:
            waiting = self._placing
            if waiting is None or waiting.msg_id != msg_id or waiting.withdrawn:
                return
            first = not waiting.wait_reason
            waiting.wait_reason = why
            self._note_wait(waiting.msg, "GPUs", why)
            if first:
                self._send_note(why, waiting.msg)

        self._run_on_loop(apply)

    def cell_note(self, msg_id: str, text: str) -> None:
        """A note on stderr in the output of the cell ``msg_id`` while the scheduler places it
        (``NotebookOS: the notebook woke from hibernation in 1.2 s``); thread-safe."""
        def apply() -> None:
            waiting = self._placing
            if waiting is not None and waiting.msg_id == msg_id and not waiting.withdrawn:
                self._send_note(text, waiting.msg)

        self._run_on_loop(apply)

    def cell_migrating(self, msg_id: str, why: str) -> None:
        """The scheduler moves a replica to another host to run the cell ``msg_id``: the client
        is told (a note on stderr, once per cell: a migration takes seconds) and the reply
        will say it waited for a migration, and why; thread-safe."""
        def apply() -> None:
            waiting = self._placing
            if waiting is None or waiting.msg_id != msg_id or waiting.withdrawn:
                return
            first = "migration" not in self._waited_for.get(
                waiting.msg["header"].get("msg_id", ""), {})
            self._note_wait(waiting.msg, "migration", why)
            if first:
                self._send_note(why, waiting.msg)

        self._run_on_loop(apply)

    def _note_wait(self, request: dict, what: str, why: str) -> None:
        key = request["header"].get("msg_id", "")
        causes = self._waited_for.get(key)
        if causes is None:
            causes = {}
            self._remember(self._waited_for, key, causes)
        causes.setdefault(what, why)

    def start_failed(self, reason: str) -> None:
        """The replicas of a kernel bound while ``starting`` never came: every held request
        (and any later one) gets an error reply that says why."""
        def apply() -> None:
            self._starting = False
            self._start_failure = reason
            if self._stop.is_set():
                return
            held, self._held_requests = self._held_requests, deque()
            for channel, idents, msg, _ in held:
                self._without_replicas(channel, idents, msg)

        self._run_on_loop(apply)

    def set_replicas(self, endpoints: list[ReplicaEndpoint], wait: bool = False) -> None:
        """Connect to these replicas (and drop any other); runs on the front's thread, in order
        with the messages it routes. ``wait`` blocks until applied."""
        done = threading.Event()

        def apply() -> None:
            wanted = {e.replica_id: e for e in endpoints}
            dropped = []
            for rid in list(self._replicas):
                if rid not in wanted or self._replicas[rid].endpoint != wanted[rid]:
                    self._drain(rid)
                    self._close_replica(rid)
                    dropped.append(rid)
            self._executors_lost_before_idle(set(dropped))
            for msg_id, pending in list(self._pending.items()):
                if pending.asked & set(dropped):
                    pending.asked -= set(dropped)
                    if pending.held_yields:  # the executor is gone: the standbys decide now
                        self._send_held_yields(msg_id, pending)
                    self._settle(msg_id, pending)
            for rid, e in wanted.items():
                if rid not in self._replicas:
                    self._replicas[rid] = self._connect(e)
            self._watch_sockets()
            done.set()

        self._run_on_loop(apply)
        if wait and self._loop is not None and not self._loop.on_loop():
            done.wait(timeout=5)

    def _close_replica(self, rid: int) -> None:
        """Stop watching a replica's sockets, then close them (a closed socket's fd number is
        reused at once: the loop must not hold it)."""
        replica = self._replicas.pop(rid)
        for sock in (replica.shell, replica.control, replica.stdin, replica.iopub):
            self._unwatch(sock)
        replica.close()

    def _drain(self, rid: int) -> None:
        """Route what a replica being dropped has already sent (its last output, an idle, a
        reply): the loop may not have read it yet, and closing the sockets would lose it (a
        migrated replica's idle, a dying executor's reply)."""
        sockets = self._replicas[rid]
        for name, sock in (("replica-iopub", sockets.iopub), ("replica-shell", sockets.shell)):
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.ZMQError:
                    break
                try:
                    self._dispatch(name, rid, frames)
                except Exception:  # noqa: BLE001 - one bad message must not stop the others
                    self._dropped("malformed")
                    log.exception("kernel %s: dropping a message of replica %d", self.kernel_id,
                                  rid)

    def _connect(self, e: ReplicaEndpoint) -> _ReplicaSockets:
        def dealer(port: int) -> zmq.Socket:
            s = self.context.socket(zmq.DEALER)
            s.linger = 0
            s.setsockopt(zmq.IDENTITY, self.identity)
            s.connect(f"tcp://{e.ip}:{port}")
            return s

        sub = self.context.socket(zmq.SUB)
        sub.linger = 0
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://{e.ip}:{e.iopub_port}")
        return _ReplicaSockets(e, dealer(e.shell_port), dealer(e.control_port),
                               dealer(e.stdin_port), sub)

    # -- the loop ---------------------------------------------------------------------------

    def _watch_sockets(self) -> None:
        """Watch the client sockets and the replicas' (once the replica set changed)."""
        if self._loop is None or self._closed or self._watched_replicas == self._replicas:
            return
        wanted: dict[zmq.Socket, tuple[str, int | None]] = {}
        for name in ("shell", "control", "stdin", "hb", "iopub"):
            wanted[self._sockets[name]] = (name, None)
        for rid, r in self._replicas.items():
            for name in ("shell", "control", "stdin", "iopub"):
                wanted[getattr(r, name)] = (f"replica-{name}", rid)
        for sock in [s for s in self._watched if s not in wanted]:
            self._unwatch(sock)
        for sock, role in wanted.items():
            if sock not in self._watched:
                fd = sock.getsockopt(zmq.FD)
                self._loop.loop.add_reader(fd, self._service)
                self._watched_fds[sock] = fd
                self._poller.register(sock, zmq.POLLIN)
            self._watched[sock] = role
        self._watched_replicas = dict(self._replicas)

    def _unwatch(self, sock: zmq.Socket) -> None:
        if self._watched.pop(sock, None) is not None:
            self._poller.unregister(sock)
        fd = self._watched_fds.pop(sock, None)
        if fd is not None and self._loop is not None:
            self._loop.loop.remove_reader(fd)

    def _service(self) -> None:
        """The front's turn on the loop: apply commands, then read every socket that has a
        message until none has (a ZMQ fd signals edges, and any send or receive on a socket
        may consume its signal: each socket's ``EVENTS`` is read again after every round),
        then the timed duties, then the next timer."""
        if self._closed:
            return
        try:
            self._apply_commands()
            self._watch_sockets()
            for _ in range(MAX_ROUNDS):
                if not self._service_round() or self._closed:
                    break
            else:  # still busy: the other fronts get a turn first
                assert self._loop is not None
                self._loop.loop.call_soon(self._service)
            if not self._closed:
                self._timed_duties()
        except Exception:  # noqa: BLE001 - a dead front would leave the kernel unanswered
            log.exception("kernel %s: front loop pass failed; carrying on", self.kernel_id)
            self._watched_replicas = None  # watch the sockets again from scratch
        if not self._closed:
            self._schedule_tick()

    def _service_round(self) -> bool:
        """One message from each socket that has one; whether there was any."""
        try:
            ready = self._poller.poll(0)
        except zmq.ZMQError as exc:  # a socket closed under us: watch afresh
            log.debug("kernel %s: polling its sockets: %s", self.kernel_id, exc)
            self._watched_replicas = None
            return False
        for sock, _ in ready:
            role = self._watched.get(sock)
            if role is None or sock.closed:  # dropped earlier in this round
                continue
            name, rid = role
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                continue
            except zmq.ZMQError as exc:  # closed under us
                log.debug("kernel %s: %s socket gone: %s", self.kernel_id, name, exc)
                continue
            try:
                self._dispatch(name, rid, frames)
            except (ValueError, TypeError, KeyError, IndexError) as exc:
                self._dropped("malformed")
                log.warning("kernel %s: dropped a malformed message on %s: %s",
                            self.kernel_id, name, str(exc)[:200])
            except Exception:  # noqa: BLE001 - one bad message must not stop the kernel
                self._dropped("malformed")
                log.exception("kernel %s: dropping a message on %s", self.kernel_id, name)
            if self._commands:
                self._apply_commands()
            self._watch_sockets()
        return bool(ready)

    def _timed_duties(self) -> None:
        self._release_deferred()
        if self.iopub_held and self._iopub_topics:
            self._flush_iopub()
        if self._holding:
            self._send_due_yields()
        if self._unrouted:
            self._unrouted.retry()

    def _next_duty(self) -> float | None:
        """When the front next has something timed to do (monotonic, the loop's clock)."""
        due: float | None = None
        if self._holding:
            due = min(p.yields_due for p in self._holding.values())
        if self._deferred or (self.iopub_held and self._iopub_topics) or self._unrouted:
            soon = time.monotonic() + RETRY_S
            due = soon if due is None else min(due, soon)
        return due

    def _schedule_tick(self) -> None:
        due = self._next_duty()
        if due is None:
            self._cancel_tick()
            return
        if self._tick is not None and self._tick_due <= due:
            return  # an earlier (or the same) turn is set: it sets the next one
        self._cancel_tick()
        assert self._loop is not None
        self._tick_due = due
        self._tick = self._loop.loop.call_at(due, self._on_tick)

    def _on_tick(self) -> None:
        self._tick = None
        self._service()

    def _cancel_tick(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None

    def _dropped(self, reason: str) -> None:
        """Count a dropped message: here (the kernel's status) and in the hooks' metrics."""
        if reason == "bad_signature":
            self.bad_signatures += 1
        else:
            self.malformed += 1
        count = getattr(self.hooks, "message_dropped", None)
        if count is not None:
            count(self.kernel_id, reason)

    def _must_defer(self) -> bool:
        if self._iopub_subscribed:
            return False
        return time.monotonic() - self._bound_at < self._subscription_wait_s

    def _release_deferred(self) -> None:
        if not self._deferred or self._must_defer():
            return
        deferred, self._deferred = self._deferred, []
        for name, frames in deferred:
            try:
                self._from_client(name, frames)
            except Exception:  # noqa: BLE001 - one bad message must not stop the kernel
                self._dropped("malformed")
                log.exception("kernel %s: dropping a deferred message on %s", self.kernel_id,
                              name)

    def _apply_commands(self) -> None:
        while self._commands:
            self._commands.popleft()()

    def _dispatch(self, name: str, rid: int | None, frames: list[bytes]) -> None:
        if not self.client_attached.is_set() and not name.startswith("replica"):
            self.client_attached.set()
        if name in ("shell", "control"):
            log.debug("kernel %s: %s message from a client (%d frames)", self.kernel_id, name,
                      len(frames))
        if name == "hb":
            self._sockets["hb"].send_multipart(frames)
        elif name == "iopub":  # XPUB: (un)subscription frames from clients
            self._iopub_subscription(frames)
        elif name == "shell" and self._must_defer():
            self._deferred.append((name, frames))
        elif name in ("shell", "control", "stdin"):
            self._from_client(name, frames)
        elif name == "replica-iopub":
            self._from_replica_iopub(rid, frames)
        else:
            self._from_replica(name.removeprefix("replica-"), rid, frames)

    def _iopub_subscription(self, frames: list[bytes]) -> None:
        """XPUB reports a topic's first subscriber (``\\x01topic``) and its last one leaving
        (``\\x00topic``, also when the client's connection dies)."""
        for frame in frames:
            if frame[:1] == b"\x01":
                self._iopub_topics.add(bytes(frame[1:]))
                self._iopub_subscribed = True
                self._last_subscription = time.monotonic()
            elif frame[:1] == b"\x00":
                self._iopub_topics.discard(bytes(frame[1:]))
        if self._iopub_topics:
            self._flush_iopub()
            self._release_deferred()

    def _iopub_settling(self) -> bool:
        """Re-bound and within the first seconds: clients may still be re-subscribing."""
        if not self._rebound:
            return False
        now = time.monotonic()
        if now - self._bound_at > self._subscription_wait_s + RESUBSCRIBE_QUIET_S:
            self._rebound = False  # settled for good: the hot path skips this from now on
            return False
        return now - self._last_subscription < RESUBSCRIBE_QUIET_S

    def _publish(self, frames: list[bytes]) -> None:
        """Send on the client IOPub, or hold while no client subscribes."""
        if self._iopub_topics and not self.iopub_held and not self._iopub_settling():
            self._sockets["iopub"].send_multipart(frames)
            return
        dropped = self.iopub_held.append(frames)
        if dropped:
            log.warning("kernel %s: no IOPub subscriber; dropped %d oldest held message(s) "
                        "(%d so far)", self.kernel_id, dropped, self.iopub_held.dropped)
        self._flush_iopub()

    def _flush_iopub(self) -> None:
        if self._iopub_settling():
            return  # the loop flushes once the subscriptions have settled
        while self.iopub_held and self._iopub_topics:
            self._sockets["iopub"].send_multipart(self.iopub_held.popleft()[0])

    def _send_status(self, state: str, parent: dict) -> None:
        """A status message of the front's own (``busy``/``idle``) for the client's ``parent``."""
        self._send_iopub(self.session.msg("status", {"execution_state": state}, parent=parent),
                         b"kernel.notebookos.status")

    def _send_note(self, text: str, parent: dict) -> None:
        """A ``NotebookOS: ...`` line on stderr, in the output of the client's ``parent``."""
        self._send_iopub(self.session.msg("stream", {"name": "stderr",
                                                     "text": f"NotebookOS: {text}\n"},
                                          parent=parent), b"kernel.notebookos.stream")

    def _send_iopub(self, msg: dict, ident: bytes | list[bytes]) -> None:
        """Sign ``msg`` (a Session message dict, buffers included) and publish it."""
        frames = self.session.serialize(msg, ident=ident)
        self._publish([*frames, *msg.get("buffers", [])])

    def _verify(self, msg_list: list[bytes], content: bool = True) -> dict | None:
        """``Session.deserialize``'s checks (signature, no replay, at least five frames) and
        JSON decoding, without its date parsing and version adaptation: the front only routes,
        so header dates stay strings and every message is version 5 (both sides are
        jupyter_client sessions). ``content=False`` leaves the content frame undecoded."""
        try:
            if len(msg_list) < 5:
                raise TypeError(f"malformed message: {len(msg_list)} frames, need 5")
            if self.session.auth is not None:
                signature = msg_list[0]
                if not signature:
                    raise ValueError("unsigned message")
                if signature in self.session.digest_history:
                    raise ValueError("duplicate signature")
                if not hmac.compare_digest(signature, self.session.sign(msg_list[1:5])):
                    raise ValueError("invalid signature")
                self.session._add_digest(signature)  # noqa: SLF001 - the replay guard's store
            unpack = self.session.unpack
            msg = {"header": unpack(msg_list[1]), "parent_header": unpack(msg_list[2]),
                   "metadata": unpack(msg_list[3]), "buffers": msg_list[5:]}
            if content:
                msg["content"] = unpack(msg_list[4])
            return msg
        except (ValueError, TypeError, KeyError) as exc:
            self._dropped("bad_signature")
            log.warning("kernel %s: dropped a message: %s", self.kernel_id, str(exc)[:120])
            return None

    # -- client -> replicas -----------------------------------------------------------------

    def _from_client(self, channel: str, frames: list[bytes]) -> None:
        self._apply_commands()  # replica changes queued before this message came in
        idents, msg_list = self.session.feed_identities(frames, copy=True)
        msg = self._verify(msg_list)
        if msg is None:
            return
        if channel == "stdin":
            rid = self._input_source.get(msg["parent_header"].get("msg_id", ""))
            target = self._replicas.get(rid) if rid is not None else None
            if target is not None:
                target.stdin.send_multipart([b"<IDS|MSG>", *msg_list])
            return
        if self._starting:
            self._while_starting(channel, idents, msg, msg_list)
            return
        self._route_client(channel, idents, msg, msg_list)

    def _route_safely(self, channel: str, idents: list[bytes], msg: dict,
                      msg_list: list[bytes]) -> None:
        try:
            self._route_client(channel, idents, msg, msg_list)
        except Exception:  # noqa: BLE001 - one bad message must not stop the others
            self._dropped("malformed")
            log.exception("kernel %s: dropping a held message on %s", self.kernel_id, channel)

    def _route_client(self, channel: str, idents: list[bytes], msg: dict,
                      msg_list: list[bytes]) -> None:
        """A verified client request on shell or control: to the replicas."""
        msg_id = msg["header"].get("msg_id", "")
        msg_type = msg["header"].get("msg_type", "")
        live = sorted(self._replicas)
        if not live:
            self._without_replicas(channel, idents, msg)
            return
        if channel == "shell" and msg_type == "execute_request":
            msg["content_frame"] = msg_list[4]  # re-sent as is to every replica
            self._route_execute(idents, msg, self._election_id(msg), attempt=0)
            return
        if msg_type == "interrupt_request":  # cells still waiting never run; the replicas
            self._withdraw_waiting("the kernel was interrupted")  # interrupt the running one
        if channel == "control" and msg_type == "shutdown_request":
            stopping = getattr(self.hooks, "shutdown_requested", None)
            if stopping is not None:  # the replicas' exits that follow are not failures
                stopping(self.kernel_id)
        if channel == "control" and msg_type in BROADCAST_CONTROL:
            targets = live
            source = None
        else:
            pick = self.preferred_replica if self.preferred_replica in self._replicas else live[0]
            targets = [pick]
            source = pick
            self._remember(self._iopub_source, msg_id, pick)
        self._pending[msg_id] = _Pending(channel, idents, msg_type, source, asked=set(targets),
                                         client_msg=msg, frames=list(msg_list))
        for rid in targets:
            getattr(self._replicas[rid], channel).send_multipart([b"<IDS|MSG>", *msg_list])

    def _while_starting(self, channel: str, idents: list[bytes], msg: dict,
                        msg_list: list[bytes]) -> None:
        """The replicas are not ready yet: kernel_info is answered here (so the client sees a
        live kernel at once), everything else waits for them."""
        msg_type = msg["header"].get("msg_type")
        if self._answered_without_replicas(channel, idents, msg, {"starting": True}):
            return
        if msg_type == "execute_request":  # its interactivity delay counts from now
            self._remember(self._arrivals, msg["header"].get("msg_id", ""), time.monotonic())
            self._note_wait(msg, "replicas starting", "the kernel's replicas were starting")
        self._held_requests.append((channel, idents, msg, msg_list))

    def _answered_without_replicas(self, channel: str, idents: list[bytes], msg: dict,
                                   notebookos_md: dict) -> bool:
        """While no replica can answer (starting, or all being replaced): kernel_info from the
        reply kept (the kernel is alive), and an interrupt withdraws the cells waiting (nothing
        runs). True when ``msg`` was one of those and is answered."""
        msg_type = msg["header"].get("msg_type")
        if msg_type == "kernel_info_request":
            self._answer_here(channel, idents, msg, "kernel_info_reply",
                              dict(self.kernel_info or starting_kernel_info()),
                              {"notebookos": notebookos_md})
            return True
        if msg_type == "interrupt_request":
            self._withdraw_waiting("the kernel was interrupted")
            self._answer_here(channel, idents, msg, "interrupt_reply", {"status": "ok"})
            return True
        return False

    def _answer_here(self, channel: str, idents: list[bytes], parent: dict, reply_type: str,
                     content: dict, metadata: dict | None = None) -> None:
        """Reply to the client without a replica: busy, the reply, idle."""
        msg = self.session.msg
        self._send_iopub(msg("status", {"execution_state": "busy"}, parent=parent),
                         b"kernel.notebookos.status")
        self._reply(channel, self.session.serialize(
            msg(reply_type, content, parent=parent, metadata=metadata or {}), ident=idents))
        self._send_iopub(msg("status", {"execution_state": "idle"}, parent=parent),
                         b"kernel.notebookos.status")

    def _without_replicas(self, channel: str, idents: list[bytes], msg: dict) -> None:
        """A client request while the kernel has no replica connected."""
        if self._start_failure is not None:
            self._reply_error(channel, idents, msg, START_FAILED,
                              f"the kernel's replicas could not be started: "
                              f"{self._start_failure}")
            return
        msg_type = msg["header"].get("msg_type", "")
        if channel == "shell" and msg_type == "execute_request":
            # Its replicas are being replaced (every one was lost, a rebuild from the
            # checkpoint, a restart of the Global Scheduler): the placement waits for them and
            # tells the cell why, so the cell is not lost.
            self._route_execute(idents, msg, self._election_id(msg), attempt=0)
            return
        if self._answered_without_replicas(channel, idents, msg, {"replicas": 0}):
            return
        self._reply_error(channel, idents, msg, "NoReplicas",
                          f"the kernel has no live replica right now (its replicas are being "
                          f"replaced), so {msg_type or 'the request'} cannot be answered; "
                          "retry shortly")

    def _election_id(self, msg: dict) -> str:
        """The id a client's execute request runs under: its msg_id, unless an earlier request
        of a different session or time came with the same one. jupyter_client numbers the
        msg_ids of a session's clones from 0 again, so two clients of one KernelManager send
        the same ids; the replicas run one election per id, so the second cell would never
        run. A reused id gets a fresh one (the client sees its own in every reply)."""
        header = msg["header"]
        msg_id = str(header.get("msg_id", ""))
        fingerprint = f"{header.get('session')}|{header.get('date')}"
        seen = self._requests_seen.get(msg_id)
        self._remember(self._requests_seen, msg_id, fingerprint)
        if seen is None or seen == fingerprint:
            return msg_id
        self._renamed += 1
        renamed = f"{msg_id}~{self._epoch}.{self._renamed}"
        log.info("kernel %s: msg_id %s reused by another request; it runs as %s",
                 self.kernel_id, msg_id, renamed)
        self._arrivals.pop(msg_id, None)  # the earlier request's arrival
        return renamed

    def _route_execute(self, idents: list[bytes], msg: dict, msg_id: str, attempt: int) -> None:
        """Queue ``msg`` (the client's request) for placement under ``msg_id``: the client's own
        id first, a fresh one for a resubmission after every replica yielded (a failed election
        never reruns), which goes before the cells queued behind it."""
        client_msg_id = msg["header"].get("msg_id", "")
        arrived = self._arrivals.get(client_msg_id)  # held while the replicas started, a retry
        if arrived is None:
            arrived = time.monotonic()
            self._remember(self._arrivals, client_msg_id, arrived)
        waiting = _Waiting(idents, msg, msg_id, attempt, arrived)
        if attempt > 0:
            self._waiting.appendleft(waiting)
        else:
            self._waiting.append(waiting)
        self._place_next()

    def _place_next(self) -> None:
        """Place the next queued cell on the front's placement thread (placement can wait for
        GPUs, a CommitGpus call or a migration); the loop sends it when placed, in queue
        order."""
        if self._placing is not None or not self._waiting:
            return
        waiting = self._placing = self._waiting.popleft()
        metadata = dict(waiting.msg.get("metadata") or {})
        log.debug("kernel %s: placing %s (attempt %d, %d queued behind)", self.kernel_id,
                  waiting.msg_id[:8], waiting.attempt, len(self._waiting))

        def place() -> None:
            try:
                result: Any = self.hooks.place_execute(self.kernel_id, waiting.msg_id, metadata)
            except PlacementFailed as exc:
                result = exc
            except Exception as exc:  # noqa: BLE001 - the client must get an answer
                log.exception("kernel %s: placing %s failed", self.kernel_id, waiting.msg_id)
                result = PlacementFailed(f"placing the cell failed: {exc}")
            self._run_on_loop(lambda: self._placement_done(waiting, result))

        if not self._started:
            place()  # no loop to keep free (a front used without start())
        else:
            self._placer.submit(place)

    def _placement_done(self, waiting: _Waiting, result: Any) -> None:
        if self._placing is waiting:
            self._placing = None
        placed = not isinstance(result, PlacementFailed)
        if waiting.withdrawn or self._stop.is_set():
            if placed:  # its GPUs were committed meanwhile: give them back
                self.hooks.release_execute(self.kernel_id, waiting.msg_id)
            return
        if placed:
            executor, device_ids = result
            waiting.placed_at = time.monotonic()
            self._send_execute(waiting.idents, waiting.msg, waiting.msg_id, waiting.attempt,
                               executor, device_ids)
            pending = self._pending.get(waiting.msg_id)
            if pending is not None:
                pending.placement = waiting
        else:
            log.info("kernel %s: cell %s not placed: %s", self.kernel_id, waiting.msg_id[:8],
                     result)
            self._reply_error("shell", waiting.idents, waiting.msg, "NotebookOSNoGPUs",
                              str(result))
        self._place_next()

    def _withdraw_waiting(self, why: str) -> int:
        """Every execute request not sent to a replica yet (held while the replicas start,
        queued, or being placed) gets an ``aborted`` reply and never runs; returns how many."""
        withdrawn = list(self._waiting)
        self._waiting.clear()
        placing, self._placing = self._placing, None
        if placing is not None:
            withdrawn.insert(0, placing)
            cancel = getattr(self.hooks, "cancel_execute", None)
            if cancel is not None:  # stop waiting for GPUs for it
                cancel(self.kernel_id, placing.msg_id)
        kept: deque[tuple[str, list[bytes], dict, list[bytes]]] = deque()
        for held in self._held_requests:
            channel, idents, msg, _ = held
            if channel == "shell" and msg["header"].get("msg_type") == "execute_request":
                withdrawn.append(_Waiting(idents, msg, msg["header"].get("msg_id", ""), 0))
            else:
                kept.append(held)
        self._held_requests = kept
        for waiting in withdrawn:
            waiting.withdrawn = True
            self._reply_aborted(waiting, why)
        if withdrawn:
            log.info("kernel %s: %s; withdrew %d waiting cell(s)", self.kernel_id, why,
                     len(withdrawn))
        return len(withdrawn)

    def _reply_aborted(self, waiting: _Waiting, why: str) -> None:
        """busy, a note on stderr, ``execute_reply`` with status ``aborted``, idle."""
        parent, msg = waiting.msg, self.session.msg
        waited_ms = round((time.monotonic() - waiting.arrived) * 1000)
        self._send_iopub(msg("status", {"execution_state": "busy"}, parent=parent),
                         b"kernel.notebookos.status")
        note = (f"NotebookOS: {why} while this cell waited to run ({waited_ms / 1000:.1f} s); "
                "it was withdrawn and did not run.\n")
        self._send_iopub(msg("stream", {"name": "stderr", "text": note}, parent=parent),
                         b"kernel.notebookos.stream")
        metadata = {"notebookos": {"withdrawn": True, "reason": why, "waited_ms": waited_ms}}
        self._reply("shell", self.session.serialize(
            msg("execute_reply", {"status": "aborted", "execution_count": None},
                parent=parent, metadata=metadata), ident=waiting.idents))
        self._send_iopub(msg("status", {"execution_state": "idle"}, parent=parent),
                         b"kernel.notebookos.status")

    def _send_execute(self, idents: list[bytes], msg: dict, msg_id: str, attempt: int,
                      executor: int, device_ids: list[int]) -> None:
        """The request is placed on ``executor`` with ``device_ids`` committed: send it."""
        self._apply_commands()  # a migration may just have connected a new replica
        if executor not in self._replicas:
            # Lost between its placement and now (SIGKILLed just before the cell came): the
            # cell never reached a replica, so it is placed again, on the replicas left.
            self.hooks.release_execute(self.kernel_id, msg_id)
            if attempt < MAX_RESUBMISSIONS:
                retry_id = _retry_id(msg_id, attempt + 1)
                log.info("kernel %s: replica %d chosen for %s is gone; placing it again as %s",
                         self.kernel_id, executor, msg["header"].get("msg_id", ""), retry_id)
                self._route_execute(idents, msg, retry_id, attempt + 1)
                return
            self._reply_error("shell", idents, msg, "NotebookOSNoGPUs",
                              f"replica {executor} chosen for the cell is not connected "
                              f"(after {attempt + 1} placements)")
            return
        sticky = executor == self.preferred_replica  # it ran the previous cell here
        self.preferred_replica = executor
        client_msg_id = msg["header"]["msg_id"]
        if msg_id != client_msg_id:
            self._remember(self._aliases, msg_id, msg["header"])
        standbys = sorted(set(self._replicas) - {executor})
        log.debug("kernel %s: %s -> execute on replica %d (GPUs %s), yield on %s%s",
                  self.kernel_id, msg_id[:8], executor, device_ids, standbys,
                  " (held)" if sticky else "")
        pending = _Pending("shell", idents, "execute_request", executor, asked={executor},
                           client_msg=msg, client_msg_id=client_msg_id, attempt=attempt,
                           gpu_device_ids=list(device_ids))
        self._pending[msg_id] = pending
        if msg_id not in self._source_seen:  # a resent cell that already runs keeps its source
            self._remember(self._iopub_source, msg_id, executor)
        self.session.send(self._replicas[executor].shell,
                          self._elected_copy(msg, msg_id, executor, device_ids, self._epoch))
        pending.held_yields = standbys
        if sticky and self.yield_hold_s > 0:
            pending.yields_due = time.monotonic() + self.yield_hold_s
            self._holding[msg_id] = pending
        else:
            self._send_held_yields(msg_id, pending)

    @staticmethod
    def _elected_copy(msg: dict, msg_id: str, executor: int,
                      device_ids: list[int] | None, epoch: str) -> dict:
        """The client's request as one replica gets it: ``execute_request`` with the committed
        GPUs for the executor (``device_ids`` given), ``yield_request`` for the others.
        ``epoch`` names this front instance: a request that a restarted front sends again
        (its client resent it) must not look like a replay to the replicas' Session, which
        drops a repeated signature; they answer it from their record instead."""
        copy = {
            "header": {**msg["header"], "msg_id": msg_id},
            "parent_header": msg["parent_header"],
            "metadata": dict(msg.get("metadata") or {}),
            "content": msg.get("content_frame") or msg["content"],
            "buffers": msg.get("buffers", []),
        }
        notebookos_md = dict(copy["metadata"].get("notebookos") or {})
        notebookos_md["target_replica_id"] = executor
        notebookos_md["front_epoch"] = epoch
        copy["metadata"]["notebookos"] = notebookos_md
        if device_ids is not None:
            copy["metadata"]["gpu_device_ids"] = list(device_ids)
        else:
            copy["header"]["msg_type"] = "yield_request"
        return copy

    def _send_held_yields(self, msg_id: str, pending: _Pending) -> None:
        """Send the ``yield_request`` copies still held for this request (to the replicas still
        connected) and expect their replies."""
        self._holding.pop(msg_id, None)
        held, pending.held_yields = pending.held_yields, []
        assert pending.client_msg is not None and pending.source is not None
        for rid in held:
            r = self._replicas.get(rid)
            if r is not None:
                pending.asked.add(rid)
                self.session.send(r.shell, self._elected_copy(pending.client_msg, msg_id,
                                                              pending.source, None, self._epoch))

    def _send_due_yields(self) -> None:
        now = time.monotonic()
        for msg_id, pending in list(self._holding.items()):
            if self._pending.get(msg_id) is not pending:  # answered (or settled) meanwhile
                self._holding.pop(msg_id, None)
            elif now >= pending.yields_due:
                self._send_held_yields(msg_id, pending)

    def _reply_error(self, channel: str, idents: list[bytes], parent: dict, ename: str,
                     evalue: str) -> None:
        """Answer the client directly (busy, error reply, idle) when no replica can."""
        reply_type = parent["header"]["msg_type"].replace("_request", "_reply")
        content = {"status": "error", "ename": ename, "evalue": evalue, "traceback": [
            f"{ename}: {evalue}"]}
        if reply_type == "execute_reply":
            content["execution_count"] = None
        msg = self.session.msg
        self._send_iopub(msg("status", {"execution_state": "busy"}, parent=parent),
                         b"kernel.notebookos.status")
        if reply_type == "execute_reply":
            error = {k: content[k] for k in ("ename", "evalue", "traceback")}
            self._send_iopub(msg("error", error, parent=parent), b"kernel.notebookos.error")
        self._reply(channel, self.session.serialize(msg(reply_type, content, parent=parent),
                                                    ident=idents))
        self._send_iopub(msg("status", {"execution_state": "idle"}, parent=parent),
                         b"kernel.notebookos.status")

    # -- replicas -> client -----------------------------------------------------------------

    def _from_replica(self, channel: str, rid: int, frames: list[bytes]) -> None:
        idents, msg_list = self.session.feed_identities(frames, copy=True)
        msg = self._verify(msg_list, content=False)
        if msg is None:
            return
        parent_id = msg["parent_header"].get("msg_id", "")
        if channel == "stdin":
            pending = self._pending.get(parent_id)
            if pending is not None and rid == pending.source:
                self._remember(self._input_source, msg["header"]["msg_id"], rid)
                self._sockets["stdin"].send_multipart([*pending.idents, b"<IDS|MSG>", *msg_list])
            return
        pending = self._pending.get(parent_id)
        if pending is None:
            self._orphan_reply(channel, rid, msg, msg_list)
            return
        pending.answered.add(rid)
        role = ((msg.get("metadata") or {}).get("notebookos") or {}).get("role")
        log.debug("kernel %s: %s from replica %d (role %s)", self.kernel_id,
                  msg["header"]["msg_type"], rid, role)
        if pending.msg_type != "execute_request":
            if pending.source is None or rid == pending.source:
                del self._pending[parent_id]
                self._to_client(pending, msg, msg_list)
            return
        if role == "executor" or (role is None and rid == pending.source):
            if rid != pending.source:
                self._executor_found(parent_id, pending, rid)
            del self._pending[parent_id]
            self._holding.pop(parent_id, None)  # a short cell: its standbys never needed asking
            if pending.placement is not None:
                msg_list = self._with_scheduler_metadata(msg, msg_list, pending, rid)
            self._to_client(pending, msg, msg_list)
            self.hooks.release_execute(self.kernel_id, parent_id)
            self.hooks.execute_finished(self.kernel_id, rid, parent_id)
            return
        pending.last_reply = msg_list
        self._settle(parent_id, pending)

    def _with_scheduler_metadata(self, msg: dict, msg_list: list[bytes],
                                 pending: _Pending, rid: int) -> list[bytes]:
        """The executor's execute_reply with what the scheduler knows added under
        ``metadata.notebookos``: ``host_id`` (the executor's host), ``gpu_device_ids`` (the
        GPUs committed for the cell), ``gpu_seconds`` (their count x their commit -> this reply:
        the cell's GPU time), ``interactivity_delay_ms`` (request at the front ->
        execute_input) and, for a cell that waited before it was sent to its executor,
        ``waited_ms`` (request at the front -> sent), ``waited_for`` (what it waited for:
        ``replicas starting``, ``GPUs``, ``migration``, comma-separated in order) and
        ``wait_reason`` (why). Re-signed; ``msg`` is updated to match."""
        placement = pending.placement
        assert placement is not None
        extra: dict[str, Any] = {"gpu_device_ids": list(pending.gpu_device_ids)}
        if pending.gpu_device_ids and placement.placed_at:  # committed when placed, released now
            extra["gpu_seconds"] = round(
                len(pending.gpu_device_ids) * (time.monotonic() - placement.placed_at), 3)
        replica = self._replicas.get(rid)
        if replica is not None and replica.endpoint.host_id:
            extra["host_id"] = replica.endpoint.host_id
        started = pending.started or _started_from_reply(msg)
        if started:
            extra["interactivity_delay_ms"] = round(
                max(0.0, started - placement.arrived) * 1000, 1)
        waited = self._waited_for.pop(pending.client_msg_id, None)
        if waited:
            extra.update(waited_for=", ".join(waited), wait_reason="; ".join(waited.values()),
                         waited_ms=round((placement.placed_at - placement.arrived) * 1000))
        metadata = dict(msg.get("metadata") or {})
        metadata["notebookos"] = {**(metadata.get("notebookos") or {}), **extra}
        msg["metadata"] = metadata
        frames = [msg_list[1], msg_list[2], self.session.pack(metadata), msg_list[4]]
        return [self.session.sign(frames), *frames, *msg_list[5:]]

    def _orphan_reply(self, channel: str, rid: int, msg: dict, msg_list: list[bytes]) -> None:
        """A reply to a request this front did not route (sent before a Global Scheduler
        restart): the executor's reply goes to the client whose session sent the request
        (jupyter_client's shell identity is its session id); other replies are dropped."""
        parent = msg.get("parent_header") or {}
        role = ((msg.get("metadata") or {}).get("notebookos") or {}).get("role")
        session = parent.get("session")
        if channel != "shell" or role != "executor" or not session:
            return
        self._learn_source(parent.get("msg_id", ""), rid)
        self._reply("shell", [str(session).encode(), b"<IDS|MSG>", *msg_list])

    def _settle(self, msg_id: str, pending: _Pending) -> None:
        """Every replica still asked has answered and none executed: resubmit when they all
        yielded (nothing ran), else give the client the replicas' reason."""
        if pending.msg_type != "execute_request":
            if pending.asked:
                return
            # Its replica is gone: ask another live one, or answer instead of leaving it hanging.
            live = sorted(self._replicas)
            if live and pending.frames and pending.source is not None:
                pending.source = live[0]
                pending.asked = {live[0]}
                self._remember(self._iopub_source, msg_id, live[0])
                sock = getattr(self._replicas[live[0]], pending.channel)
                sock.send_multipart([b"<IDS|MSG>", *pending.frames])
                return
            del self._pending[msg_id]
            if pending.client_msg is not None and pending.msg_type.endswith("_request"):
                self._reply_error(pending.channel, pending.idents, pending.client_msg,
                                  "NotebookOSReplicaLost",
                                  "the replica handling this request was lost; retry")
            return
        if pending.held_yields:  # the executor answered without running it: ask the others
            self._send_held_yields(msg_id, pending)
        if not pending.answered >= pending.asked:
            return
        del self._pending[msg_id]
        self.hooks.release_execute(self.kernel_id, msg_id)
        last = self._verify_quiet(pending.last_reply) if pending.last_reply else None
        content = (last or {}).get("content", {})
        yielded = last is None or content.get("ename") == ALL_YIELDED
        client = pending.client_msg
        if last is None and pending.started and client is not None \
                and self.fail_lost_started_cells:
            # Every replica asked was lost after the cell's code had started (a rebuild from
            # the checkpoint follows): it may have run in part, so it is never run again
            # unasked (a cell runs at most once); the user decides.
            log.warning("kernel %s: every replica running %s was lost; not running it again",
                        self.kernel_id, pending.client_msg_id)
            self._reply_error("shell", pending.idents, client, REPLICAS_LOST,
                              "every replica running this cell was lost before it finished; "
                              "the cell did not complete and is not run again. The kernel "
                              "is rebuilt from its last checkpoint (its next cell says which "
                              "cell that is): run the cell again then")
            return
        if yielded and client is not None and pending.attempt < MAX_RESUBMISSIONS:
            retry_id = _retry_id(msg_id, pending.attempt + 1)
            log.info("kernel %s: no replica ran %s; resubmitting as %s", self.kernel_id,
                     pending.client_msg_id, retry_id)
            self._remember(self._superseded, msg_id, pending.attempt)
            self._route_execute(pending.idents, client, retry_id, pending.attempt + 1)
        elif last is not None:
            self._to_client(pending, last, pending.last_reply)
        elif client is not None:
            self._reply_error("shell", pending.idents, client, ALL_YIELDED,
                              f"no replica could run the cell after {pending.attempt + 1} "
                              "attempt(s)")

    def _verify_quiet(self, msg_list: list[bytes]) -> dict | None:
        try:  # already verified once: the digest is in the history, so skip that check
            return {"header": self.session.unpack(msg_list[1]),
                    "parent_header": self.session.unpack(msg_list[2]),
                    "metadata": self.session.unpack(msg_list[3]),
                    "content": self.session.unpack(msg_list[4])}
        except (ValueError, TypeError, IndexError):
            return None

    def _to_client(self, pending: _Pending, msg: dict, msg_list: list[bytes]) -> None:
        """Forward a reply; one to a resubmitted request gets the client's parent header back.
        An execute_reply is followed by its idle (``_idle_after_reply``)."""
        election_id = msg["parent_header"].get("msg_id", "")
        original = self._aliases.get(election_id)
        if original is None:
            self._reply(pending.channel, [*pending.idents, b"<IDS|MSG>", *msg_list])
        else:
            frames = self.session.serialize({**msg, "parent_header": original,
                                             "content": self.session.unpack(msg_list[4])},
                                            ident=pending.idents)
            self._reply(pending.channel, [*frames, *msg_list[5:]])
        if pending.msg_type == "execute_request":
            self._idle_after_reply(pending, election_id)

    def _reply(self, channel: str, frames: list[bytes]) -> None:
        """Send a reply to a client; on shell, one for a client that is not connected is kept
        for ``UNROUTED_KEEP_S`` and retried by the loop (after a Global Scheduler restart, a
        replica's held reply can arrive before the client's DEALER has reconnected)."""
        if channel == "shell":
            self._unrouted.send(frames)
        else:
            self._sockets[channel].send_multipart(frames)

    def _from_replica_iopub(self, rid: int, frames: list[bytes]) -> None:
        """Forward the IOPub of the replica that is the source of its request; drop the rest.

        The hot path of every cell: it reads only the header and parent header, checks the
        signature of what it forwards (dropping needs no trust), and leaves content alone.
        """
        idents, msg_list = self.session.feed_identities(frames, copy=True)
        if len(msg_list) < 5:
            raise ValueError(f"IOPub message with {len(msg_list)} frames")
        parent = self.session.unpack(msg_list[2])
        parent_id = str(parent.get("msg_id", ""))
        source = self._iopub_source.get(parent_id)
        header: dict | None = None
        if source is None:
            pending = self._pending.get(parent_id)
            source = pending.source if pending is not None else None
            if pending is not None and source is None:  # broadcast: the first replica speaks
                source = rid
                self._learn_source(parent_id, rid)
            elif pending is None and parent.get("username") == GS_USERNAME:
                # The Global Scheduler's own request (the readiness check's kernel_info, a
                # membership change): its busy and idle, held by the replica until this front
                # subscribed, are for no client.
                return
            elif pending is None and parent_id:
                # A request routed before a restart (replayed from the replicas' IOPub backlogs,
                # or still running): standbys publish nothing for a yield_request, so the
                # first replica publishing for it is its executor (or, for a broadcast control
                # request, the one that speaks, as above).
                source = rid
                self._learn_source(parent_id, rid)
        if source != rid and not self._executor_revealed(parent_id, rid, msg_list):
            return
        if not self._signature_ok(msg_list):
            return
        header = header or self.session.unpack(msg_list[1])
        msg_type = header.get("msg_type")
        log.debug("kernel %s: iopub %s from replica %d (parent %s)", self.kernel_id, msg_type,
                  rid, parent_id[-12:])
        if msg_type == "execute_input":
            pending = self._pending.get(parent_id)
            if pending is not None and not pending.started:
                pending.started = time.monotonic()
            self.hooks.execute_started(self.kernel_id, rid, parent_id)
        elif msg_type == "status" and self._status_withheld(parent_id, idents, msg_list):
            return
        self._forward_iopub(parent_id, idents, msg_list)

    def _learn_source(self, parent_id: str, rid: int) -> None:
        self._remember(self._iopub_source, parent_id, rid)
        self._remember(self._source_seen, parent_id, True)

    def _executor_revealed(self, parent_id: str, rid: int, msg_list: list[bytes]) -> bool:
        """Whether ``rid``, which this front did not send the cell ``parent_id`` to as its
        executor, shows that it is: it publishes the cell's output (anything but a status;
        standbys publish nothing, and a replica sent a cell that another one runs only waits
        for its end). After a Global Scheduler restart, a client resends the cell that is
        running, and this front may place the copy on another replica than the one running
        it: that one's output would otherwise be dropped, and the cell reply without it."""
        pending = self._pending.get(parent_id)
        if (pending is None or pending.msg_type != "execute_request"
                or parent_id in self._source_seen or not self._signature_ok(msg_list)):
            return False
        if self.session.unpack(msg_list[1]).get("msg_type") == "status":
            return False
        log.info("kernel %s: replica %d publishes the output of %s, which was sent to replica "
                 "%s: it runs the cell", self.kernel_id, rid, parent_id[:8], pending.source)
        self._executor_found(parent_id, pending, rid)
        return True

    def _executor_found(self, parent_id: str, pending: _Pending, rid: int) -> None:
        """``rid`` runs the cell that was sent to ``pending.source`` (which only waits for its
        end): its IOPub, input requests and idle are the cell's from now on. An idle held from
        the replica the cell was sent to is dropped: forwarded after the reply, it would end
        the cell for the client before the executor's output (its reply on shell can overtake
        its output on IOPub)."""
        self._learn_source(parent_id, rid)
        pending.source = rid
        pending.held_idle = None

    def _status_withheld(self, parent_id: str, idents: list[bytes], msg_list: list[bytes]
                         ) -> bool:
        """Whether a status message is kept from the client: the busy/idle of an attempt whose
        election failed (dropped), or an executor's ``idle`` that comes before its
        ``execute_reply`` (held until the reply has gone to the client). The election may fail
        (the replica chosen to run the cell could not propose in time: it was still applying
        the previous cell's state), and the cell then runs again under a new id: forwarded
        now, this idle would tell the client that the cell is done before it ran. A client takes reply + idle as the end of a cell
        (JupyterLab then drops the output that follows), and idle is the promise that the
        cell's state survives the loss of a replica: the fault campaign saw the output lost
        and, when the executor was killed right after its reply, the cell's state as well."""
        if parent_id in self._superseded:
            return True  # a failed attempt's busy or idle: the cell runs again
        if self.session.unpack(msg_list[4]).get("execution_state") != "idle":
            return False
        pending = self._pending.get(parent_id)
        if pending is None or pending.msg_type != "execute_request":
            self._awaiting_idle.pop(parent_id, None)  # the cell's state is replicated
            return False
        pending.held_idle = (parent_id, idents, msg_list)
        return True

    def _idle_after_reply(self, pending: _Pending, election_id: str) -> None:
        """After an execute_reply went to the client: the executor's idle if it was held, or
        one from the front when the executor is gone (no idle will ever come from it)."""
        if pending.held_idle is not None:
            held, pending.held_idle = pending.held_idle, None
            self._forward_iopub(*held)
        elif pending.source is None or pending.client_msg is None:
            return
        elif pending.source not in self._replicas:
            self._send_status("idle", pending.client_msg)
        else:
            self._remember(self._awaiting_idle, election_id, (pending.source, pending.client_msg),
                           limit=256)

    def _executors_lost_before_idle(self, dropped: set[int]) -> None:
        """Executors lost after their reply and before their idle: they died while replicating
        what their cell changed. The client gets a warning and the idle that will never come
        from them (JupyterLab would show the kernel busy for good)."""
        for msg_id, (rid, client_msg) in list(self._awaiting_idle.items()):
            if rid not in dropped:
                continue
            del self._awaiting_idle[msg_id]
            self._send_note(f"the replica that ran this cell (replica {rid}) was lost before "
                            "what the cell changed was replicated: its output stands, but its "
                            "changes to the namespace may be lost (the next cell runs on the "
                            "state the other replicas hold).", client_msg)
            self._send_status("idle", client_msg)

    def _forward_iopub(self, parent_id: str, idents: list[bytes], msg_list: list[bytes]) -> None:
        original = self._aliases.get(parent_id)
        if original is not None:
            msg = self._verify_quiet(msg_list)
            if msg is not None:
                self._send_iopub({**msg, "parent_header": original, "buffers": msg_list[5:]},
                                 idents)
            return
        self._publish([*idents, b"<IDS|MSG>", *msg_list])

    def _signature_ok(self, msg_list: list[bytes]) -> bool:
        """The HMAC check of ``Session.deserialize`` without decoding the content."""
        if self.session.auth is None:
            return True
        expected = self.session.sign(msg_list[1:5])
        if hmac.compare_digest(expected, msg_list[0]):
            return True
        self._dropped("bad_signature")
        log.warning("kernel %s: dropped a message: invalid signature", self.kernel_id)
        return False

    @staticmethod
    def _remember(table: OrderedDict, key: str, value: Any, limit: int = 4096) -> None:
        table[key] = value
        while len(table) > limit:
            table.popitem(last=False)


def _started_from_reply(msg: dict) -> float:
    """When the replica started the cell (ipykernel's ``metadata.started``, wall clock), on this
    process's monotonic clock; 0 when the reply does not say. The front learns the start from
    the executor's ``execute_input``, but that comes on IOPub, which ipykernel sends from
    another thread: it can reach the front after the reply."""
    raw = (msg.get("metadata") or {}).get("started")
    if isinstance(raw, str):
        try:
            raw = datetime.datetime.fromisoformat(raw)
        except ValueError:
            return 0.0
    if not isinstance(raw, datetime.datetime):
        return 0.0
    if raw.tzinfo is None:
        raw = raw.replace(tzinfo=datetime.UTC)
    return time.monotonic() - max(0.0, time.time() - raw.timestamp())
