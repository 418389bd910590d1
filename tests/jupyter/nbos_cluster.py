"""Start a real NotebookOS cluster (Global Scheduler + Local Schedulers, as `notebookos up` starts
them) for the Jupyter-side tests."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from notebookos.config import load_config
from notebookos.supervisor import Supervisor
from notebookos.testing.processes import free_port


@dataclass
class Cluster:
    address: str
    env: dict[str, str]
    workdir: Path


def start_cluster(workdir: Path, hosts: int, gpus_per_host: int = 2) -> tuple[Cluster, Supervisor]:
    from notebookos.commands.up_cmd import start_schedulers
    from notebookos.provisioner.kernelspecs import install_kernelspecs

    install_kernelspecs(prefix=sys.prefix)
    config = load_config(env={}, overrides={
        "cluster.state_dir": str(workdir / "cluster"),
        "global_scheduler.grpc_port": free_port(),
        "local_scheduler.virtual_gpus": gpus_per_host,
    })
    supervisor = Supervisor(workdir / "logs")
    try:
        env = start_schedulers(config, hosts, supervisor, threading.Event())
    except BaseException:
        supervisor.stop()
        raise
    assert env is not None
    address = f"127.0.0.1:{config.global_scheduler.grpc_port}"
    return Cluster(address, env, workdir), supervisor
