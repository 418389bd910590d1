"""A test harness: three replica processes on loopback, and a client that plays the scheduler.

The scheduler's part (docs/kernel-protocol.md): one ``execute_request`` to the target replica and
the same message, ``msg_type`` changed to ``yield_request``, to the others, all with the client's
``msg_id``. Replies are collected per replica; IOPub is read from the target only.

Every replica runs in its own session (process group); ``ReplicaGroup.stop`` kills them all and
tests call it from a fixture finalizer.
"""

from __future__ import annotations

import copy
import json
import os
import queue
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

from notebookos.testing.processes import free_port, kill_group

REPLICA_ARGS = ["--HistoryManager.enabled=False", "--IPKernelApp.log_level=INFO"]


class ReplicaExited(RuntimeError):
    """A replica process ended while the harness waited for it."""


@dataclass
class Replica:
    replica_id: int
    raft_address: str
    connection_file: Path
    log_path: Path
    proc: subprocess.Popen | None = None
    client: BlockingKernelClient | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@dataclass
class ExecuteResult:
    msg_id: str
    replies: dict[int, dict[str, Any]]  # replica id -> execute_reply message
    iopub: list[dict[str, Any]] = field(default_factory=list)  # the target's IOPub for this msg

    def reply(self, replica_id: int) -> dict[str, Any]:
        return self.replies[replica_id]

    def executor(self) -> int | None:
        for reply in self.replies.values():
            nb = reply["metadata"].get("notebookos", {})
            if nb.get("executor") is not None:
                return nb["executor"]
        return None

    def executor_reply(self) -> dict[str, Any]:
        for reply in self.replies.values():
            if reply["metadata"].get("notebookos", {}).get("role") == "executor":
                return reply
        raise AssertionError(f"no executor reply among {self.summary()}")

    def stdout(self) -> str:
        return "".join(
            m["content"]["text"] for m in self.iopub
            if m["msg_type"] == "stream" and m["content"]["name"] == "stdout"
        )

    def stderr(self) -> str:
        return "".join(
            m["content"]["text"] for m in self.iopub
            if m["msg_type"] == "stream" and m["content"]["name"] == "stderr"
        )

    def summary(self) -> dict[int, tuple]:
        return {
            rid: (r["content"]["status"], r["content"].get("ename"),
                  r["metadata"].get("notebookos", {}).get("role"))
            for rid, r in self.replies.items()
        }


class ReplicaGroup:
    def __init__(
        self,
        workdir: Path,
        store_url: str = "",
        size: int = 3,
        kernel_id: str | None = None,
        key: str | None = None,
        extra_args: Iterable[str] = (),
        store_urls: dict[int, str] | None = None,
        heartbeat: bool = True,
    ) -> None:
        # heartbeat=False: no client pings the replicas' heartbeat sockets (in a cluster the
        # Global Scheduler's front answers the Jupyter client's pings itself; benchmarks/idle.py)
        self.heartbeat = heartbeat
        self.workdir = workdir
        self.store_urls = dict(store_urls or {})  # replica id -> its own store URL
        workdir.mkdir(parents=True, exist_ok=True)
        self.store_url = store_url
        self.kernel_id = kernel_id or f"k-{uuid.uuid4().hex[:8]}"
        self.key = key or uuid.uuid4().hex
        self.extra_args = list(extra_args)
        self.replicas: dict[int, Replica] = {}
        self.replica_env: dict[int, dict[str, str]] = {}  # replica id -> its own extra env
        self.last_message: dict[str, Any] = {}
        self._next_id = 1
        for _ in range(size):
            self._new_replica()

    # ---- processes -------------------------------------------------------------------------
    def _new_replica(self) -> Replica:
        rid = self._next_id
        self._next_id += 1
        cf = self.workdir / f"{self.kernel_id}-r{rid}.json"
        write_connection_file(str(cf), ip="127.0.0.1", key=self.key.encode())
        replica = Replica(rid, self._raft_address(), cf, self.workdir / f"r{rid}.log")
        self.replicas[rid] = replica
        return replica

    def command(self, replica: Replica, peers: dict[int, str], *flags: str) -> list[str]:
        peer_arg = ",".join(f"{rid}={addr}" for rid, addr in peers.items())
        return [
            sys.executable, "-m", "notebookos.kernel", "-f", str(replica.connection_file),
            f"--replica-id={replica.replica_id}", f"--raft-address={replica.raft_address}",
            f"--peers={peer_arg}", f"--kernel-id={self.kernel_id}",
            f"--store-url={self.store_urls.get(replica.replica_id, self.store_url)}",
            *REPLICA_ARGS, *self.extra_args, *flags,
        ]

    def _launch(self, replica: Replica, peers: dict[int, str], *flags: str) -> None:
        log = open(replica.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.replica_env.get(replica.replica_id, {}))
        replica.proc = subprocess.Popen(
            self.command(replica, peers, *flags), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env=env, cwd=self.workdir,
        )
        log.close()

    def _connect(self, replica: Replica, timeout: float = 60.0) -> None:
        client = BlockingKernelClient(connection_file=str(replica.connection_file))
        client.load_connection_file()
        client.start_channels(hb=self.heartbeat)
        replica.client = client
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not replica.alive:
                raise ReplicaExited(f"replica {replica.replica_id} exited:\n{replica.log_tail()}")
            msg_id = client.kernel_info()
            try:
                self._wait_reply(client.get_shell_msg, msg_id, 1.0)
                return
            except Exception:  # noqa: BLE001 - queue.Empty until the kernel listens
                continue
        raise RuntimeError(f"replica {replica.replica_id} did not answer:\n{replica.log_tail()}")

    def start(
        self, *flags: str, ready: Iterable[int] | None = None, attempts: int = 3
    ) -> ReplicaGroup:
        """Launch every replica in parallel; wait until ``ready`` (default: all) have quorum.

        A replica that exits at start (a port picked free was taken before it bound it, on a
        busy machine) makes the whole group start again on fresh ports.
        """
        for attempt in range(attempts):
            for replica in self.replicas.values():
                peers = {r.replica_id: r.raft_address for r in self.replicas.values()
                         if r is not replica}
                self._launch(replica, peers, *flags)
            try:
                for replica in self.replicas.values():
                    self._connect(replica)
                break
            except ReplicaExited:
                if attempt == attempts - 1:
                    raise
                self.stop()
                for replica in self.replicas.values():
                    self._fresh_ports(replica)
        wanted = set(self.replicas if ready is None else ready)
        self.wait_status(lambda s: all(
            s[rid]["raft_ready"] and s[rid]["has_quorum"] for rid in wanted))
        return self

    def _raft_address(self) -> str:
        """A free loopback address no replica of this group has (ports are drawn one at a time,
        so two draws could otherwise repeat before either replica binds)."""
        taken = {r.raft_address for r in self.replicas.values()}
        while True:
            address = f"127.0.0.1:{free_port()}"
            if address not in taken:
                return address

    def _fresh_ports(self, replica: Replica) -> None:
        key = json.loads(replica.connection_file.read_text())["key"]  # keep a test's own key
        replica.connection_file.unlink()
        write_connection_file(str(replica.connection_file), ip="127.0.0.1", key=key.encode())
        replica.raft_address = self._raft_address()
        replica.proc = None

    def add_replacement(self, via: int) -> Replica:
        """Start a fresh replica with --join and add it to the group through replica ``via``."""
        replica = self._new_replica()
        peers = {
            r.replica_id: r.raft_address for r in self.replicas.values()
            if r is not replica and r.alive
        }
        self._launch(replica, peers, "--join")
        reply = self.control(via, "add_replica_request",
                             {"replica_id": replica.replica_id,
                              "raft_address": replica.raft_address}, timeout=30)
        assert reply["content"]["status"] == "ok", reply["content"]
        self._connect(replica)
        return replica

    def remove(self, replica_id: int, via: int) -> dict[str, Any]:
        return self.control(via, "remove_replica_request", {"replica_id": replica_id}, timeout=30)

    def kill(self, replica_id: int, sig: int = signal.SIGKILL) -> None:
        replica = self.replicas[replica_id]
        if replica.client is not None:
            replica.client.stop_channels()
            replica.client = None
        if replica.proc is not None and replica.proc.poll() is None:
            os.killpg(replica.proc.pid, sig)
            replica.proc.wait(10)

    def stop(self) -> None:
        for replica in self.replicas.values():
            if replica.client is not None:
                try:
                    replica.client.stop_channels()
                except Exception:  # noqa: BLE001
                    pass
                replica.client = None
            if replica.proc is not None:
                kill_group(replica.proc, timeout=3)

    def alive_ids(self) -> list[int]:
        return [rid for rid, r in self.replicas.items() if r.alive and r.client is not None]

    # ---- messages ------------------------------------------------------------------------------
    def control(self, replica_id: int, msg_type: str, content: dict, timeout: float = 10) -> dict:
        client = self.replicas[replica_id].client
        assert client is not None
        msg = client.session.msg(msg_type, content)
        client.control_channel.send(msg)
        return self._wait_reply(client.get_control_msg, msg["header"]["msg_id"], timeout)

    def status(self) -> dict[int, dict]:
        return {
            rid: self.control(rid, "replica_status_request", {})["content"]
            for rid in self.alive_ids()
        }

    def wait_status(self, predicate, timeout: float = 30.0) -> dict[int, dict]:
        deadline = time.monotonic() + timeout
        status: dict[int, dict] = {}
        while time.monotonic() < deadline:
            status = self.status()
            if predicate(status):
                return status
            time.sleep(0.05)
        raise AssertionError(f"group status never satisfied the condition: {status}")

    @staticmethod
    def _wait_reply(getter, msg_id: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no reply to {msg_id} within {timeout} s")
            try:
                msg = getter(timeout=left)
            except queue.Empty:
                raise TimeoutError(f"no reply to {msg_id} within {timeout} s") from None
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg

    def send_execute(
        self,
        code: str,
        target: int | None,
        to: Iterable[int] | None = None,
        metadata: dict | None = None,
        allow_stdin: bool = False,
        silent: bool = False,
    ) -> str:
        """Send execute_request to ``target`` and yield_request to the other replicas in ``to``."""
        ids = list(self.alive_ids() if to is None else to)
        first = self.replicas[ids[0]].client
        assert first is not None
        msg = first.session.msg(
            "execute_request",
            {"code": code, "silent": silent, "store_history": not silent,
             "user_expressions": {}, "allow_stdin": allow_stdin, "stop_on_error": True},
            metadata=dict(metadata or {}),
        )
        self.last_message = msg
        for rid in ids:
            self.send_copy(msg, rid, "execute_request" if rid == target else "yield_request")
        return msg["header"]["msg_id"]

    def send_copy(self, msg: dict, replica_id: int, msg_type: str) -> None:
        """Send ``msg`` (same msg_id) to one replica as ``msg_type`` (the scheduler's rewrite)."""
        one = copy.deepcopy(msg)
        one["header"]["msg_type"] = msg_type
        one["msg_type"] = msg_type
        client = self.replicas[replica_id].client
        assert client is not None
        client.shell_channel.send(one)

    def collect(
        self, msg_id: str, ids: Iterable[int], target: int | None, timeout: float = 30.0
    ) -> ExecuteResult:
        result = ExecuteResult(msg_id, {})
        for rid in ids:
            client = self.replicas[rid].client
            assert client is not None
            result.replies[rid] = self._wait_reply(client.get_shell_msg, msg_id, timeout)
        if target is not None and self.replicas[target].client is not None:
            result.iopub = self.iopub_until_idle(target, msg_id, timeout)
        return result

    def iopub_until_idle(self, replica_id: int, msg_id: str, timeout: float) -> list[dict]:
        client = self.replicas[replica_id].client
        assert client is not None
        msgs: list[dict] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = client.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - queue.Empty
                break
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            msgs.append(msg)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        return msgs

    def execute(
        self,
        code: str,
        target: int | None,
        to: Iterable[int] | None = None,
        metadata: dict | None = None,
        timeout: float = 30.0,
        allow_stdin: bool = False,
    ) -> ExecuteResult:
        """Run ``code`` the scheduler's way and return every addressed replica's reply.

        ``target`` gets execute_request, the others yield_request; ``None``: everyone yields.
        """
        ids = list(self.alive_ids() if to is None else to)
        msg_id = self.send_execute(code, target, ids, metadata, allow_stdin=allow_stdin)
        return self.collect(msg_id, ids, target if target in ids else None, timeout)

    def drain_iopub(self) -> None:
        for rid in self.alive_ids():
            client = self.replicas[rid].client
            assert client is not None
            while True:
                try:
                    client.get_iopub_msg(timeout=0.01)
                except Exception:  # noqa: BLE001 - queue.Empty
                    break
