"""A real multi-node Docker cluster on this one machine, for the deployment tests and the node-fault
benchmark: N Docker engines, each a privileged container of this machine's engine running Debian's
dockerd (scripts/node-image.sh) with its own data root (a volume of the outer engine, so its
overlay2 works) and its own address on a bridge network made for the cluster; joined into a swarm
over those addresses (the first node the manager, the others workers); an image carried into each
with ``docker save`` / ``docker load`` (no registry). All traffic stays between those containers.

The harness drives every engine through the docker CLI on a second socket of that engine, in a
folder of this machine (``Node.docker``). ``close()`` removes every container, volume, network and
folder it made, whatever state the cluster is in (a test's finalizer)."""

from __future__ import annotations

import ipaddress
import json
import random
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from notebookos.testing.deployment import run

LABEL = "notebookos.multinode"
# What a nested engine needs. Not --privileged: that asks for CAP_SYS_RESOURCE too, which an engine
# that itself runs in a container without it cannot give ("unable to apply caps"); the node's
# entrypoint makes /sys and the cgroup hierarchies writable instead (scripts/node-entrypoint.sh).
NODE_PRIVILEGES = ("--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
                   "--security-opt", "apparmor=unconfined", "--security-opt", "seccomp=unconfined",
                   "--security-opt", "systempaths=unconfined")


def node_image(root: Path) -> str:
    """Build (or reuse) the node image; returns its tag."""
    return run([str(root / "scripts" / "node-image.sh")], timeout=1800).stdout.strip()


@dataclass
class Node:
    name: str  # the container's name, its hostname, the swarm node's name, its Local Scheduler's host id
    address: str  # on the cluster's bridge
    socket_dir: Path

    @property
    def docker(self) -> list[str]:
        """The docker CLI of this node's engine."""
        return ["docker", "-H", f"unix://{self.socket_dir}/docker.sock"]

    def run(self, *args: str, check: bool = True, timeout: float = 600,
            input_path: Path | None = None) -> subprocess.CompletedProcess:
        if input_path is None:
            return run([*self.docker, *args], check=check, timeout=timeout)
        with open(input_path, "rb") as stdin:
            proc = subprocess.run([*self.docker, *args], stdin=stdin, capture_output=True,
                                  timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)} on {self.name} failed: "
                               f"{proc.stderr.decode()[-2000:]}")
        return subprocess.CompletedProcess(proc.args, proc.returncode,
                                           proc.stdout.decode(), proc.stderr.decode())


class DockerCluster:
    """Docker engines in containers of this machine's engine, on a bridge of their own."""

    def __init__(self, node_image_tag: str, prefix: str | None = None) -> None:
        self.image = node_image_tag
        self.prefix = prefix or f"nbosmn{uuid.uuid4().hex[:6]}"
        self.network = f"{self.prefix}-net"
        self.nodes: dict[str, Node] = {}
        self.work_dir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-"))
        self._count = 0
        self._gateway = ""
        self._manager = ""

    # -- the bridge and the nodes --------------------------------------------------------------

    def create_network(self) -> None:
        """A bridge in 10.200-250.x.0/24 (away from the nested engines' 172.x bridges and the
        swarm's 10.0.x.0/24 overlays); another subnet when one is taken."""
        last: Exception | None = None
        for _ in range(10):
            subnet = ipaddress.ip_network(f"10.{random.randint(200, 250)}.{random.randint(0, 255)}.0/24")
            proc = run(["docker", "network", "create", "--driver", "bridge", "--subnet", str(subnet),
                        "--label", f"{LABEL}={self.prefix}", self.network], check=False)
            if proc.returncode == 0:
                self._gateway = str(next(subnet.hosts()))
                return
            last = RuntimeError(proc.stderr)
        raise RuntimeError(f"no free subnet for the cluster's bridge: {last}")

    def add_node(self, publish: Sequence[int] = (), timeout: float = 120) -> Node:
        """Start one more engine (not yet in the swarm); ``publish``: ports of the node published
        on this machine's 127.0.0.1 at the same number."""
        self._count += 1
        name = f"{self.prefix}-node{self._count}"
        socket_dir = self.work_dir / name
        socket_dir.mkdir()
        argv = ["docker", "run", "-d", *NODE_PRIVILEGES, "--name", name, "--hostname", name,
                "--network", self.network, "--label", f"{LABEL}={self.prefix}",
                "--mount", f"type=volume,source={name}-data,target=/var/lib/docker,"
                           f"volume-label={LABEL}={self.prefix}",
                "-v", f"{socket_dir}:/run/nbos-node"]
        for port in publish:
            argv += ["-p", f"127.0.0.1:{port}:{port}"]
        run([*argv, self.image])
        address = run(["docker", "inspect", "--format",
                       f"{{{{(index .NetworkSettings.Networks \"{self.network}\").IPAddress}}}}",
                       name]).stdout.strip()
        node = Node(name, address, socket_dir)
        self.nodes[name] = node
        deadline = time.monotonic() + timeout
        while node.run("info", check=False, timeout=30).returncode != 0:
            if time.monotonic() > deadline:
                logs = run(["docker", "logs", "--tail", "30", name], check=False)
                raise TimeoutError(f"the engine of {name} did not start: {logs.stderr[-3000:]}")
            time.sleep(0.5)
        return node

    # -- the swarm -----------------------------------------------------------------------------

    @property
    def manager(self) -> Node:
        return self.nodes[self._manager]

    def init_swarm(self, manager: Node) -> None:
        manager.run("swarm", "init", "--advertise-addr", manager.address,
                    "--listen-addr", f"{manager.address}:2377")
        self._manager = manager.name

    def join(self, node: Node) -> None:
        token = self.manager.run("swarm", "join-token", "-q", "worker").stdout.strip()
        node.run("swarm", "join", "--token", token, "--advertise-addr", node.address,
                 f"{self.manager.address}:2377")

    def swarm_nodes(self) -> dict[str, tuple[str, str]]:
        """node name -> (status, availability), as the manager sees them."""
        out = self.manager.run("node", "ls", "--format",
                               "{{.Hostname}} {{.Status}} {{.Availability}}").stdout
        return {n: (s, a) for n, s, a in (line.split() for line in out.splitlines() if line)}

    def wait_for_swarm(self, ready: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            nodes = self.swarm_nodes()
            if sum(1 for s, _ in nodes.values() if s == "Ready") >= ready:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{ready} swarm nodes not ready within {timeout:g}s: {nodes}")
            time.sleep(0.5)

    # -- the image -----------------------------------------------------------------------------

    def load_image(self, image: str, nodes: Sequence[Node] | None = None) -> float:
        """``docker save`` the image of this machine once, ``docker load`` it into each node
        (two at a time); returns the seconds it took."""
        start = time.monotonic()
        archive = self.work_dir / "image.tar"
        if not archive.exists():
            run(["docker", "save", "-o", str(archive), image], timeout=1800)
        targets = list(nodes if nodes is not None else self.nodes.values())
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda n: n.run("load", "-q", timeout=1800, input_path=archive),
                          targets))
        return time.monotonic() - start

    # -- faults --------------------------------------------------------------------------------

    def kill_node(self, node: Node) -> None:
        """The whole host lost: its engine and every container on it, at once (SIGKILL of the
        node container: every process of its PID namespace dies with its init)."""
        run(["docker", "kill", node.name])

    def cut_network(self, node: Node) -> None:
        """The node's link down: nothing in or out of its namespace."""
        run(["docker", "exec", node.name, "ip", "link", "set", "eth0", "down"])

    def restore_network(self, node: Node) -> None:
        """The link up again, with the default route the kernel dropped with it."""
        run(["docker", "exec", node.name, "ip", "link", "set", "eth0", "up"])
        run(["docker", "exec", node.name, "ip", "route", "replace", "default", "via",
             self._gateway])

    # -- everything gone -----------------------------------------------------------------------

    def close(self) -> None:
        """Remove every container, volume and network of this cluster and its folder. Each
        step goes on when another failed."""
        for kind in ("container", "volume"):
            argv = ["docker", kind, "ls", "-q", "--filter", f"label={LABEL}={self.prefix}"]
            if kind == "container":
                argv.insert(3, "-a")
            names = run(argv, check=False).stdout.split()
            if names:
                rm = ["docker", kind, "rm", "-f", *names]
                if kind == "container":
                    rm.insert(3, "-v")
                run(rm, check=False, timeout=600)
        run(["docker", "network", "rm", self.network], check=False)
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def leftovers(self) -> dict[str, list[str]]:
        found = {}
        for kind in ("container", "volume", "network"):
            argv = ["docker", kind, "ls", "-q", "--filter", f"label={LABEL}={self.prefix}"]
            if kind == "container":
                argv.insert(3, "-a")
            found[kind] = run(argv, check=False).stdout.split()
        return {k: v for k, v in found.items() if v}


def inspect(node: Node, *names: str) -> list[dict]:
    return json.loads(node.run("inspect", *names).stdout)
