"""The ansible playbook deploys NotebookOS to a fleet over SSH: three Docker engines in containers
of this machine (notebookos.testing.multinode), each with an SSH server reached at its address on
the cluster's bridge, and nothing else done to them (no swarm, no image, no stack: the harness's
own deployment is not used). ansible/site.yml in swarm mode with an inventory of those nodes (the
first the control node, all three GPU nodes: a kernel's three replicas need three Local
Schedulers) makes the swarm, copies the image's `docker save` archive to each node and loads it,
deploys the stack and hands the manager's TLS files to the other nodes; JupyterLab on the manager
then answers with the three nodes registered and passes the notebook check, and a second run of
the playbook changes nothing on any host."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import yaml
from ansible_run import playbook
from notebook_check import ROOT, check_notebook, stop_and_check_removed

from notebookos.ports import free_ports
from notebookos.testing.deployment import run
from notebookos.testing.multinode import DockerCluster, node_image
from notebookos.testing.multinode_stack import MultiNodeStack

pytestmark = [pytest.mark.slow, pytest.mark.multinode, pytest.mark.timeout(1800)]

NODES = 3


@pytest.fixture(scope="module")
def fleet(notebookos_image: str):
    """Three bare nodes reachable over SSH, and the stack object that will look at what the
    playbook deploys on them. The finalizer removes every container, volume and network the
    cluster made (the playbook's swarm and stack live inside the nodes)."""
    start = time.monotonic()
    cluster = DockerCluster(node_image(ROOT))
    figures = {"node_image_s": time.monotonic() - start}
    stack = MultiNodeStack(ROOT, f"nbosans{uuid.uuid4().hex[:6]}", notebookos_image,
                           free_ports(1)[0], cluster)
    try:
        start = time.monotonic()
        cluster.create_network()
        cluster.enable_ssh()
        manager = cluster.add_node(publish=[stack.jupyter_port])
        for _ in range(NODES - 1):
            cluster.add_node()
        cluster.use_manager(manager)
        figures["nodes_s"] = time.monotonic() - start
        yield stack, figures
    finally:
        cluster.close()
        left = cluster.leftovers()
        assert not left, f"the cluster left {left}"


def write_inventory(stack: MultiNodeStack, path: Path) -> None:
    cluster = stack.cluster
    hosts = {n.name: {"ansible_host": n.address} for n in cluster.nodes.values()}
    path.write_text(yaml.safe_dump({"notebookos": {
        "vars": {
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(cluster.enable_ssh()),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={cluster.known_hosts} "
                                       "-o StrictHostKeyChecking=yes",
            # ansible's default adds -C: zlib over the 1.8 GB image archive made the copy
            # CPU-bound (3 MB/s per node here); on a LAN it only costs
            "ansible_ssh_args": "-o ControlMaster=auto -o ControlPersist=60s",
            "ansible_python_interpreter": "/usr/bin/python3",
        },
        "children": {
            "notebookos_control": {"hosts": {stack.manager.name: hosts[stack.manager.name]}},
            "notebookos_gpu": {"hosts": hosts},
        }}}))


def test_playbook_deploys_a_swarm_over_ssh_then_changes_nothing(
        fleet: tuple[MultiNodeStack, dict[str, float]], image_torch: str, tmp_path: Path) -> None:
    stack, figures = fleet
    start = time.monotonic()
    archive = stack.cluster.work_dir / "image.tar"  # removed with the cluster
    run(["docker", "save", "-o", str(archive), stack.image], timeout=1800)
    figures["docker_save_s"] = time.monotonic() - start

    inventory = tmp_path / "inventory.yml"
    write_inventory(stack, inventory)
    extra = tmp_path / "vars.yml"
    extra.write_text(yaml.safe_dump({
        "notebookos_deploy_mode": "swarm",
        "notebookos_image": stack.image,
        "notebookos_image_torch": image_torch,
        "notebookos_image_source": "load",
        "notebookos_image_archive": str(archive),
        "notebookos_project": stack.project,
        "notebookos_deploy_jupyter_port": stack.jupyter_port,
        "notebookos_deploy_s3_secret_key": uuid.uuid4().hex,  # nothing into ansible/credentials
    }))
    try:
        start = time.monotonic()
        out, recap = playbook(inventory, extra)
        figures["playbook_first_s"] = time.monotonic() - start
        assert set(recap) == set(stack.cluster.nodes), out[-3000:]
        for host, counts in recap.items():
            assert counts["failed"] == 0 and counts["unreachable"] == 0, (host, counts)
            assert counts["changed"] > 0, (host, counts)
        for node in stack.cluster.nodes.values():  # the image went in, its archive went away
            assert node.run("image", "inspect", stack.image, check=False).returncode == 0
        listing = run([*stack.cluster.ssh_argv(stack.manager), "ls", "/opt/notebookos"]).stdout
        assert "image-id" in listing.split() and "image.tar" not in listing, listing

        start = time.monotonic()
        stack.wait_for_jupyterlab(timeout=300)
        stack.wait_for_hosts(NODES)
        stack.wait_for_services()
        figures["stack_usable_s"] = time.monotonic() - start
        swarm = stack.cluster.swarm_nodes()
        assert sorted(swarm) == sorted(stack.cluster.nodes), swarm
        assert all(status == "Ready" for status, _ in swarm.values()), swarm
        services = stack.services()
        assert services[f"{stack.project}_ls"] == ("global", f"{NODES}/{NODES}"), services
        for service in ("gs", "jupyterlab", "redis", "s3"):
            assert [node for node, _ in stack.tasks(service)] == [stack.manager.name], service
        hosts = {h["id"] for h in stack.status()["hosts"]}
        assert hosts == set(stack.cluster.nodes), hosts  # a Local Scheduler per node

        start = time.monotonic()
        kernel_id = check_notebook(stack)
        stop_and_check_removed(stack, kernel_id)
        figures["notebook_check_s"] = time.monotonic() - start

        start = time.monotonic()
        out, recap = playbook(inventory, extra)
        figures["playbook_second_s"] = time.monotonic() - start
        assert set(recap) == set(stack.cluster.nodes), out[-3000:]
        for host, counts in recap.items():
            assert counts["changed"] == 0 and counts["failed"] == 0, (host, counts, out[-6000:])
    except Exception:
        print(stack.diagnostics())  # what the services said, before the cluster goes
        raise
    finally:
        print("\nansible on a multi-node cluster: "
              + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))
