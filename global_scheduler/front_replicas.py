"""A front's connections to its kernel's replicas: per replica, DEALER sockets to its shell,
control and stdin and a SUB socket on its IOPub; ``set_replicas`` changes the set.

Control and stdin are connected when a request needs them (a control request; an
``execute_request`` that allows stdin, to its executor only) and closed once they have gone
unused for ``LAZY_LINK_IDLE_S`` with no request in flight. Shell and IOPub are connected when a
replica joins the set; a standby's (a replica other than the one that ran the last cell) are
closed the same way, once the kernel has been idle that long, and connected again, both, when
a request is next sent to it (a held ``yield_request``, a cell it is chosen to run, a control
request). An idle kernel holds 2 connections, its executor's shell and IOPub, not 12 (each
costs libzmq about 26 KB and two file descriptors in the Global Scheduler, issue 32). The
executor's IOPub stays: output of a thread its cells started reaches the client while the
kernel is idle. A DEALER queues what is sent before its connection is up; a replica's
``input_request`` waits for the stdin connection (``kernel/app.py``), and a replica holds its
IOPub while no subscriber is connected (``kernel/iopub.py``), so a standby linked again loses
nothing it publishes before the front's subscription arrives.

Mixed into ``KernelFront``. Changing the set runs on the front's loop, in order with the
messages it routes: what a dropped replica already sent is routed first (``_drain``), requests
it was asked are settled by the others (the reply merger), then its sockets are closed.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import zmq

log = logging.getLogger(__name__)

LAZY_CHANNELS = ("control", "stdin")
# a replica's control and stdin connections are closed after this long unused (seconds)
LAZY_LINK_IDLE_S = 30.0


@dataclass(frozen=True)
class ReplicaEndpoint:
    replica_id: int
    ip: str
    shell_port: int
    iopub_port: int
    stdin_port: int
    control_port: int
    host_id: str = ""  # where the replica runs (the executor's reply names it to the client)


@dataclass(eq=False)
class _ReplicaSockets:
    endpoint: ReplicaEndpoint
    shell: zmq.Socket | None  # None (with iopub) while a standby's links rest
    iopub: zmq.Socket | None
    lazy: dict[str, zmq.Socket] = field(default_factory=dict)  # control, stdin while connected

    def sockets(self) -> list[tuple[str, zmq.Socket]]:
        main = [] if self.shell is None else [("shell", self.shell), ("iopub", self.iopub)]
        return [*main, *self.lazy.items()]

    def close(self) -> None:
        for _, s in self.sockets():
            s.close(linger=0)
        self.lazy.clear()
        self.shell = self.iopub = None


class ReplicaLinks:
    def _init_replicas(self) -> None:
        self._replicas: dict[int, _ReplicaSockets] = {}
        self._lazy_links = 0  # control and stdin connections open, over all replicas
        self._lazy_used_at = 0.0  # when a replica's socket was last asked for (monotonic)
        self.lazy_link_idle_s = LAZY_LINK_IDLE_S
        # standbys' shell and IOPub rest while the kernel is idle (a per-cell container's
        # front keeps them: its replicas come and go by cell)
        self.rest_standby_links = True

    def _replica_socket(self, rid: int, channel: str) -> zmq.Socket:
        """Replica ``rid``'s socket for ``channel``, connected now if it is a lazy one or
        the replica's links rest."""
        replica = self._replicas[rid]
        self._lazy_used_at = time.monotonic()
        if replica.shell is None:  # a standby's links rest: shell and IOPub again, together
            self._link_again(replica)
        if channel not in LAZY_CHANNELS:
            return getattr(replica, channel)
        sock = replica.lazy.get(channel)
        if sock is None:
            port = replica.endpoint.control_port if channel == "control" \
                else replica.endpoint.stdin_port
            sock = replica.lazy[channel] = self._dealer(replica.endpoint, port)
            self._lazy_links += 1
            self._watched_replicas = None  # the loop watches the new socket
        return sock

    def _lazy_links_due(self) -> float | None:
        """When the lazy connections (and the standbys' links) are next to be closed, if any
        is open and nothing is in flight."""
        if self._pending or not (self._lazy_links or self._resting_standbys()):
            return None
        return self._lazy_used_at + self.lazy_link_idle_s

    def _resting_standbys(self) -> list[int]:
        """The replicas whose shell and IOPub may rest now: every linked one but the last
        cell's executor (none before a cell ran, or when it left the set)."""
        executor = self.preferred_replica
        if not self.rest_standby_links or executor not in self._replicas:
            return []
        return [rid for rid, r in self._replicas.items()
                if rid != executor and r.shell is not None]

    def _close_idle_lazy_links(self) -> None:
        due = self._lazy_links_due()
        if due is None or time.monotonic() < due:
            return
        for rid in self._resting_standbys():
            self._drain(rid)  # what it already sent is routed first
            replica = self._replicas[rid]
            for _, sock in (("shell", replica.shell), ("iopub", replica.iopub)):
                self._unwatch(sock)
                sock.close(linger=0)
            replica.shell = replica.iopub = None
        for replica in self._replicas.values():
            for sock in replica.lazy.values():
                self._unwatch(sock)
                sock.close(linger=0)
            replica.lazy.clear()
        self._lazy_links = 0
        self._watched_replicas = None

    def _link_again(self, replica: _ReplicaSockets) -> None:
        """A resting standby's shell and IOPub, connected again (the loop watches them)."""
        fresh = self._connect(replica.endpoint)
        replica.shell, replica.iopub = fresh.shell, fresh.iopub
        self._watched_replicas = None

    def set_replicas(self, endpoints: list[ReplicaEndpoint], wait: bool = False,
                     planned: bool = False) -> None:
        """Connect to these replicas (and drop any other); runs on the front's loop, in order
        with the messages it routes. ``wait`` blocks until applied. ``planned``: the dropped
        ones were stopped on purpose once their state was durable (a per-cell container
        parked after its checkpoint): an executor whose idle had not come yet lost nothing,
        and its cell gets the idle without the warning a lost replica gives."""
        done = threading.Event()

        def apply() -> None:
            wanted = {e.replica_id: e for e in endpoints}
            dropped = []
            for rid in list(self._replicas):
                if rid not in wanted or self._replicas[rid].endpoint != wanted[rid]:
                    self._drain(rid)
                    self._close_replica(rid)
                    dropped.append(rid)
            self._executors_lost_before_idle(set(dropped), warn=not planned)
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
        self._lazy_links -= len(replica.lazy)
        for _, sock in replica.sockets():
            self._unwatch(sock)
        replica.close()

    def _drain(self, rid: int) -> None:
        """Route what a replica being dropped has already sent (its last output, an idle, a
        reply): the loop may not have read it yet, and closing the sockets would lose it (a
        migrated replica's idle, a dying executor's reply)."""
        sockets = self._replicas[rid]
        for name, sock in (("replica-iopub", sockets.iopub), ("replica-shell", sockets.shell)):
            while sock is not None:
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

    def _dealer(self, e: ReplicaEndpoint, port: int) -> zmq.Socket:
        s = self.context.socket(zmq.DEALER)
        s.linger = 0
        s.setsockopt(zmq.IDENTITY, self.identity)
        s.connect(f"tcp://{e.ip}:{port}")
        return s

    def _connect(self, e: ReplicaEndpoint) -> _ReplicaSockets:
        sub = self.context.socket(zmq.SUB)
        sub.linger = 0
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://{e.ip}:{e.iopub_port}")
        return _ReplicaSockets(e, self._dealer(e, e.shell_port), sub)

