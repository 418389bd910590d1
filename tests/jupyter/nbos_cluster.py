"""Start a real NotebookOS cluster (Global Scheduler + Local Schedulers, as `notebookos up` starts
them) for the Jupyter-side tests."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from notebookos.config import load_config
from notebookos.proto import common_pb2, global_scheduler_pb2, global_scheduler_pb2_grpc
from notebookos.supervisor import Supervisor
from notebookos.testing.credentials import connect, security_env
from notebookos.testing.processes import free_port, pid_alive


@dataclass
class Cluster:
    address: str
    env: dict[str, str]
    workdir: Path


def start_cluster(workdir: Path, hosts: int, gpus_per_host: int = 2,
                  settings: dict | None = None) -> tuple[Cluster, Supervisor]:
    """``settings``: more configuration (dotted names), e.g. ``{"cluster.policy": "batch"}``."""
    from notebookos.commands.up_cmd import start_schedulers
    from notebookos.provisioner.kernelspecs import install_kernelspecs

    install_kernelspecs(prefix=sys.prefix)
    config = load_config(env=security_env(), overrides={
        "cluster.state_dir": str(workdir / "cluster"),
        "global_scheduler.grpc_port": free_port(),
        "local_scheduler.virtual_gpus": gpus_per_host,
        **(settings or {}),
    })
    supervisor = Supervisor(workdir / "logs")
    try:
        # the daemons read their settings from the environment too: pass ``settings`` on
        env = start_schedulers(config, hosts, supervisor, threading.Event(), extra_env={
            "NOTEBOOKOS_" + name.replace(".", "_").upper(): str(value)
            for name, value in (settings or {}).items()})
    except BaseException:
        supervisor.stop()
        raise
    assert env is not None
    address = f"127.0.0.1:{config.global_scheduler.grpc_port}"
    return Cluster(address, env, workdir), supervisor


@contextmanager
def running_cluster(workdir: Path, hosts: int, gpus_per_host: int = 2,
                    settings: dict | None = None) -> Iterator[Cluster]:
    """A started cluster with this process's provisioner pointed at it (NOTEBOOKOS_* in
    ``os.environ``); the environment is restored and every process stopped on exit."""
    cluster, supervisor = start_cluster(workdir, hosts, gpus_per_host, settings)
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in cluster.env.items() if k.startswith("NOTEBOOKOS_")})
    try:
        yield cluster
    finally:
        os.environ.clear()
        os.environ.update(saved)
        supervisor.stop()


def replica_pids(address: str, kernel_id: str) -> list[int] | None:
    """Pids of the kernel's replicas; None once the scheduler has stopped or forgotten it."""
    with connect(address) as channel:
        stub = global_scheduler_pb2_grpc.GlobalSchedulerStub(channel)
        try:
            status = stub.GetKernelStatus(
                global_scheduler_pb2.GetKernelStatusRequest(kernel_id=kernel_id), timeout=10)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
    if status.state == common_pb2.KERNEL_STATE_STOPPED:
        return None
    return [r.pid for r in status.replicas if r.pid]


def wait_gone(pids: list[int], timeout: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if pid_alive(p)]
