"""A real loopback cluster for scheduler tests: one Global Scheduler, N Local Schedulers, real
replica processes (``python -m notebookos.kernel``), each daemon in its own process group."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import zmq
from jupyter_client import BlockingKernelClient

from notebookos.local_scheduler.pid_watch import same_process
from notebookos.local_scheduler.replica_records import ReplicaRecords
from notebookos.proto import common_pb2, global_scheduler_pb2, local_scheduler_pb2
from notebookos.proto import global_scheduler_pb2_grpc as gs_grpc
from notebookos.proto import local_scheduler_pb2_grpc as ls_grpc
from notebookos.proto.convert import connection_info_to_dict
from notebookos.testing.credentials import connect
from notebookos.testing.processes import free_port, kill_group, wait_for_port

NOTEBOOKOS = [sys.executable, "-m", "notebookos.cli"]


class Cluster:
    def __init__(self, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.gs_port = free_port()
        self.gs_address = f"127.0.0.1:{self.gs_port}"
        self.env = {
            **os.environ,
            "NOTEBOOKOS_LOCAL_SCHEDULER_HEARTBEAT_INTERVAL_S": "0.3",
            "NOTEBOOKOS_GLOBAL_SCHEDULER_HEARTBEAT_TIMEOUT_S": "3",
            "NOTEBOOKOS_GLOBAL_SCHEDULER_REPLICA_START_TIMEOUT_S": "60",
            "NOTEBOOKOS_GLOBAL_SCHEDULER_AUTOSCALE": "false",
            # a replica whose Local Scheduler was SIGKILLed and not restarted ends this soon
            "NOTEBOOKOS_LOCAL_SCHEDULER_ORPHAN_GRACE_S": "3",
            **(env or {}),
        }
        self.gs: subprocess.Popen | None = None
        self.ls: dict[str, subprocess.Popen] = {}
        self.procs: list[subprocess.Popen] = []
        self._channel = connect(self.gs_address)
        self.stub = gs_grpc.GlobalSchedulerStub(self._channel)
        self.clients: list[BlockingKernelClient] = []

    def _spawn(self, name: str, args: list[str], open_files: int = 0) -> subprocess.Popen:
        """``open_files``: the process's open-file limit (soft and hard) when not 0."""
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the test

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

        proc = subprocess.Popen([*NOTEBOOKOS, *args], stdout=log, stderr=subprocess.STDOUT,
                                env=self.env, start_new_session=True, cwd=self.workdir,
                                preexec_fn=limit if open_files else None)
        self.procs.append(proc)
        return proc

    def start_gs(self, *extra: str, state: str = "state", open_files: int = 0
                 ) -> subprocess.Popen:
        self.gs = self._spawn("gs", ["global-scheduler", "--port", str(self.gs_port),
                                     "--state-dir", str(self.workdir / state), *extra],
                              open_files=open_files)
        assert wait_for_port(self.gs_port, 30, self.gs), self.log("gs")
        return self.gs

    def start_ls(self, host_id: str, gpus: int = 2, prewarm: int = 0) -> subprocess.Popen:
        proc = self._spawn(host_id, [
            "local-scheduler", "--host-id", host_id, "--port", "0",
            "--global-scheduler", self.gs_address, "--virtual-gpus", str(gpus),
            "--prewarm", str(prewarm), "--state-dir", str(self.workdir / "state")])
        self.ls[host_id] = proc
        return proc

    def status(self) -> global_scheduler_pb2.ClusterStatus:
        return self.stub.GetClusterStatus(global_scheduler_pb2.GetClusterStatusRequest(),
                                          timeout=10)

    def start(self, hosts: int, gpus: int = 2, prewarm: int = 0,
              prefix: str = "host-") -> None:
        """The Global Scheduler and ``hosts`` Local Schedulers (``{prefix}0``...), registered."""
        self.start_gs()
        for i in range(hosts):
            self.start_ls(f"{prefix}{i}", gpus=gpus, prewarm=prewarm)
        self.wait_hosts(hosts)

    def wait_hosts(self, count: int, timeout: float = 30) -> None:
        self.wait(lambda: len(self.status().hosts) == count, timeout,
                  f"{count} registered hosts")

    def wait(self, predicate, timeout: float, what: str) -> None:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return
            except grpc.RpcError as exc:
                last = exc
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what} ({last})\n{self.log('gs')}")

    def start_kernel(self, gpus: int = 1, kernel_id: str | None = None,
                     timeout: float = 90, hints: dict[str, str] | None = None
                     ) -> tuple[str, BlockingKernelClient]:
        """``hints``: ``PolicyHints.extra`` (notebookos.kernel_hints: user, notebook, ...)."""
        kernel_id = kernel_id or f"k-{uuid.uuid4().hex[:8]}"
        response = self.stub.StartKernel(global_scheduler_pb2.StartKernelRequest(
            kernel_id=kernel_id, key=uuid.uuid4().hex,
            resources=common_pb2.ResourceSpec(millicpus=100, memory_mb=128, gpus=gpus),
            hints=common_pb2.PolicyHints(extra=hints or {})),
            timeout=timeout)
        return kernel_id, self.client(response.connection)

    def client(self, connection: common_pb2.ConnectionInfo) -> BlockingKernelClient:
        kc = BlockingKernelClient()
        kc.load_connection_info(connection_info_to_dict(connection))
        kc.start_channels()
        self.clients.append(kc)
        return kc

    def kernel(self, kernel_id: str) -> common_pb2.KernelStatus:
        return self.stub.GetKernelStatus(
            global_scheduler_pb2.GetKernelStatusRequest(kernel_id=kernel_id), timeout=10)

    def log(self, name: str) -> str:
        try:
            return (self.workdir / f"{name}.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def close(self) -> None:
        for kc in self.clients:
            kc.stop_channels()
        self._channel.close()
        # The Global Scheduler first (so it does not try to recover what is being torn down),
        # then the Local Schedulers, which take their replicas with them.
        for proc in sorted(self.procs, key=lambda p: p is not self.gs):
            kill_group(proc)
        # replicas outlive a SIGKILLed Local Scheduler (its records name them): none may linger
        for records in self.workdir.glob("state/local_scheduler/*/replicas.json"):
            for record in ReplicaRecords(records.parent).load():
                pid = record.get("pid")
                if isinstance(pid, int) and same_process(pid, record.get("start_ticks")):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)


def cluster_with_kernel(make_cluster, hosts: int = 4, env: dict | None = None,  # noqa: ANN001
                        cell: str | None = "data = {'a': 1}", gpus: int = 1, **start: Any
                        ) -> tuple[Cluster, str, BlockingKernelClient]:
    """A cluster of ``hosts`` hosts (``env`` added to the daemons' environment; ``start``:
    ``Cluster.start``'s options) and a kernel of ``gpus`` GPUs that ran ``cell``."""
    cluster = make_cluster(env)
    cluster.start(hosts, **start)
    kernel_id, kc = cluster.start_kernel(gpus=gpus)
    if cell is not None:
        assert run_cell(kc, cell)["reply"]["content"]["status"] == "ok"
    return cluster, kernel_id, kc


def wait_started(kc: BlockingKernelClient, msg_id: str, timeout: float = 30) -> None:
    """Until the cell sent as ``msg_id`` publishes its execute_input (its code runs)."""
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, "the cell never started"
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "execute_input":
            return


def run_cell(kc: BlockingKernelClient, code: str, timeout: float = 60) -> dict[str, Any]:
    """Execute ``code``; returns {"reply", "outputs", "statuses"} as the client saw them."""
    outputs: list[dict] = []
    statuses: list[str] = []

    def hook(msg: dict) -> None:
        if msg["msg_type"] == "status":
            statuses.append(msg["content"]["execution_state"])
        elif msg["msg_type"] in ("execute_result", "stream", "error", "display_data"):
            outputs.append(msg)

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    return {"reply": reply, "outputs": outputs, "statuses": statuses}


def run_seen(kc: BlockingKernelClient, code: str, timeout: float = 90) -> dict[str, Any]:
    """Execute ``code``; {"reply" (with its metadata), "iopub": every IOPub message for it}."""
    seen: list[dict] = []
    reply = kc.execute_interactive(code, timeout=timeout, output_hook=seen.append)
    return {"reply": reply, "iopub": seen}


def stream_text(run: dict[str, Any], name: str) -> str:
    """What the cell of ``run_seen`` printed on ``name`` (stdout or stderr)."""
    return "".join(m["content"]["text"] for m in run["iopub"]
                   if m["msg_type"] == "stream" and m["content"]["name"] == name)


def result_text(run: dict[str, Any]) -> str:
    for msg in run["outputs"]:
        if msg["msg_type"] == "execute_result":
            return msg["content"]["data"]["text/plain"]
    return json.dumps([m["content"] for m in run["outputs"]])[:2000]


@contextlib.contextmanager
def bad_messages_sent(shell_port: int) -> Iterator[None]:
    """A badly signed execute_request and a garbage frame sent to a kernel front's shell port;
    the socket stays open while the block runs (closed with linger 0, it would discard what is
    still queued)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(f"tcp://127.0.0.1:{shell_port}")
    sock.send_multipart([b"<IDS|MSG>", b"forged", b'{"msg_id": "1", "msg_type": '
                         b'"execute_request"}', b"{}", b"{}", b'{"code": "1/0"}'])
    sock.send_multipart([b"garbage"])
    try:
        yield
    finally:
        sock.close()


def ls_gpus_committed(address: str) -> int:
    """GPUs committed on one host as its Local Scheduler sees it (the Global Scheduler's own
    accounting frees a cell's GPUs at once; the host hears of it within 20 ms)."""
    with connect(address) as channel:
        status = ls_grpc.LocalSchedulerStub(channel).GetHostStatus(
            local_scheduler_pb2.GetHostStatusRequest(), timeout=10)
    return status.host.gpus_committed


@pytest.fixture(name="make_cluster")
def make_cluster_fixture(tmp_path: Path) -> Iterator:
    """``make_cluster(env=None)`` -> a ``Cluster`` closed (every process killed) after the test."""
    made: list[Cluster] = []

    def make(env: dict[str, str] | None = None) -> Cluster:
        cluster = Cluster(tmp_path, env)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()
