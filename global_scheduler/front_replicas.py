"""A front's connections to its kernel's replicas: per replica, DEALER sockets to its shell,
control and stdin and a SUB socket on its IOPub; ``set_replicas`` changes the set.

Mixed into ``KernelFront``. Changing the set runs on the front's loop, in order with the
messages it routes: what a dropped replica already sent is routed first (``_drain``), requests
it was asked are settled by the others (the reply merger), then its sockets are closed.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import zmq

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplicaEndpoint:
    replica_id: int
    ip: str
    shell_port: int
    iopub_port: int
    stdin_port: int
    control_port: int
    host_id: str = ""  # where the replica runs (the executor's reply names it to the client)


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


class ReplicaLinks:
    def _init_replicas(self) -> None:
        self._replicas: dict[int, _ReplicaSockets] = {}

    def set_replicas(self, endpoints: list[ReplicaEndpoint], wait: bool = False) -> None:
        """Connect to these replicas (and drop any other); runs on the front's loop, in order
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

