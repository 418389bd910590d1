"""``notebookos replay --local HOSTSxGPUS``: an embedded cluster for one run.

Started as ``notebookos up`` starts it (a Global Scheduler, HOSTS Local Schedulers with GPUS
virtual GPUs each unless real ones are found, the NotebookOS kernelspecs), plus a Jupyter Server
without a browser, all under one supervisor in a temporary state directory. ``stop()`` stops every
process (replicas included: they carry the supervisor's marker) and deletes the directory, so a
run leaves nothing behind; the daemons' logs are copied to the run's output folder first.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from notebookos.config import Config, load_config, settings
from notebookos.ports import free_ports
from notebookos.simulator.hosts import MEMORY_MB_PER_GPU, MILLICPUS_PER_GPU, VRAM_GB_PER_GPU
from notebookos.supervisor import Supervisor

EXTENSION = "notebookos.provisioner"  # the NotebookOS Jupyter Server extension


def server_argv(port: int, token: str, root: Path) -> list[str]:
    """The embedded Jupyter Server's command line. It enables the NotebookOS server extension
    itself: the data file that enables it for every server of an environment
    (jupyter_server_config.d/notebookos.json) is not installed by an editable install
    (pyproject.toml), and without the extension every sample of /api/notebookos/cluster is a
    404 (no kernel-ready time, no cluster samples) and the kernel websockets are not
    TCP_NODELAY, which adds Nagle's delays to every cell."""
    return [sys.executable, "-m", "jupyter_server", "--ip=127.0.0.1",
            f"--port={port}", "--port-retries=0",
            f"--IdentityProvider.token={token}", "--ServerApp.open_browser=False",
            "--MappingKernelManager.default_kernel_name=notebookos",
            f"--ServerApp.jpserver_extensions={EXTENSION}=True",
            f"--ServerApp.root_dir={root}"]


def setting_env(values: dict[str, Any]) -> dict[str, str]:
    """``{"cluster.policy": "batch"}`` -> ``{"NOTEBOOKOS_CLUSTER_POLICY": "batch"}``."""
    infos = {info.dotted: info for info in settings()}
    env = {}
    for dotted, value in values.items():
        info = infos[dotted]
        env[info.env_var] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return env


class LocalCluster:
    def __init__(self, hosts: int, gpus_per_host: int, policy: str, autoscale: bool = False,
                 max_hosts: int | None = None, extra: dict[str, Any] | None = None,
                 config_path: str | None = None) -> None:
        self.hosts = hosts
        self.gpus_per_host = gpus_per_host
        self.state_dir = Path(tempfile.mkdtemp(prefix="notebookos-replay-"))
        grpc_port, jupyter_port = free_ports(2)
        self.values: dict[str, Any] = {
            "cluster.policy": policy,
            "cluster.state_dir": str(self.state_dir),
            "global_scheduler.grpc_port": grpc_port,
            "global_scheduler.autoscale": autoscale,
            "global_scheduler.min_hosts": hosts,
            "global_scheduler.max_hosts": max(hosts, max_hosts or hosts),
            "local_scheduler.virtual_gpus": gpus_per_host,
            # Each virtual host is the simulator's GPU VM, not a share of this machine's cores
            # and memory, so that placement sees the capacities the simulator does.
            "local_scheduler.millicpus": MILLICPUS_PER_GPU * gpus_per_host,
            "local_scheduler.memory_mb": MEMORY_MB_PER_GPU * gpus_per_host,
            "local_scheduler.vram_gb_per_gpu": VRAM_GB_PER_GPU,
            **(extra or {}),
        }
        self.jupyter_port = jupyter_port
        self.token = secrets.token_hex(16)
        self.config: Config = load_config(config_path, overrides=self.values)
        self.config_path = config_path
        self.notes: list[str] = []  # daemons restarted, as the supervisor says
        self.supervisor = Supervisor(self.state_dir / "logs", say=self.notes.append)
        self.url = f"http://127.0.0.1:{jupyter_port}"

    def start(self, stop: threading.Event | None = None) -> str:
        """Start everything; returns the Jupyter Server URL. Raises RuntimeError on failure
        (the caller still calls ``stop()``)."""
        from notebookos.commands.up_cmd import restart_policy, start_schedulers
        from notebookos.provisioner.kernelspecs import install_kernelspecs

        install_kernelspecs(prefix=sys.prefix)
        env = start_schedulers(self.config, self.hosts, self.supervisor,
                               stop or threading.Event(), extra_env={
                                   **({"NOTEBOOKOS_CONFIG": str(Path(self.config_path).resolve())}
                                      if self.config_path else {}),
                                   **setting_env(self.values)})
        if env is None:
            raise RuntimeError("stopped while the cluster was starting")
        root = self.state_dir / "notebooks"
        root.mkdir()
        argv = server_argv(self.jupyter_port, self.token, root)
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            argv.append("--allow-root")
        server = self.supervisor.start("jupyter-server", argv, env=env,
                                       restart=restart_policy(self.config))
        self.supervisor.wait_for_port(server, "127.0.0.1", self.jupyter_port, timeout=90)
        return self.url

    def supervise(self) -> str | None:
        """Restart daemons that exited (as ``notebookos up`` does, with its backoff; it never
        gives up on one); returns why the cluster cannot go on (a daemon without a restart
        policy exited), else None. What happened is in ``notes``."""
        return self.supervisor.supervise()

    def stop(self, keep_logs: Path | None = None) -> list[int]:
        """Stop every process, copy the logs to ``keep_logs``, delete the state directory.
        Returns the pids of leftovers that had to be killed."""
        leftovers = self.supervisor.stop()
        if keep_logs is not None:
            with contextlib.suppress(OSError):
                shutil.copytree(self.state_dir / "logs", keep_logs, dirs_exist_ok=True)
        for _ in range(5):  # a replica killed a moment ago may still be writing its files
            shutil.rmtree(self.state_dir, ignore_errors=True)
            if not self.state_dir.exists():
                break
            time.sleep(0.2)
        return leftovers
