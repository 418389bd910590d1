"""A real multi-node Docker cluster on this one machine, for the deployment tests and the node-fault
benchmark: N Docker engines, each a privileged container of this machine's engine running Debian's
dockerd (scripts/node-image.sh) with its own data root (a volume of the outer engine, so its
overlay2 works) and its own address on a bridge network made for the cluster; joined into a swarm
over those addresses (the first node the manager, the others workers); an image carried into each
with ``docker save`` / ``docker load`` (no registry): loaded once into a seed data root whose
layers every node's data root then hard-links (seed_image). All traffic stays between those
containers.

The harness drives every engine through the docker CLI on a second socket of that engine, in a
folder of this machine (``Node.docker``). Each node also runs an SSH server: after
``enable_ssh()`` a throwaway key pair of the cluster's folder logs in as root on every node, at
the node's bridge address, with the nodes' host keys in a known_hosts file of that folder (what
the ansible playbook needs to deploy to the nodes as to VMs). ``close()`` removes every container, volume, network and
folder it made, whatever state the cluster is in (a test's finalizer)."""

from __future__ import annotations

import ipaddress
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
        self._seed = ""
        self._ssh_key: Path | None = None

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
        self._seed_volume(f"{name}-data")
        argv = ["docker", "run", "-d", *NODE_PRIVILEGES, "--name", name, "--hostname", name,
                "--network", self.network, "--label", f"{LABEL}={self.prefix}",
                "-v", f"{name}-data:/var/lib/docker",
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
        if self._ssh_key is not None:
            self._authorize(node)
        return node

    # -- SSH into the nodes ----------------------------------------------------------------------

    def enable_ssh(self) -> Path:
        """Make a key pair in the cluster's folder (once) and let it log in as root on every node,
        those running and those added later; returns the private key's path. The nodes' host keys
        go into ``known_hosts`` beside it."""
        if self._ssh_key is None:
            ssh_dir = self.work_dir / "ssh"
            ssh_dir.mkdir(mode=0o700)
            key = ssh_dir / "id_ed25519"
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{self.prefix}-harness",
                 "-f", str(key)])
            (ssh_dir / "known_hosts").touch(mode=0o600)
            self._ssh_key = key
            for node in self.nodes.values():
                self._authorize(node)
        return self._ssh_key

    @property
    def known_hosts(self) -> Path:
        assert self._ssh_key is not None, "enable_ssh() first"
        return self._ssh_key.parent / "known_hosts"

    def ssh_argv(self, node: Node) -> list[str]:
        """``ssh`` to the node as root with the cluster's key, checking its host key."""
        return ["ssh", "-i", str(self.enable_ssh()), "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{node.address}"]

    def _authorize(self, node: Node, timeout: float = 30) -> None:
        """The public key into the node's root account, its host key into known_hosts; waits
        until sshd takes the key."""
        assert self._ssh_key is not None
        public = self._ssh_key.with_suffix(".pub").read_text()
        subprocess.run(["docker", "exec", "-i", node.name, "sh", "-c",
                        "umask 077 && mkdir -p /root/.ssh && cat >> /root/.ssh/authorized_keys"],
                       input=public, text=True, check=True, capture_output=True, timeout=60)
        host_key = run(["docker", "exec", node.name, "cat",
                        "/etc/ssh/ssh_host_ed25519_key.pub"]).stdout.split()
        with open(self.known_hosts, "a") as known:
            known.write(f"{node.address} {host_key[0]} {host_key[1]}\n")
        deadline = time.monotonic() + timeout
        while True:
            proc = run([*self.ssh_argv(node), "-o", "ConnectTimeout=5", "true"], check=False,
                       timeout=30)
            if proc.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no SSH login to {node.name}: {proc.stderr[-2000:]}")
            time.sleep(0.5)

    # -- the swarm -----------------------------------------------------------------------------

    @property
    def manager(self) -> Node:
        return self.nodes[self._manager]

    def use_manager(self, manager: Node) -> None:
        """A swarm made by someone else (the ansible playbook) with this node its manager."""
        self._manager = manager.name

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
        """``docker save`` the image of this machine, ``docker load`` it into each node (two at
        a time); returns the seconds it took. Prefer seed_image before the nodes start."""
        start = time.monotonic()
        archive = self.work_dir / "image.tar"
        if not archive.exists():
            run(["docker", "save", "-o", str(archive), image], timeout=1800)
        targets = list(nodes if nodes is not None else self.nodes.values())
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda n: n.run("load", "-q", timeout=1800, input_path=archive),
                          targets))
        return time.monotonic() - start

    def seed_image(self, image: str) -> float:
        """Load the image once, into an engine of its own whose data root then seeds every node
        started after this (add_node): the image's layers hard-linked into the node's data root,
        not written again (a load of the 1.8 GB test image takes about a minute per node here,
        the disk being the limit; a linked copy a few seconds). Image layers are never written
        in place (overlayfs copies a file up into the container's own layer), so nodes can share
        their files. Where this machine cannot see the engine's volumes (a remote or rootless
        engine), nodes get no seed: call load_image after they start. Returns the seconds it
        took."""
        start = time.monotonic()
        seed = f"{self.prefix}-seed"
        run(["docker", "volume", "create", "--label", f"{LABEL}={self.prefix}", seed])
        if not Path(self._volume_path(seed)).is_dir():
            return time.monotonic() - start
        socket_dir = self.work_dir / "seed"
        socket_dir.mkdir()
        name = f"{self.prefix}-seeder"
        run(["docker", "run", "-d", *NODE_PRIVILEGES, "--name", name, "--network", "none",
             "--label", f"{LABEL}={self.prefix}", "-v", f"{seed}:/var/lib/docker",
             "-v", f"{socket_dir}:/run/nbos-node", self.image])
        seeder = Node(name, "", socket_dir)
        try:
            deadline = time.monotonic() + 120
            while seeder.run("info", check=False, timeout=30).returncode != 0:
                if time.monotonic() > deadline:
                    raise TimeoutError("the seed engine did not start")
                time.sleep(0.5)
            save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
            load = subprocess.run([*seeder.docker, "load", "-q"], stdin=save.stdout,
                                  capture_output=True, timeout=1800)
            assert save.stdout is not None
            save.stdout.close()
            if save.wait(timeout=60) != 0 or load.returncode != 0:
                raise RuntimeError(f"loading {image} into the seed: {load.stderr.decode()}")
            run(["docker", "stop", "-t", "30", name])  # a clean shutdown: a consistent data root
        finally:
            run(["docker", "rm", "-f", name], check=False)
        self._seed = seed
        return time.monotonic() - start

    @property
    def seeded(self) -> bool:
        """Whether nodes started now get the seed's image."""
        return bool(self._seed)

    def _volume_path(self, volume: str) -> str:
        return run(["docker", "volume", "inspect", "--format", "{{.Mountpoint}}",
                    volume]).stdout.strip()

    def _seed_volume(self, volume: str) -> None:
        """Create the node's data volume, its image store hard-linked from the seed's."""
        run(["docker", "volume", "create", "--label", f"{LABEL}={self.prefix}", volume])
        if not self._seed:
            return
        source, target = self._volume_path(self._seed), self._volume_path(volume)
        run(["cp", "-a", "--link", f"{source}/image", f"{source}/overlay2", f"{target}/"],
            timeout=600)

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
        for _ in range(5):  # a volume or the network still held by a container going away
            left = self.leftovers()
            if not left:
                break
            time.sleep(2)
            if left.get("volume"):
                run(["docker", "volume", "rm", "-f", *left["volume"]], check=False)
            if left.get("network"):
                run(["docker", "network", "rm", *left["network"]], check=False)
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def leftovers(self) -> dict[str, list[str]]:
        found = {}
        for kind in ("container", "volume", "network"):
            argv = ["docker", kind, "ls", "-q", "--filter", f"label={LABEL}={self.prefix}"]
            if kind == "container":
                argv.insert(3, "-a")
            found[kind] = run(argv, check=False).stdout.split()
        return {k: v for k, v in found.items() if v}

