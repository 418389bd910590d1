"""Launching replicas: the ``Launcher`` interface and the process launcher.

A launcher starts one replica with its connection file and Raft settings, reports its exit through
``on_exit`` the moment it happens, stops or interrupts it, and starts the prewarmed replicas the
pool keeps. The process launcher starts each replica in its own process group (so a stop reaches
everything it spawned), either cold (``python -m MODULE ...``) or by promoting a prewarmed process
from the pool. The Docker launcher (``docker_launcher.py``) runs each replica in a container.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from notebookos import import_report
from notebookos.local_scheduler import replica_records, spawn
from notebookos.local_scheduler.exit_watch import ExitWatcher
from notebookos.local_scheduler.fork_server import ForkedPrewarmed, ForkedProcess, ForkServer
from notebookos.local_scheduler.pid_watch import (
    WatchedProcess,
    pid_alive,
    same_process,
    start_ticks,
)
from notebookos.local_scheduler.preload_learning import LearnSettings, PreloadLearner, idle_for
from notebookos.local_scheduler.prewarm import Prewarmed, PrewarmedProcess, start_prewarm_process
from notebookos.loop_thread import LoopThread
from notebookos.ports import bindable, free_ports
from notebookos.resources import ResourceSpec

log = logging.getLogger(__name__)

PORT_NAMES = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


@dataclass(frozen=True)
class ReplicaSpec:
    kernel_id: str
    replica_id: int
    raft_address: str
    peers: tuple[tuple[int, str], ...]
    store_url: str
    key: str
    signature_scheme: str
    join: bool = False
    restore_from_checkpoint: bool = False
    env: dict[str, str] = field(default_factory=dict)
    kernel_name: str = ""

    @property
    def owner(self) -> str:
        return f"{self.kernel_id}/{self.replica_id}"


class ReplicaProcess(Protocol):
    """What the service needs of a running replica: ``subprocess.Popen`` has it."""

    pid: int

    def poll(self) -> int | None: ...


@dataclass
class LaunchedReplica:
    spec: ReplicaSpec
    pid: int
    ip: str
    ports: dict[str, int]
    raft_address: str
    from_prewarm_pool: bool
    log_path: Path | None
    process: ReplicaProcess
    started_unix: float = field(default_factory=time.time)
    forked: bool = False  # by the fork server, the pool being empty


def replica_source(replica: LaunchedReplica) -> str:
    """Where a replica came from, as the ``source`` label of the start metrics says."""
    if replica.from_prewarm_pool:
        return "prewarm_pool"
    return "fork_server" if replica.forked else "cold"


ExitCallback = Callable[[LaunchedReplica, int], None]


def replica_argv(spec: ReplicaSpec, connection_file: str,
                 kernel_class: str = "ReplicaKernel") -> list[str]:
    """A replica's arguments after ``python -m MODULE`` (the kernel's documented flags)."""
    c = kernel_class
    peers = ",".join(f"{rid}={addr}" for rid, addr in spec.peers)
    args = [
        "-f", connection_file,
        f"--{c}.kernel_id={spec.kernel_id}",
        f"--{c}.replica_id={spec.replica_id}",
        f"--{c}.raft_address={spec.raft_address}",
        f"--{c}.peers={peers}",
        f"--{c}.store_url={spec.store_url}",
    ]
    if spec.join:
        args.append(f"--{c}.join=True")
    if spec.restore_from_checkpoint:
        args.append(f"--{c}.restore_from_checkpoint=True")
    return args


def connection_document(ip: str, ports: dict[str, int], spec: ReplicaSpec) -> dict:
    """The Jupyter connection file of a replica."""
    return {"ip": ip, "transport": "tcp", **ports, "key": spec.key,
            "signature_scheme": spec.signature_scheme, "kernel_name": spec.kernel_name}


class Launcher(ABC):
    """Starts, stops and watches the replicas of one host."""

    # The loop that learns of the replicas' exits, if the launcher has one (exit_watch.py):
    # the service watches their starts on it too, so one thread owns every replica event.
    events_loop: LoopThread | None = None

    @abstractmethod
    def launch(
        self, spec: ReplicaSpec, prewarmed: Prewarmed | None = None,
        resources: ResourceSpec | None = None,
    ) -> LaunchedReplica:
        """Start a replica (from ``prewarmed`` when given); ``resources`` is its request."""

    @abstractmethod
    def stop(self, replica: LaunchedReplica, grace_period_s: float) -> int: ...

    @abstractmethod
    def interrupt(self, replica: LaunchedReplica) -> None: ...

    @abstractmethod
    def start_prewarmed(self) -> Prewarmed:
        """Start one prewarmed replica for the pool and wait until it is ready.

        Raises OSError or RuntimeError with a message when it cannot."""

    def log_tail(self, replica: LaunchedReplica, limit: int = 2000) -> str:
        """The last ``limit`` characters the replica wrote."""
        return log_tail(replica.log_path, limit) if replica.log_path is not None else ""

    def recover(self) -> list[tuple[LaunchedReplica, ResourceSpec]]:
        """Replicas a previous run of this Local Scheduler left running, now watched again."""
        return []

    def close(self) -> None:  # noqa: B027 - optional
        """Release what the launcher holds (not the replicas: ``stop`` them first)."""


class ProcessLauncher(Launcher):
    """Replicas as local processes: ``python -m <module> -f <connection file> --Class.trait=...``."""

    def __init__(
        self,
        workdir: Path,
        on_exit: ExitCallback,
        *,
        ip: str = "127.0.0.1",
        module: str = "notebookos.kernel",
        kernel_class: str = "ReplicaKernel",
        python: str = sys.executable,
        fork_server: bool = False,
        orphan_grace_s: float = 60.0,
        learn: LearnSettings | None = None,
        on_learned: Callable[[], None] | None = None,
        preload_modules: list[str] | None = None,
    ) -> None:
        """``learn``: learn what to preload from what the replicas import
        (``preload_learning``; None: not), calling ``on_learned`` each time it learned
        something; ``preload_modules``: the configured ones (not learned again)."""
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.on_exit = on_exit
        # what a restarted Local Scheduler reads to take its replicas back (replica_records.py);
        # a replica whose Local Scheduler died waits this long for one (orphan_watch.py)
        self.records = replica_records.ReplicaRecords(self.workdir)
        self.orphan_grace_s = orphan_grace_s
        self.ip = ip
        self.module = module
        self.kernel_class = kernel_class
        self.python = python
        # Replicas started when the prewarm pool is empty, and the pool's own, fork from a
        # preloaded interpreter (fork_server.py); None: they start as new interpreters.
        self.fork_server = (ForkServer(python, module, self.workdir / "fork-server.log")
                            if fork_server else None)
        self.exits = ExitWatcher()
        self.events_loop = self.exits.loop
        self.last_launch = 0.0  # time.monotonic() of the latest launch
        self.learner = (PreloadLearner(learn, self.workdir, self.fork_server,
                                       idle=idle_for(lambda: self.last_launch),
                                       on_learned=on_learned, configured=preload_modules)
                        if learn is not None and learn.enabled else None)
        if self.fork_server is not None:
            self.fork_server.start_in_background()
        if self.learner is not None:
            self.learner.start()

    def argv(self, spec: ReplicaSpec, connection_file: Path) -> list[str]:
        """The replica's arguments after ``python -m MODULE`` (the kernel's documented flags)."""
        return replica_argv(spec, str(connection_file), self.kernel_class)

    def start_prewarmed(self) -> PrewarmedProcess | ForkedPrewarmed:
        """Forked by the fork server (a fork, not an interpreter's start and imports) when it
        runs; while it starts, once it is up; else a new process."""
        waiting = self.fork_server.waiting_or_none() if self.fork_server is not None else None
        return waiting or start_prewarm_process(
            self.python, self.module, self.learner.learned if self.learner is not None else None)

    def launch(
        self, spec: ReplicaSpec, prewarmed: Prewarmed | None = None,
        resources: ResourceSpec | None = None,
    ) -> LaunchedReplica:
        if prewarmed is not None and not isinstance(prewarmed, PrewarmedProcess |
                                                    ForkedPrewarmed):
            raise TypeError(f"the process launcher cannot promote {prewarmed!r}")
        raft_host, _, raft_port = spec.raft_address.rpartition(":")
        exclude = {int(raft_port)} if raft_port.isdigit() else set()
        if raft_port.isdigit() and not bindable(raft_host or self.ip, int(raft_port)):
            # refused before the replica starts: a replica that cannot bind it would die
            raise OSError(f"cannot listen for Raft on {spec.raft_address}: the port is in use "
                          f"on host {self.ip}")
        drawn = free_ports(len(PORT_NAMES), self.ip, exclude=exclude)
        ports = dict(zip(PORT_NAMES, drawn, strict=True))
        name = f"{spec.kernel_id}-{spec.replica_id}-{int(time.time() * 1000)}"
        connection_file = self.workdir / f"{name}.json"
        connection_file.write_text(json.dumps(connection_document(self.ip, ports, spec)))
        connection_file.chmod(0o600)
        log_path = self.workdir / f"{name}.log"
        argv = self.argv(spec, connection_file)
        env = {**spec.env, replica_records.ENV_LS_PID: str(os.getpid()),
               replica_records.ENV_STATE_FILE: str(self.records.path),
               replica_records.ENV_ORPHAN_GRACE_S: str(self.orphan_grace_s)}
        if self.learner is not None:  # what its cells import, for the host to preload
            env[import_report.ENV_IMPORT_REPORT] = str(self.learner.report_path)
        self.last_launch = time.monotonic()
        # The fork server imports a learned package (seconds, for torch): a fork or a promotion
        # of its waiting child would wait behind it, and this launch holds the host's service
        # lock, which its heartbeats need. A new interpreter starts instead.
        server_busy = self.fork_server is not None and self.fork_server.importing
        if server_busy and isinstance(prewarmed, ForkedPrewarmed):
            log.info("the fork server is importing: %s starts as a new interpreter", spec.owner)
            prewarmed.discard()
            prewarmed = None
        process: ReplicaProcess | None = None
        if prewarmed is not None:
            process = prewarmed.promote(argv, env, log_path)
        else:
            process = (self.fork_server.fork_or_none(argv, env, log_path)
                       if self.fork_server is not None and not server_busy else None)
        if process is None:
            with open(log_path, "ab") as log_file:
                process = spawn.popen(
                    [self.python, "-m", "notebookos.local_scheduler.child", self.module, *argv],
                    stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                    env={**os.environ, **env},
                )
        replica = LaunchedReplica(spec, process.pid, self.ip, ports, spec.raft_address,
                                  prewarmed is not None, log_path, process,
                                  forked=prewarmed is None and isinstance(process, ForkedProcess))
        self.records.put(spec.owner, replica_records.record_of(replica, resources,
                                                               start_ticks(process.pid)))
        self._watch(replica)
        return replica

    def recover(self) -> list[tuple[LaunchedReplica, ResourceSpec]]:
        """The replicas a previous run of this Local Scheduler started that still run (the same
        pid with the same start time), watched again through a pidfd; the records then name this
        Local Scheduler as theirs, which tells each replica's orphan watch it was taken back."""
        recovered: list[tuple[LaunchedReplica, ResourceSpec]] = []
        holder = self.records.holder()
        if holder is not None and holder != os.getpid() and pid_alive(holder):
            # another daemon under this host id still runs and holds them (the Global Scheduler
            # refuses the second one): take nothing; they end with it if it dies unrestarted
            log.warning("the replicas recorded in %s belong to Local Scheduler %d, which still "
                        "runs: not taking them", self.records.path, holder)
            return recovered
        for record in self.records.load():
            try:
                doc = record["spec"]
                spec = ReplicaSpec(**{**doc, "peers": tuple(tuple(p) for p in doc["peers"])})
                pid = int(record["pid"])
                if not same_process(pid, record.get("start_ticks")) or not pid_alive(pid):
                    # gone, or a zombie nobody reaped yet (it died while no Local Scheduler
                    # ran): not taken back, so the Global Scheduler replaces it
                    continue
                resources = ResourceSpec(*(record.get("resources") or ()))
                log_path = Path(record["log_path"]) if record.get("log_path") else None
                replica = LaunchedReplica(
                    spec, pid, record["ip"], {k: int(v) for k, v in record["ports"].items()},
                    record["raft_address"], bool(record.get("from_prewarm_pool")), log_path,
                    WatchedProcess(pid), started_unix=float(record.get("started_unix", 0.0)),
                    forked=bool(record.get("forked")))
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("cannot take back a replica recorded in %s (%s): %r",
                            self.records.path, exc, record)
                continue
            self.records.put(spec.owner, record)
            self._watch(replica)
            recovered.append((replica, resources))
        self.records.save()  # names this Local Scheduler as the holder, even of none
        return recovered

    def _watch(self, replica: LaunchedReplica) -> None:
        """Learn of the replica's exit without a thread of its own: the fork server's notice
        for a forked one, else the launcher's exit watcher (a pidfd in one selector)."""
        process = replica.process
        assert isinstance(process, subprocess.Popen | ForkedProcess | WatchedProcess)
        if isinstance(process, ForkedProcess):
            # the fork server's reader reports it: hand the work to the watcher's thread
            process.add_exit_callback(
                lambda code: self.exits.call(lambda: self._exited(replica, code)))
        else:
            self.exits.watch(process, lambda code: self._exited(replica, code))

    def _exited(self, replica: LaunchedReplica, code: int) -> None:
        self.records.drop(replica.spec.owner)
        try:
            self.on_exit(replica, code)
        except Exception:  # noqa: BLE001 - a failing callback must not kill the watcher silently
            log.exception("exit callback failed for %s", replica.spec.owner)

    def stop(self, replica: LaunchedReplica, grace_period_s: float) -> int:
        proc = replica.process
        assert isinstance(proc, subprocess.Popen | ForkedProcess | WatchedProcess)
        if proc.poll() is None:
            spawn.signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_period_s)
            except subprocess.TimeoutExpired:
                spawn.signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        return proc.returncode

    def interrupt(self, replica: LaunchedReplica) -> None:
        if replica.process.poll() is None:
            os.kill(replica.pid, signal.SIGINT)

    def close(self) -> None:
        if self.learner is not None:
            self.learner.close()
        if self.fork_server is not None:
            self.fork_server.close()
        self.exits.close()


def log_tail(path: Path, limit: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""
