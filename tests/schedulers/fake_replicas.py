"""Real ZMQ sockets bound where a replica's would be, for testing the kernel front alone."""

from __future__ import annotations

import threading
import uuid

import zmq
from jupyter_client.session import Session

from notebookos.global_scheduler.front import ReplicaEndpoint

KEY = uuid.uuid4().hex


class FakeReplica:
    """Bound sockets where a replica's would be; IOPub is an XPUB like ipykernel's."""

    def __init__(self, context: zmq.Context, replica_id: int, ip: str = "127.0.0.1") -> None:
        self.replica_id = replica_id
        self.ip = ip
        self.session = Session(key=KEY.encode(), username=f"replica-{replica_id}")
        self.sockets = {name: context.socket(zmq.ROUTER) for name in ("shell", "control",
                                                                      "stdin")}
        self.sockets["iopub"] = context.socket(zmq.XPUB)
        self.ports = {}
        for name, sock in self.sockets.items():
            sock.linger = 0
            if name != "iopub":  # as ipykernel's: a reconnecting peer keeps its identity
                sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
            self.ports[name] = sock.bind_to_random_port(f"tcp://{ip}")

    def endpoint(self) -> ReplicaEndpoint:
        p = self.ports
        return ReplicaEndpoint(self.replica_id, self.ip, p["shell"], p["iopub"],
                               p["stdin"], p["control"])

    def wait_subscribed(self) -> None:
        assert self.sockets["iopub"].poll(10_000), "the front never subscribed"
        assert self.sockets["iopub"].recv()[:1] == b"\x01"

    def publish(self, parent: dict, msg_type: str, content: dict,
                metadata: dict | None = None) -> str:
        msg = self.session.msg(msg_type, content, parent=parent, metadata=metadata or {})
        self.session.send(self.sockets["iopub"], msg, ident=msg_type.encode())
        return msg["header"]["msg_id"]

    def receive(self, channel: str = "shell", timeout_s: float = 5.0) -> dict | None:
        """The next request on ``channel`` (its ``idents`` added), or None after ``timeout_s``."""
        sock = self.sockets[channel]
        if not sock.poll(timeout_s * 1000):
            return None
        idents, frames = self.session.feed_identities(sock.recv_multipart())
        msg = self.session.deserialize(frames)
        msg["idents"] = idents
        return msg

    def reply(self, request: dict, msg_type: str, content: dict, role: str,
              metadata: dict | None = None) -> None:
        """Answer ``request`` on shell with ``metadata.notebookos.role`` set (and ``metadata``'s
        other keys, e.g. ipykernel's ``started``)."""
        self.session.send(self.sockets["shell"], msg_type, content, parent=request,
                          ident=request["idents"],
                          metadata={**(metadata or {}),
                                    "notebookos": {"role": role,
                                                   "replica_id": self.replica_id}})

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close(linger=0)


class FrontHooks:
    """The scheduler's side of a front under test: every cell is placed on replica 1 with GPU
    0; what was placed and released is recorded."""

    def __init__(self) -> None:
        self.placed: list[str] = []
        self.released: list[str] = []
        self.abandoned: list[str] = []  # cells answered without running under that id
        self.placing_threads: list[threading.Thread] = []  # the thread each cell was placed on

    def place_execute(self, kernel_id: str, msg_id: str, metadata: dict) -> tuple[int, list[int]]:
        self.placed.append(msg_id)
        self.placing_threads.append(threading.current_thread())
        return 1, [0]

    def release_execute(self, kernel_id: str, msg_id: str) -> None:
        self.released.append(msg_id)

    def execute_abandoned(self, kernel_id: str, msg_id: str) -> None:
        self.abandoned.append(msg_id)

    def execute_finished(self, kernel_id: str, replica_id: int, msg_id: str) -> None:
        pass

    def execute_started(self, kernel_id: str, replica_id: int, msg_id: str) -> None:
        pass
