"""The Docker launcher: each replica runs in a container of this host's Docker engine.

Chosen with ``local_scheduler.launcher = "docker"``; talks to the engine through the Docker SDK for
Python (the socket the Local Scheduler container mounts). A replica container

- runs the NotebookOS image (``local_scheduler.docker_image``) as an unprivileged user, with no
  capabilities, CPU and memory limits from the kernel's resource request, and the host's GPUs
  (a ``DeviceRequest`` for the device ids this host offers: the per-cell binding then picks among
  them, as with processes);
- joins the cluster network (``local_scheduler.docker_network``, else the network of the Local
  Scheduler's own container: a user-defined bridge under compose, an attachable overlay under
  Swarm) and is named ``nbos-<kernel>-r<replica>``. That name is its Raft address: the Global
  Scheduler proposes ``<host ip>:<port>`` for every member of a group before any container exists,
  so every Docker Local Scheduler turns a member's address into ``nbos-<kernel>-r<id>:<port>``,
  which the engine's DNS resolves on the cluster network to the member's own container;
- is labelled ``notebookos.role``, ``notebookos.host_id``, and (when started cold)
  ``notebookos.kernel_id`` and ``notebookos.replica_id``; a prewarmed container, made before its
  kernel was known, gets its identity by being renamed when it is promoted;
- carries ``/tmp/nbos/replica.json`` (what it runs, its ports, its request), from which a Local
  Scheduler restarted after a crash takes its running containers back;
- is removed once it exits. One thread follows the engine's event stream and reports exits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import random
import re
import socket
import tarfile
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import docker
import docker.errors
from docker.types import DeviceRequest, LogConfig

from notebookos.local_scheduler.gpus import Gpu, parse_nvidia_smi, real_gpus
from notebookos.local_scheduler.launcher import (
    PORT_NAMES,
    ExitCallback,
    LaunchedReplica,
    Launcher,
    ReplicaSpec,
    connection_document,
    replica_argv,
)
from notebookos.resources import ResourceSpec

log = logging.getLogger(__name__)

LABEL_ROLE = "notebookos.role"
LABEL_HOST = "notebookos.host_id"
LABEL_KERNEL = "notebookos.kernel_id"
LABEL_REPLICA = "notebookos.replica_id"
RUN_DIR = "/tmp/nbos"
CONNECTION_FILE = f"{RUN_DIR}/connection.json"
INFO_FILE = f"{RUN_DIR}/replica.json"
ORDER_FILE = f"{RUN_DIR}/order.json"
CLOSE_WAIT_S = 30.0  # close() waits this long for container starts under way
FIRST_PORT = 9000  # a replica container has a network namespace of its own: any port is free


class DockerUnavailable(OSError):
    """The Docker engine cannot be reached, or lacks what the launcher needs."""


def connect(timeout_s: float = 30.0) -> docker.DockerClient:
    """A client of the engine named by ``DOCKER_HOST`` (default: the local socket)."""
    try:
        client = docker.from_env(version="auto", timeout=int(timeout_s))
        client.ping()
    except docker.errors.DockerException as exc:
        where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise DockerUnavailable(
            f"the docker launcher cannot reach the Docker engine at {where}: {exc} (mount the "
            "engine's socket into the Local Scheduler's container, or set "
            "local_scheduler.launcher = \"process\")") from exc
    return client


def own_container(client: docker.DockerClient) -> Any | None:
    """The container this process runs in, when it runs in one of this engine's containers."""
    try:
        return client.containers.get(socket.gethostname())
    except (docker.errors.NotFound, docker.errors.APIError):
        return None


def default_host_id(client: docker.DockerClient) -> str:
    """A host id that survives a restart of the Local Scheduler's container: the node's name for
    a task of a global Swarm service (one Local Scheduler per node), ``<node>-<service>.<slot>``
    for a task of a replicated one, else the container's name (compose keeps it), else this
    machine's hostname."""
    me = own_container(client)
    if me is None:
        return socket.gethostname()
    task = me.labels.get("com.docker.swarm.task.name", "")  # <service>.<slot|node id>.<task id>
    if not task:
        return me.name
    node = str(client.info().get("Name") or socket.gethostname())
    service = me.labels.get("com.docker.swarm.service.name", "")
    slot = task[len(service) + 1:].rsplit(".", 1)[0] if task.startswith(service + ".") else ""
    return f"{node}-{service}.{slot}" if slot.isdigit() else node


def detect_gpus(client: docker.DockerClient, image: str, virtual_count: int,
                vram_gb_per_virtual: float) -> tuple[list[Gpu], bool]:
    """(devices, virtual). A Local Scheduler in a container sees no GPU itself: ask a throwaway
    container that requests every GPU of the engine (it fails at once when the engine has no
    NVIDIA runtime), else offer ``virtual_count`` virtual GPUs."""
    found = real_gpus() or probe_engine_gpus(client, image)
    if found:
        return found, False
    return [Gpu(i, "virtual", vram_gb_per_virtual) for i in range(virtual_count)], True


def probe_engine_gpus(client: docker.DockerClient, image: str) -> list[Gpu]:
    """The GPUs a container of this engine can get, as ``nvidia-smi`` in it lists them."""
    query = ["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"]
    container = None
    try:
        container = client.containers.create(
            image, query, entrypoint=[], network_mode="none",
            device_requests=[DeviceRequest(count=-1, capabilities=[["gpu"]])],
            environment={"NVIDIA_DRIVER_CAPABILITIES": "utility"})
        container.start()
        code = container.wait(timeout=60).get("StatusCode", -1)
        out = container.logs(stdout=True, stderr=False).decode(errors="replace")
    except Exception as exc:  # noqa: BLE001 - no runtime, no driver, a timeout: no GPU here
        log.info("no GPU reachable through the Docker engine (%s): offering virtual GPUs",
                 str(exc).strip()[:200])
        return []
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except docker.errors.DockerException:
                pass
    if code != 0:
        log.warning("nvidia-smi in a GPU container failed (exit %s): %s", code, out[-300:])
        return []
    return parse_nvidia_smi(out)


def container_name(kernel_id: str, replica_id: int) -> str:
    """``nbos-<kernel>-r<replica>``: a DNS label on the cluster network (at most 63 characters)."""
    safe = re.sub(r"[^a-z0-9-]", "-", kernel_id.lower()).strip("-")[:48] or "kernel"
    return f"nbos-{safe}-r{replica_id}"


def raft_address(kernel_id: str, replica_id: int, proposed: str) -> str:
    """The Raft address of a replica container, from the ``host:port`` the GS proposed. An
    address that names a replica container already is kept (a replacement joining a group)."""
    host, _, port = proposed.rpartition(":")
    if host.startswith("nbos-"):
        return proposed
    if not port.isdigit() or int(port) == 0:
        port = str(random.randint(20000, 59999))
    return f"{container_name(kernel_id, replica_id)}:{port}"


def container_ports(raft: str) -> dict[str, int]:
    raft_port = int(raft.rpartition(":")[2])
    candidates = [p for p in range(FIRST_PORT, FIRST_PORT + len(PORT_NAMES) + 1) if p != raft_port]
    return dict(zip(PORT_NAMES, candidates, strict=False))


def _tar(files: Iterable[tuple[str, bytes]], uid: int, gid: int) -> bytes:
    """A tar of ``nbos/<name>`` files (mode 0600, owned by the replica's user), in order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        directory = tarfile.TarInfo("nbos")
        directory.type, directory.mode, directory.uid, directory.gid = tarfile.DIRTYPE, 0o700, uid, gid
        tar.addfile(directory)
        for name, data in files:
            info = tarfile.TarInfo(f"nbos/{name}")
            info.size, info.mode, info.uid, info.gid = len(data), 0o600, uid, gid
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class ContainerProcess:
    """A replica container seen as a process: ``pid`` and ``poll()`` (the exit code once the
    engine reported it)."""

    def __init__(self, container_id: str, pid: int) -> None:
        self.container_id = container_id
        self.pid = pid
        self.exit_code: int | None = None
        self.exited = threading.Event()

    def poll(self) -> int | None:
        return self.exit_code

    def mark_exited(self, code: int) -> None:
        self.exit_code = code
        self.exited.set()


class PrewarmedContainer:
    """A running container whose ``prewarm_main`` waits for ``ORDER_FILE``."""

    def __init__(self, launcher: DockerLauncher, container: Any, process: ContainerProcess) -> None:
        self.launcher = launcher
        self.container = container
        self.process = process

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def discard(self) -> None:
        self.launcher.forget(self.process.container_id)
        self.launcher.remove(self.container.id)


@dataclasses.dataclass
class _Tracked:
    process: ContainerProcess
    replica: LaunchedReplica | None  # None for a prewarmed container


class DockerLauncher(Launcher):
    def __init__(
        self,
        client: docker.DockerClient,
        on_exit: ExitCallback,
        *,
        host_id: str,
        image: str,
        network: str = "",
        user: str = "1000:1000",
        module: str = "notebookos.kernel",
        kernel_class: str = "ReplicaKernel",
        gpu_device_ids: list[int] | None = None,
        pass_env: list[str] | None = None,
        ready_timeout_s: float = 120.0,
    ) -> None:
        self.client = client
        self.on_exit = on_exit
        self.host_id = host_id
        self.image = image
        self.user = user
        self.module = module
        self.kernel_class = kernel_class
        self.gpu_device_ids = list(gpu_device_ids or [])
        self.pass_env = list(pass_env or [])
        self.ready_timeout_s = ready_timeout_s
        uid, _, gid = user.partition(":")
        self._uid = int(uid) if uid.isdigit() else 1000
        self._gid = int(gid) if gid.isdigit() else self._uid
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            raise DockerUnavailable(
                f"image {image!r} is not on this host's Docker engine (set "
                "local_scheduler.docker_image; build it with scripts/build-image.sh, or `docker "
                "load` it: no registry is used)") from None
        self.network = network or self._own_network()
        self._tracked: dict[str, _Tracked] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        # container starts under way (replicas and prewarmed ones), under _idle: close() waits
        # for them, since a start that ends after close() swept would leave its container behind
        self._starts = 0
        self._idle = threading.Condition(self._lock)
        self._events: Any = None
        self._removals = ThreadPoolExecutor(max_workers=2, thread_name_prefix="docker-remove")
        self._since = int(time.time()) - 1
        self._watcher = threading.Thread(target=self._watch_events, daemon=True,
                                         name="docker-events")
        self._watcher.start()

    def _own_network(self) -> str:
        me = own_container(self.client)
        networks = list((me.attrs["NetworkSettings"]["Networks"] if me else {}).keys())
        networks = [n for n in networks if n not in ("ingress", "bridge", "host", "none")]
        if not networks:
            raise DockerUnavailable(
                "the docker launcher needs a user-defined network for replica containers (their "
                "names must resolve): set local_scheduler.docker_network, or run the Local "
                "Scheduler in a container on such a network")
        return networks[0]

    # -- the containers ---------------------------------------------------------------------

    def _labels(self, role: str, spec: ReplicaSpec | None = None) -> dict[str, str]:
        labels = {LABEL_ROLE: role, LABEL_HOST: self.host_id}
        if spec is not None:
            labels[LABEL_KERNEL] = spec.kernel_id
            labels[LABEL_REPLICA] = str(spec.replica_id)
        return labels

    def _environment(self, extra: dict[str, str]) -> dict[str, str]:
        env = {name: os.environ[name] for name in self.pass_env if name in os.environ}
        if self.gpu_device_ids:
            env["NVIDIA_DRIVER_CAPABILITIES"] = "compute,utility"
        env.update(extra)
        return env

    def _create(self, name: str, command: list[str], labels: dict[str, str],
                env: dict[str, str], resources: ResourceSpec | None) -> Any:
        requests = ([DeviceRequest(device_ids=[str(i) for i in self.gpu_device_ids],
                                   capabilities=[["gpu"]])] if self.gpu_device_ids else None)
        return self.client.containers.create(
            self.image, command, name=name, hostname=name[:63], labels=labels,
            environment=env, user=self.user, network=self.network, detach=True,
            cap_drop=["ALL"], security_opt=["no-new-privileges"], device_requests=requests,
            log_config=LogConfig(type="json-file", config={"max-size": "10m", "max-file": "2"}),
            **self._limits(resources))

    @staticmethod
    def _limits(resources: ResourceSpec | None) -> dict[str, Any]:
        if resources is None:
            return {}
        limits: dict[str, Any] = {}
        if resources.millicpus:
            limits["nano_cpus"] = resources.millicpus * 1_000_000
        if resources.memory_mb:
            limits["mem_limit"] = f"{resources.memory_mb}m"
        return limits

    def _track(self, container: Any, replica: LaunchedReplica | None,
               process: ContainerProcess) -> None:
        with self._lock:
            self._tracked[container.id] = _Tracked(process, replica)

    def forget(self, container_id: str) -> None:
        with self._lock:
            self._tracked.pop(container_id, None)

    def remove(self, container_id: str) -> None:
        try:
            self.client.api.remove_container(container_id, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: its removal is already in progress
                log.warning("could not remove container %s: %s", container_id[:12], exc)

    def _ip(self, container: Any) -> str:
        container.reload()
        networks = container.attrs["NetworkSettings"]["Networks"]
        address = (networks.get(self.network) or next(iter(networks.values()), {})).get(
            "IPAddress", "")
        if not address:
            raise RuntimeError(f"container {container.name} has no address on {self.network}")
        return address

    # -- Launcher ---------------------------------------------------------------------------

    def launch(self, spec: ReplicaSpec, prewarmed: Any = None,
               resources: ResourceSpec | None = None) -> LaunchedReplica:
        if prewarmed is not None and not isinstance(prewarmed, PrewarmedContainer):
            raise TypeError(f"the docker launcher cannot promote {prewarmed!r}")
        with self._starting():
            return self._launch(spec, prewarmed, resources)

    @contextlib.contextmanager
    def _starting(self) -> Iterator[None]:
        """A container start under way, which close() waits for; none after close()."""
        with self._lock:
            if self._closed.is_set():
                raise RuntimeError("the Local Scheduler is stopping: no new container")
            self._starts += 1
        try:
            yield
        finally:
            with self._lock:
                self._starts -= 1
                self._idle.notify_all()

    def _launch(self, spec: ReplicaSpec, prewarmed: Any,
                resources: ResourceSpec | None) -> LaunchedReplica:
        name = container_name(spec.kernel_id, spec.replica_id)
        spec = dataclasses.replace(
            spec, raft_address=raft_address(spec.kernel_id, spec.replica_id, spec.raft_address),
            peers=tuple((rid, raft_address(spec.kernel_id, rid, addr)) for rid, addr in spec.peers))
        ports = container_ports(spec.raft_address)
        argv = replica_argv(spec, CONNECTION_FILE, self.kernel_class)
        files = [("connection.json", json.dumps(connection_document("0.0.0.0", ports, spec))),
                 ("replica.json", json.dumps(self._info(spec, ports, resources)))]
        self._remove_leftover(name)
        container = None
        try:
            if prewarmed is None:
                container = self._create(name, ["python", "-m", self.module, *argv],
                                         self._labels("replica", spec),
                                         self._environment(spec.env), resources)
                container.put_archive("/tmp", _tar(((n, d.encode()) for n, d in files),
                                                   self._uid, self._gid))
                container.start()
                ip = self._ip(container)
                process = ContainerProcess(container.id, container.attrs["State"]["Pid"])
            else:
                container, process = prewarmed.container, prewarmed.process
                try:
                    container.rename(name)
                except docker.errors.APIError as exc:
                    # Docker 20.10 cannot rename a container attached to a swarm's overlay
                    # network ("Could not add service state for endpoint ... on rename": the
                    # stack's `cluster` network on a multi-node swarm). Start this one cold
                    # rather than fail the kernel's start attempt.
                    log.warning("prewarmed container %s cannot become %s (%s): starting it "
                                "cold", container.name, name, exc)
                    prewarmed.discard()
                    return self._launch(spec, None, resources)
                limits = self._limits(resources)
                if limits:
                    container.update(
                        cpu_quota=limits.get("nano_cpus", 0) // 10_000 or None,
                        cpu_period=100_000 if "nano_cpus" in limits else None,
                        mem_limit=limits.get("mem_limit"), memswap_limit=-1)
                order = {"argv": argv, "env": self._environment(spec.env)}
                container.put_archive("/tmp", _tar(
                    [(n, d.encode()) for n, d in files]
                    + [("order.json", json.dumps(order).encode())], self._uid, self._gid))
                ip = self._ip(container)
        except (docker.errors.DockerException, RuntimeError) as exc:
            if prewarmed is not None:
                prewarmed.discard()
            elif container is not None:
                self.remove(container.id)
            raise RuntimeError(f"could not start replica container {name}: {exc}") from exc
        replica = LaunchedReplica(spec, process.pid, ip, ports, spec.raft_address,
                                  prewarmed is not None, None, process)
        self._track(container, replica, process)
        if self._closed.is_set():  # stopped while it started: close() may have swept already
            self.forget(container.id)
            self.remove(container.id)
            raise RuntimeError(f"the Local Scheduler stopped while {name} started")
        if process.exit_code is None and self._exited_meanwhile(container):
            self._handle_exit(container.id, self._exit_code_of(container))
        return replica

    def _info(self, spec: ReplicaSpec, ports: dict[str, int],
              resources: ResourceSpec | None) -> dict[str, Any]:
        r = resources or ResourceSpec()
        return {"spec": {**dataclasses.asdict(spec), "peers": [list(p) for p in spec.peers]},
                "ports": ports, "started_unix": time.time(),
                "resources": [r.millicpus, r.memory_mb, r.gpus, r.vram_gb]}

    def _remove_leftover(self, name: str) -> None:
        """A container of that name left by a replica of the same id (an earlier per-cell
        container whose removal is still under way, say) would make the name ambiguous."""
        try:
            old = self.client.containers.get(name)
        except docker.errors.NotFound:
            return
        log.info("removing leftover container %s", name)
        self.forget(old.id)
        self.remove(old.id)

    def _exited_meanwhile(self, container: Any) -> bool:
        try:
            container.reload()
        except docker.errors.NotFound:
            return True
        return container.status in ("exited", "dead")

    @staticmethod
    def _exit_code_of(container: Any) -> int:
        try:
            return int(container.attrs["State"].get("ExitCode", -1))
        except (KeyError, TypeError, ValueError):
            return -1

    def stop(self, replica: LaunchedReplica, grace_period_s: float) -> int:
        process = replica.process
        assert isinstance(process, ContainerProcess)
        try:
            self.client.api.stop(process.container_id, timeout=max(1, round(grace_period_s)))
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            log.warning("stopping %s: %s", replica.spec.owner, exc)
        if not process.exited.wait(timeout=10):
            try:  # the event stream lags or is down: read the exit code from the engine
                state = self.client.api.inspect_container(process.container_id)["State"]
                self._handle_exit(process.container_id, int(state.get("ExitCode", -1)))
            except docker.errors.NotFound:
                self._handle_exit(process.container_id, -1)
        self.remove(process.container_id)
        return process.exit_code if process.exit_code is not None else -1

    def interrupt(self, replica: LaunchedReplica) -> None:
        process = replica.process
        assert isinstance(process, ContainerProcess)
        if process.poll() is None:
            try:
                self.client.api.kill(process.container_id, signal="SIGINT")
            except docker.errors.APIError as exc:
                log.warning("interrupting %s: %s", replica.spec.owner, exc)

    def log_tail(self, replica: LaunchedReplica, limit: int = 2000) -> str:
        process = replica.process
        assert isinstance(process, ContainerProcess)
        try:
            out = self.client.api.logs(process.container_id, tail=100)
        except docker.errors.APIError:
            return ""
        return out.decode(errors="replace")[-limit:]

    def start_prewarmed(self) -> PrewarmedContainer:
        with self._starting():
            return self._start_prewarmed()

    def _start_prewarmed(self) -> PrewarmedContainer:
        name = f"nbos-prewarm-{re.sub(r'[^a-z0-9-]', '-', self.host_id.lower())[:30]}-" \
               f"{os.urandom(4).hex()}"
        command = ["python", "-m", "notebookos.local_scheduler.prewarm_main",
                   "--order-file", ORDER_FILE, self.module]
        try:
            container = self._create(name, command, self._labels("prewarm"),
                                     self._environment({}), None)
            container.start()
            container.reload()
        except docker.errors.DockerException as exc:
            raise RuntimeError(f"cannot start a prewarmed container: {exc}") from exc
        process = ContainerProcess(container.id, container.attrs["State"]["Pid"])
        prewarmed = PrewarmedContainer(self, container, process)
        self._track(container, None, process)
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline and process.poll() is None \
                and not self._closed.is_set():
            try:
                if b"ready" in self.client.api.logs(container.id, stdout=True, stderr=False):
                    return prewarmed
            except docker.errors.NotFound:
                break
            time.sleep(0.1)
        tail = ""
        try:
            tail = self.client.api.logs(container.id, tail=20).decode(errors="replace")
        except docker.errors.APIError:
            pass
        prewarmed.discard()
        if self._closed.is_set():
            raise RuntimeError("the launcher is closing")
        raise RuntimeError(f"prewarmed container {name} did not get ready: {tail[-500:]}")

    def recover(self) -> list[tuple[LaunchedReplica, ResourceSpec]]:
        recovered = []
        for container in self.client.containers.list(
                all=True, filters={"label": f"{LABEL_HOST}={self.host_id}"}):
            role = container.labels.get(LABEL_ROLE)
            promoted = role == "replica" or not container.name.startswith("nbos-prewarm-")
            if container.status != "running" or not promoted:
                self.remove(container.id)  # a dead replica, or an idle prewarmed container
                continue
            try:
                info = self._read_info(container)
                ip = self._ip(container)
            except (docker.errors.DockerException, RuntimeError, KeyError, ValueError) as exc:
                log.warning("cannot take back container %s (%s): removing it", container.name,
                            exc)
                self.remove(container.id)
                continue
            doc = info["spec"]
            spec = ReplicaSpec(**{**doc, "peers": tuple(tuple(p) for p in doc["peers"])})
            process = ContainerProcess(container.id, container.attrs["State"]["Pid"])
            replica = LaunchedReplica(spec, process.pid, ip, info["ports"], spec.raft_address,
                                      role == "prewarm", None, process,
                                      started_unix=info.get("started_unix", time.time()))
            self._track(container, replica, process)
            recovered.append((replica, ResourceSpec(*info["resources"])))
        return recovered

    def _read_info(self, container: Any) -> dict[str, Any]:
        stream, _ = container.get_archive(INFO_FILE)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.getmembers()[0]
            data = tar.extractfile(member)
            assert data is not None
            return json.loads(data.read())

    def close(self) -> None:
        """Stop watching; remove the prewarmed containers still waiting (and wait for the
        starts under way: each removes its own container once it sees the launcher closed), so
        that a stopped Local Scheduler leaves no container behind."""
        with self._lock:
            self._closed.set()
            if not self._idle.wait_for(lambda: self._starts == 0, timeout=CLOSE_WAIT_S):
                log.warning("%d container start(s) still under way after %.0f s; removing "
                            "what is there", self._starts, CLOSE_WAIT_S)
            waiting = [cid for cid, t in self._tracked.items() if t.replica is None]
        for container_id in waiting:
            self.forget(container_id)
            self.remove(container_id)
        self._sweep()
        events = self._events
        if events is not None:
            try:
                events.close()
            except Exception:  # noqa: BLE001 - closing a stream that already broke
                pass
        self._removals.shutdown(wait=True)

    def _sweep(self) -> None:
        """Remove every container of this host still there once its replicas were stopped: one
        whose launch was under way while the Local Scheduler stopped (a kernel started just
        before `docker compose down`) would otherwise outlive it."""
        try:
            left = self.client.containers.list(
                all=True, filters={"label": f"{LABEL_HOST}={self.host_id}"})
        except docker.errors.DockerException as exc:
            log.warning("cannot list this host's containers to remove them: %s", exc)
            return
        for container in left:
            log.info("removing container %s, left after the replicas were stopped",
                     container.name)
            self.forget(container.id)
            self.remove(container.id)

    # -- exits ------------------------------------------------------------------------------

    def _watch_events(self) -> None:
        """Follow the engine's ``die`` events of this host's containers; after a broken stream,
        check every tracked container, so that no exit goes unreported."""
        filters = {"type": "container", "event": ["die"], "label": [f"{LABEL_HOST}={self.host_id}"]}
        while not self._closed.is_set():
            try:
                self._events = self.client.events(decode=True, filters=filters, since=self._since)
                for event in self._events:
                    self._since = int(event.get("time", time.time()))
                    attrs = event.get("Actor", {}).get("Attributes", {})
                    try:
                        code = int(attrs.get("exitCode", -1))
                    except ValueError:
                        code = -1
                    self._handle_exit(event.get("id") or event.get("Actor", {}).get("ID", ""), code)
            except Exception as exc:  # noqa: BLE001 - a broken stream is reopened
                if self._closed.is_set():
                    return
                log.warning("Docker event stream broke (%s); reopening", exc)
                self._closed.wait(1.0)
                self._reconcile()

    def _reconcile(self) -> None:
        with self._lock:
            ids = list(self._tracked)
        for container_id in ids:
            try:
                state = self.client.api.inspect_container(container_id)["State"]
            except docker.errors.NotFound:
                self._handle_exit(container_id, -1)
                continue
            except docker.errors.APIError:
                continue
            if not state.get("Running"):
                self._handle_exit(container_id, int(state.get("ExitCode", -1)))

    def _handle_exit(self, container_id: str, code: int) -> None:
        with self._lock:
            tracked = self._tracked.pop(container_id, None)
        if tracked is None:
            return
        tracked.process.mark_exited(code)
        if tracked.replica is not None:
            try:
                self.on_exit(tracked.replica, code)
            except Exception:  # noqa: BLE001 - a failing callback must not stop the watcher
                log.exception("exit callback failed for %s", tracked.replica.spec.owner)
        if not self._closed.is_set():
            self._removals.submit(self.remove, container_id)
        else:
            self.remove(container_id)
