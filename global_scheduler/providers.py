"""Where new hosts come from: the ``HostProvider`` interface and the local process provider.

A provider adds hosts (they register with the Global Scheduler by themselves when they are up)
and releases hosts the autoscaler no longer needs (after their replicas were moved off).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import uuid
from abc import ABC, abstractmethod
from pathlib import Path

from notebookos.proto import local_scheduler_pb2
from notebookos.proto import local_scheduler_pb2_grpc as ls_grpc
from notebookos.security import Connect

log = logging.getLogger(__name__)


class HostProvider(ABC):
    name = ""

    @abstractmethod
    def add_hosts(self, count: int) -> list[str]:
        """Start provisioning ``count`` hosts; returns their host ids (they register later)."""

    @abstractmethod
    def release_host(self, host_id: str, address: str) -> None:
        """Give a host back; its replicas have been moved off already."""

    def wakeable(self, hosts: int, max_hosts: int) -> int:
        """Hosts ``add_hosts`` could bring now, with ``hosts`` up or coming: new ones up to
        ``max_hosts`` (a provider with a fixed pool says what it holds in reserve)."""
        return max(0, max_hosts - hosts)

    def can_release(self, host_id: str) -> bool:
        """Whether scaling in may give ``host_id`` back through this provider."""
        return True

    def close(self) -> None:  # noqa: B027 - optional
        """Stop what the provider started, if it owns it."""


class LocalProcessProvider(HostProvider):
    """New hosts are Local Scheduler processes on this machine, with virtual GPUs."""

    name = "local"

    def __init__(self, gs_address: str, state_dir: Path, gpus_per_host: int,
                 prewarm_pool_size: int, ip: str = "127.0.0.1", *, connect: Connect,
                 env: dict[str, str] | None = None) -> None:
        self.gs_address = gs_address
        self.connect = connect
        # the Local Schedulers it starts use the Global Scheduler's credentials
        # no drain on SIGTERM (host_drain.py): the autoscaler drains a host before it releases
        # it, and close() stops them all with the Global Scheduler, when nothing is to move
        self.env = {**os.environ, **(env or {}), "NOTEBOOKOS_LOCAL_SCHEDULER_DRAIN_TIMEOUT_S": "0"}
        self.state_dir = Path(state_dir)
        self.gpus_per_host = gpus_per_host
        self.prewarm_pool_size = prewarm_pool_size
        self.ip = ip
        self.procs: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()

    def add_hosts(self, count: int) -> list[str]:
        ids = []
        logs = self.state_dir / "autoscaled"
        logs.mkdir(parents=True, exist_ok=True)
        for _ in range(count):
            host_id = f"auto-{uuid.uuid4().hex[:6]}"
            with open(logs / f"{host_id}.log", "ab") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "notebookos.cli", "local-scheduler",
                     "--host-id", host_id, "--host", self.ip, "--port", "0",
                     "--global-scheduler", self.gs_address,
                     "--virtual-gpus", str(self.gpus_per_host),
                     "--prewarm", str(self.prewarm_pool_size),
                     "--state-dir", str(self.state_dir)],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    env=self.env)
            with self._lock:
                self.procs[host_id] = proc
            log.info("autoscaler: started Local Scheduler %s (pid %d)", host_id, proc.pid)
            ids.append(host_id)
        return ids

    def can_release(self, host_id: str) -> bool:
        """Only the hosts it started: another Local Scheduler (one of ``notebookos up``'s, a
        compose service) has a supervisor that starts it again once it is shut down, and the
        autoscaler released the same host every tick (found by the fault campaign)."""
        with self._lock:
            return host_id in self.procs

    def release_host(self, host_id: str, address: str) -> None:
        with self.connect(address) as channel:
            ls_grpc.LocalSchedulerStub(channel).Shutdown(
                local_scheduler_pb2.ShutdownRequest(force=False, reason="scale-in"), timeout=30)
        with self._lock:
            proc = self.procs.pop(host_id, None)
        if proc is not None:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()

    def close(self) -> None:
        with self._lock:
            procs, self.procs = list(self.procs.values()), {}
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


class StaticPoolProvider(HostProvider):
    """Deployments with a fixed pool of pre-started Local Schedulers: scaling in keeps a released
    host registered but in reserve (draining: it takes no replicas); scaling out puts reserved
    hosts back to work. Hosts are never started or stopped."""

    name = "static"

    def __init__(self, service) -> None:  # noqa: ANN001 - a GlobalSchedulerService
        self.service = service

    def add_hosts(self, count: int) -> list[str]:
        svc = self.service
        with svc.lock:
            reserved = [h for h, link in svc.hosts.items() if link.draining][:count]
            for host_id in reserved:
                svc.hosts[host_id].draining = False
        if reserved:
            log.info("autoscaler: %s back from the static pool's reserve", ", ".join(reserved))
        return []  # already registered: nothing to wait for

    def release_host(self, host_id: str, address: str) -> None:
        log.info("autoscaler: %s kept in the static pool's reserve", host_id)

    def wakeable(self, hosts: int, max_hosts: int) -> int:
        """The hosts in reserve: a static pool starts none."""
        with self.service.lock:
            return sum(1 for link in self.service.hosts.values() if link.draining)
