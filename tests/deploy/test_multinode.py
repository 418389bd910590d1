"""docker-compose.yml as a Swarm stack on a real multi-node cluster of this machine: four Docker
engines in containers (notebookos.testing.multinode), one manager and three workers, the image
loaded into each with docker save/load. A notebook driven through JupyterLab's REST and websocket
API, its three replicas on three different nodes; then a whole worker node lost (its engine, its
Local Scheduler and every replica container on it, at once): the next cell sees the state the
previous cells left, and the kernel is back to three replicas on live nodes."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from notebook_check import ROOT

from notebookos.ports import free_ports
from notebookos.testing.deployment import output_text, run_cells, start_kernel, stop_kernel
from notebookos.testing.multinode import DockerCluster, node_image
from notebookos.testing.multinode_stack import MultiNodeStack

pytestmark = [pytest.mark.slow, pytest.mark.multinode, pytest.mark.timeout(1200)]

NODES = 4  # a kernel's 3 replicas on 3 nodes, and a 3rd live node for each after one is lost


@pytest.fixture(scope="module")
def stack(notebookos_image: str):
    start = time.monotonic()
    cluster = DockerCluster(node_image(ROOT))
    figures = {"node_image_s": time.monotonic() - start}
    stack = MultiNodeStack(ROOT, f"nbos{uuid.uuid4().hex[:6]}", notebookos_image,
                           free_ports(1)[0], cluster)
    try:
        try:
            figures.update(stack.bring_up(NODES))
        except Exception:
            print(stack.diagnostics())
            raise
        print("\nmulti-node cluster: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))
        yield stack
    finally:
        cluster.close()
        left = cluster.leftovers()
        assert not left, f"the cluster left {left}"


def wait_for_three_replicas(stack: MultiNodeStack, kernel_id: str, live: set[str],
                            timeout: float = 180) -> dict[int, dict]:
    deadline = time.monotonic() + timeout
    while True:
        containers = stack.replica_containers(kernel_id)
        replicas = {r["replica_id"]: r["host_id"] for r in stack.kernel(kernel_id)["replicas"]}
        nodes = {c["node"] for c in containers.values()}
        if len(containers) == 3 and len(nodes) == 3 and nodes <= live \
                and replicas == {rid: c["host_id"] for rid, c in containers.items()}:
            return containers
        if time.monotonic() > deadline:
            raise AssertionError(f"not back to 3 replicas on live nodes: {containers} {replicas}")
        time.sleep(1)


def test_notebook_across_nodes_keeps_its_state_through_a_lost_node(stack: MultiNodeStack) -> None:
    try:
        check_notebook_through_node_loss(stack)
    except Exception:
        print(stack.diagnostics())  # what the services said, before the cluster goes
        raise


def check_notebook_through_node_loss(stack: MultiNodeStack) -> None:
    services = stack.services()
    assert services[f"{stack.project}_ls"] == ("global", f"{NODES}/{NODES}"), services
    assert services[f"{stack.project}_ls-extra"][1].startswith("0/0"), services
    for service in ("gs", "jupyterlab", "redis", "s3"):
        assert [node for node, _ in stack.tasks(service)] == [stack.manager.name], service
    hosts = {h["id"] for h in stack.status()["hosts"]}
    assert hosts == set(stack.cluster.nodes), hosts  # one Local Scheduler per node, named after it

    port, token = stack.jupyter_port, stack.token()
    kernel_id = asyncio.run(start_kernel(port, token))
    first = asyncio.run(run_cells(port, token, kernel_id, [
        "import os\nx = 41\nxs = [1, 2]",
        "xs.append(3)\nprint(x, os.getuid())",
    ]))
    assert [r["reply"]["status"] for r in first] == ["ok", "ok"], first
    assert output_text(first[1]).split() == ["41", "1000"], first

    containers = stack.replica_containers(kernel_id)
    assert len(containers) == 3, containers
    assert len({c["node"] for c in containers.values()}) == 3, containers  # 3 nodes
    assert all(c["host_id"] == c["node"] for c in containers.values()), containers
    kernel = stack.kernel(kernel_id)
    assert {r["replica_id"]: r["host_id"] for r in kernel["replicas"]} == \
        {rid: c["host_id"] for rid, c in containers.items()}
    # the first start attempt made them: a prewarmed container that cannot be renamed on the
    # overlay network is replaced by a cold one, not a failed attempt (replicas 4-6)
    assert set(containers) == {1, 2, 3}, containers

    # the whole node of a replica lost: the executor's, unless that is the manager
    executor = kernel["executor"]
    on_workers = [rid for rid, c in containers.items() if c["node"] != stack.manager.name]
    victim_rid = executor if executor in on_workers else on_workers[0]
    victim = stack.cluster.nodes[containers[victim_rid]["node"]]
    lost_at = time.monotonic()
    stack.cluster.kill_node(victim)
    after = asyncio.run(run_cells(port, token, kernel_id, ["x + 1, xs"]))
    next_cell_s = time.monotonic() - lost_at
    assert after[0]["reply"]["status"] == "ok", after
    assert output_text(after[0]).strip() == "(42, [1, 2, 3])", after

    live = set(stack.cluster.nodes) - {victim.name}
    back = wait_for_three_replicas(stack, kernel_id, live)
    three_replicas_s = time.monotonic() - lost_at
    print(f"\nnode {victim.name} lost (replica {victim_rid}, executor {executor}): next cell in "
          f"{next_cell_s:.1f} s, three replicas on live nodes after {three_replicas_s:.1f} s "
          f"({sorted(c['node'] for c in back.values())})")
    again = asyncio.run(run_cells(port, token, kernel_id, ["x += 1\nx, len(xs)"]))
    assert output_text(again[0]).strip() == "(42, 3)", again

    asyncio.run(stop_kernel(port, token, kernel_id))
    deadline = time.monotonic() + 60
    while stack.replica_containers(kernel_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not stack.replica_containers(kernel_id)
