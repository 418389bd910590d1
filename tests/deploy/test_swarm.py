"""The same docker-compose.yml as a Swarm stack: `docker swarm init` on this machine (loopback
only), `docker stack deploy`, the notebook check, then the stack removed and the swarm left."""

from __future__ import annotations

import time
import uuid

import pytest
from notebook_check import ROOT, check_notebook, stop_and_check_removed

from notebookos.ports import free_ports
from notebookos.testing.deployment import SwarmDeployment, run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def swarm(notebookos_image: str):
    state = run(["docker", "info", "--format", "{{.Swarm.LocalNodeState}}"]).stdout.strip()
    if state != "inactive":
        pytest.fail(f"this Docker engine is already in a swarm ({state}); the test makes its own")
    run(["docker", "swarm", "init", "--advertise-addr", "127.0.0.1",
         "--listen-addr", "127.0.0.1:2377"])
    dep = SwarmDeployment(ROOT, f"nbosswarm{uuid.uuid4().hex[:6]}", notebookos_image,
                          free_ports(1)[0])
    try:
        start = time.monotonic()
        dep.deploy()
        dep.wait_for_jupyterlab(timeout=300)
        dep.wait_for_hosts(3)
        dep.wait_for_services()
        print(f"\nstack deploy to a usable JupyterLab with 3 hosts: {time.monotonic() - start:.1f} s")
        yield dep
    finally:
        dep.remove()
        volumes = run(["docker", "volume", "ls", "-q", "--filter",
                       f"label=com.docker.stack.namespace={dep.project}"]).stdout.split()
        if volumes:
            run(["docker", "volume", "rm", *volumes], check=False)
        run(["docker", "swarm", "leave", "--force"], check=False)
        # the bridge that swarm init made for the node; nothing else uses it here
        run(["docker", "network", "rm", "docker_gwbridge"], check=False)


def test_stack_deploy_runs_a_notebook_in_replica_containers(swarm: SwarmDeployment) -> None:
    services = swarm.services()
    assert services[f"{swarm.project}_ls"] == ("global", "1/1"), services
    assert services[f"{swarm.project}_ls-extra"] == ("replicated", "2/2"), services
    network = run(["docker", "network", "inspect", f"{swarm.project}_cluster", "--format",
                   "{{.Driver}} {{.Attachable}}"]).stdout.split()
    assert network == ["overlay", "true"], network
    kernel_id = check_notebook(swarm)
    stop_and_check_removed(swarm, kernel_id)
