"""Lightweight stand-in replicas: many kernels' replicas in one process, for scale benchmarks.

Real replicas cap what fits on a small machine at about 40 notebooks; the Global Scheduler's
fronts are measured at thousands (benchmarks/gs_scale.py) against these instead. They speak the
replica's side of the front's protocol (docs/kernel-protocol.md) as tests/schedulers'
FakeReplica does, for every kernel at once:

- stand-in replica ``r`` (1..3) binds one ROUTER each for shell, control and stdin, shared by all
  kernels: a front's DEALERs carry the identity ``notebookos-gs-<kernel id>``, so the ROUTER
  answers each kernel's front on its own connection;
- each (replica, kernel) has its own IOPub PUB socket, as each real replica has;
- ``execute_request``: busy, ``execute_input``, ``execute_reply`` (``metadata.notebookos.role``
  ``executor``), idle on the kernel's IOPub; ``yield_request``: an ``execute_reply`` with role
  ``standby``; any other ``<x>_request``: ``<x>_reply`` with status ok.

    python -m notebookos.testing.standin_replicas --kernels N --key KEY

prints one JSON line (the ports) and serves until stdin closes.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading

import zmq
from jupyter_client.session import Session

REPLICAS = (1, 2, 3)
IDENTITY_PREFIX = b"notebookos-gs-"


def kernel_id(index: int) -> str:
    return f"standin-{index:05d}"


class PlaceOnReplicaOne:
    """A front's scheduler side that places every cell on replica 1 with no GPU (the fronts
    are measured or tested alone, without a Global Scheduler's placement)."""

    def place_execute(self, kernel_id: str, msg_id: str, metadata: dict) -> tuple[int, list[int]]:
        return 1, []

    def release_execute(self, kernel_id: str, msg_id: str) -> None:
        pass

    def execute_finished(self, kernel_id: str, replica_id: int, msg_id: str) -> None:
        pass

    def execute_started(self, kernel_id: str, replica_id: int, msg_id: str) -> None:
        pass


class StandInReplicas:
    def __init__(self, kernels: int, key: str, ip: str = "127.0.0.1") -> None:
        self.context = zmq.Context()
        self.context.set(zmq.MAX_SOCKETS, len(REPLICAS) * (kernels + 3) + 64)
        # one session per replica: a front sends the standbys identical copies (one signature)
        self.sessions = {r: Session(key=key.encode(), username=f"standin-{r}") for r in REPLICAS}
        self.routers: dict[zmq.Socket, tuple[int, str]] = {}
        self.ports: dict[str, dict] = {}
        self.iopub: dict[tuple[int, bytes], zmq.Socket] = {}
        self.counts: dict[bytes, int] = {}
        for r in REPLICAS:
            ports: dict = {"iopub": []}
            for channel in ("shell", "control", "stdin"):
                sock = self.context.socket(zmq.ROUTER)
                sock.linger = 0
                ports[channel] = sock.bind_to_random_port(f"tcp://{ip}")
                self.routers[sock] = (r, channel)
            for k in range(kernels):
                pub = self.context.socket(zmq.PUB)
                pub.linger = 0
                ports["iopub"].append(pub.bind_to_random_port(f"tcp://{ip}"))
                self.iopub[(r, kernel_id(k).encode())] = pub
            self.ports[str(r)] = ports

    def serve(self, stop: threading.Event) -> None:
        poller = zmq.Poller()
        for sock in self.routers:
            poller.register(sock, zmq.POLLIN)
        while not stop.is_set():
            for sock, _ in poller.poll(200):
                replica, channel = self.routers[sock]
                try:
                    self._answer(sock, replica, channel, sock.recv_multipart())
                except ValueError as exc:  # a bad or replayed signature: dropped, as a replica
                    print(f"stand-in replica {replica}: dropped a message: {exc}",
                          file=sys.stderr)

    def _answer(self, sock: zmq.Socket, replica: int, channel: str, frames: list[bytes]) -> None:
        session = self.sessions[replica]
        idents, msg_list = session.feed_identities(frames)
        request = session.deserialize(msg_list)
        msg_type = request["header"]["msg_type"]
        ident = idents[0] if idents else b""
        kernel = ident[len(IDENTITY_PREFIX):] if ident.startswith(IDENTITY_PREFIX) else b""
        pub = self.iopub.get((replica, kernel))
        metadata = {"notebookos": {"replica_id": replica}}
        if msg_type == "execute_request":
            count = self.counts[kernel] = self.counts.get(kernel, 0) + 1
            self._publish(session, pub, request, "status", {"execution_state": "busy"})
            self._publish(session, pub, request, "execute_input",
                          {"code": request["content"].get("code", ""),
                           "execution_count": count})
            metadata["notebookos"]["role"] = "executor"
            session.send(sock, "execute_reply",
                              {"status": "ok", "execution_count": count, "user_expressions": {}},
                              parent=request, ident=idents, metadata=metadata)
            self._publish(session, pub, request, "status", {"execution_state": "idle"})
        elif msg_type == "yield_request":
            metadata["notebookos"]["role"] = "standby"
            session.send(sock, "execute_reply",
                              {"status": "ok", "execution_count": self.counts.get(kernel, 0)},
                              parent=request, ident=idents, metadata=metadata)
        elif msg_type.endswith("_request"):
            content: dict = {"status": "ok"}
            if msg_type == "kernel_info_request":
                content.update(protocol_version="5.3", implementation="standin",
                               language_info={"name": "python"})
            self._publish(session, pub, request, "status", {"execution_state": "busy"})
            session.send(sock, msg_type.replace("_request", "_reply"), content,
                              parent=request, ident=idents, metadata=metadata)
            self._publish(session, pub, request, "status", {"execution_state": "idle"})

    def _publish(self, session: Session, pub: zmq.Socket | None, parent: dict, msg_type: str,
                 content: dict) -> None:
        if pub is not None:
            session.send(pub, msg_type, content, parent=parent,
                              ident=f"kernel.standin.{msg_type}".encode())

    def close(self) -> None:
        self.context.destroy(linger=0)


def _raise_open_files() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:  # as root with CAP_SYS_RESOURCE, beyond the hard limit too
        with open("/proc/sys/fs/nr_open") as nr_open:
            wanted = int(nr_open.read())
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
    except (OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args(argv)
    _raise_open_files()
    replicas = StandInReplicas(args.kernels, args.key)
    stop = threading.Event()
    server = threading.Thread(target=replicas.serve, args=(stop,), daemon=True)
    server.start()
    print(json.dumps(replicas.ports), flush=True)
    sys.stdin.read()  # until the benchmark closes our stdin (or exits)
    stop.set()
    server.join(2)
    replicas.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
