"""The project's docker-compose.yml as a Swarm stack across a multi-node cluster of this machine
(notebookos.testing.multinode): Global Scheduler, JupyterLab, Redis and S3 on the manager, one
Local Scheduler per node (the `ls` service's global mode; no `ls-extra`), JupyterLab published on
this machine's 127.0.0.1 through the manager node's container. The compose file is deployed as it
is, with the settings docs/deployment.md gives for a fleet (overlay network, no extra hosts)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from notebookos.testing.deployment import SwarmDeployment
from notebookos.testing.multinode import DockerCluster, Node


class MultiNodeStack(SwarmDeployment):
    def __init__(self, root: Path, project: str, image: str, jupyter_port: int,
                 cluster: DockerCluster, env: dict[str, str] | None = None) -> None:
        super().__init__(root, project, image, jupyter_port,
                         {"NOTEBOOKOS_NETWORK_DRIVER": "overlay", "NOTEBOOKOS_EXTRA_HOSTS": "0",
                          **(env or {})})
        self.cluster = cluster

    @property
    def manager(self) -> Node:
        return self.cluster.manager

    def live_nodes(self) -> list[Node]:
        """The nodes whose engine answers."""
        return [n for n in self.cluster.nodes.values()
                if n.run("version", "--format", "{{.Server.Version}}", check=False,
                         timeout=10).returncode == 0]

    # -- the stack -----------------------------------------------------------------------------

    def bring_up(self, nodes: int) -> dict[str, float]:
        """Start ``nodes`` engines (the first the manager, publishing JupyterLab's port on this
        machine's 127.0.0.1) with the image, join them into a swarm, deploy the stack
        and wait until it is usable with a Local Scheduler on every node. Returns the seconds
        each step took. The caller closes the cluster, also when this raises."""
        figures = {}
        self.cluster.create_network()
        figures["image_seed_s"] = self.cluster.seed_image(self.image)
        start = time.monotonic()
        manager = self.cluster.add_node(publish=[self.jupyter_port])
        workers = [self.cluster.add_node() for _ in range(nodes - 1)]
        self.cluster.init_swarm(manager)
        for worker in workers:
            self.cluster.join(worker)
        self.cluster.wait_for_swarm(nodes)
        figures["engines_and_swarm_s"] = time.monotonic() - start
        if not self.cluster.seeded:
            figures["image_load_s"] = self.cluster.load_image(self.image)
        start = time.monotonic()
        self.deploy()
        self.wait_for_security()
        self.copy_security()
        self.wait_for_jupyterlab(timeout=300)
        self.wait_for_hosts(nodes)
        self.wait_for_services()
        figures["stack_deploy_s"] = time.monotonic() - start
        return figures

    def add_node(self) -> Node:
        """One more node joins the running swarm: the image loaded, the TLS files copied; the
        `ls` service's global mode starts its Local Scheduler."""
        node = self.cluster.add_node()
        if not self.cluster.seeded:
            self.cluster.load_image(self.image, [node])
        self.cluster.join(node)
        self.copy_security([node])
        return node

    def deploy(self) -> None:
        env = {**os.environ, **self.env}
        proc = subprocess.run(
            [*self.manager.docker, "stack", "deploy", "--resolve-image", "never", "--prune",
             "-c", str(self.root / "docker-compose.yml"), self.project],
            capture_output=True, text=True, env=env, cwd=self.root, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"stack deploy failed: {proc.stdout}\n{proc.stderr}")

    def remove(self, timeout: float = 120) -> None:
        self.manager.run("stack", "rm", self.project, check=False)

    def services(self) -> dict[str, tuple[str, str]]:
        out = self.manager.run("stack", "services", self.project, "--format",
                               "{{.Name}} {{.Mode}} {{.Replicas}}").stdout
        return {name: (mode, replicas) for name, mode, replicas, *_ in
                (line.split() for line in out.splitlines() if line.strip())}

    def tasks(self, service: str) -> list[tuple[str, str]]:
        """(node, current state) of the service's tasks that should run."""
        out = self.manager.run("service", "ps", f"{self.project}_{service}", "--filter",
                               "desired-state=running", "--format",
                               "{{.Node}}|{{.CurrentState}}").stdout
        return [tuple(line.split("|", 1)) for line in out.splitlines() if "|" in line]

    # -- the cluster's TLS files on every node ----------------------------------------------------

    def wait_for_security(self, timeout: float = 300) -> None:
        """Until the Global Scheduler has made the cluster's TLS files in the manager's
        ``<project>_security`` volume."""
        deadline = time.monotonic() + timeout
        while self._security_archive() is None:
            if time.monotonic() > deadline:
                raise TimeoutError("the Global Scheduler made no TLS files")
            time.sleep(1)

    def _security_archive(self) -> bytes | None:
        proc = subprocess.run(
            [*self.manager.docker, "run", "--rm", "--user", "root", "-v",
             f"{self.project}_security:/s", self.image, "sh", "-c",
             "test -s /s/join-token && tar -C /s -cf - ."],
            capture_output=True, timeout=120)
        return proc.stdout if proc.returncode == 0 and proc.stdout else None

    def copy_security(self, nodes: Sequence[Node] | None = None) -> None:
        """Copy the manager's TLS files into ``<project>_security`` on each other node (what
        docs/deployment.md tells an operator to do; a Local Scheduler without them exits and
        Swarm restarts it until they are there)."""
        archive = self._security_archive()
        if archive is None:
            raise RuntimeError("no TLS files on the manager yet")
        for node in nodes if nodes is not None else self.cluster.nodes.values():
            if node.name == self.manager.name:
                continue
            proc = subprocess.run(
                [*node.docker, "run", "--rm", "-i", "--user", "root", "-v",
                 f"{self.project}_security:/s", self.image, "tar", "-C", "/s", "-xf", "-"],
                input=archive, capture_output=True, timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(f"TLS files to {node.name}: {proc.stderr.decode()[-2000:]}")

    # -- containers, on whichever node they run ---------------------------------------------------

    def container_of(self, service: str) -> str:
        ids = self.manager.run("ps", "-q", "--filter",
                               f"label=com.docker.swarm.service.name={self.project}_{service}"
                               ).stdout.split()
        if not ids:
            raise RuntimeError(f"no running task of {self.project}_{service} on the manager")
        return ids[0]

    def exec(self, service: str, argv: Sequence[str], check: bool = True) -> str:
        return self.manager.run("exec", self.container_of(service), *argv, check=check).stdout

    def docker_of(self, container: dict) -> list[str]:
        return self.cluster.nodes[container["node"]].docker

    def replica_containers(self, kernel_id: str) -> dict[int, dict]:
        """replica id -> {name, host_id, id, node} of the kernel's running replica containers on
        the nodes that answer."""
        found = {}
        for node in self.live_nodes():
            out = node.run("ps", "--filter", f"name=nbos-{kernel_id}-r", "--format",
                           "{{.ID}} {{.Names}} {{.Label \"notebookos.host_id\"}}",
                           check=False, timeout=30).stdout
            for line in out.splitlines():
                cid, name, host = line.split()
                found[int(name.rsplit("-r", 1)[1])] = {"id": cid, "name": name, "host_id": host,
                                                        "node": node.name}
        return found

    def diagnostics(self, lines: int = 40) -> str:
        """The swarm's nodes and the last lines of each control service's log (for a failure's
        report; never raises)."""
        parts = []
        try:
            parts.append(self.manager.run("node", "ls", check=False, timeout=30).stdout)
            for service in ("gs", "jupyterlab", "ls"):
                proc = self.manager.run("service", "logs", "--timestamps", "--tail", str(lines),
                                        f"{self.project}_{service}", check=False, timeout=60)
                parts.append(f"== {service}\n{proc.stdout}{proc.stderr}")
        except Exception as exc:  # noqa: BLE001 - a report, best effort
            parts.append(f"(diagnostics stopped: {exc})")
        return "\n".join(parts)

    def kernel(self, kernel_id: str) -> dict:
        return next(k for k in self.status()["kernels"] if k["id"] == kernel_id)

