"""Node faults on a real multi-node swarm of this machine (notebookos.testing.multinode: Docker
engines in containers, the compose file deployed as a stack across them), with one notebook driven
through JupyterLab's REST and websocket API. Each round, for each fault, a worker node holding one
of the notebook's replicas:

- ``node_lost``: the node's container SIGKILLed (its engine, its Local Scheduler and its replica
  containers gone at once); then a fresh node joins in its place (``node_added``: the time until
  its Local Scheduler registers with the Global Scheduler);
- ``network_cut``: the node's link down for --cut-s seconds, then up again;
- ``drain``: ``docker node update --availability drain`` of the node of the replica that runs
  the cells, while a 6 s cell runs there (Swarm stops the node's Local Scheduler with SIGTERM;
  it has the Global Scheduler migrate its replicas first, global_scheduler/host_drain.py), then
  active again. ``running_cell_ok``: that cell ended normally (it was neither failed nor run
  again: it counts its own runs).

For each: the next cell's latency from the fault (it must see the variables the previous cells
left: "nothing lost"), and the time until the kernel has three replicas on three live nodes.

    .venv/bin/python benchmarks/cluster_faults.py [--rounds 3] [--out bench-out/cluster_faults.json]

Needs a Docker engine (the image and the node image are built here: minutes the first time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

from notebookos.ports import free_ports
from notebookos.testing import smoke
from notebookos.testing.deployment import (
    build_image,
    docker_missing,
    output_text,
    run_cells,
    start_kernel,
    torch_choice,
)
from notebookos.testing.multinode import DockerCluster, Node, node_image
from notebookos.testing.multinode_stack import MultiNodeStack

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "notebookos:test"
FAULTS = ("node_lost", "network_cut", "drain")


def three_replicas_s(stack: MultiNodeStack, kernel_id: str, since: float,
                     exclude: str, timeout: float = 240) -> float:
    """Seconds from ``since`` until the kernel has 3 replica containers on 3 live nodes, none on
    ``exclude``, as the Global Scheduler sees them too."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        containers = stack.replica_containers(kernel_id)
        nodes = {c["node"] for c in containers.values()}
        try:
            replicas = {r["replica_id"]: r["host_id"]
                        for r in stack.kernel(kernel_id)["replicas"]}
        except (RuntimeError, StopIteration, json.JSONDecodeError):
            replicas = {}
        if len(containers) == 3 and len(nodes) == 3 and exclude not in nodes \
                and replicas == {rid: c["host_id"] for rid, c in containers.items()}:
            return time.monotonic() - since
        time.sleep(0.5)
    raise TimeoutError(f"not back to 3 replicas: {stack.replica_containers(kernel_id)}")


def victim(stack: MultiNodeStack, kernel_id: str) -> Node:
    containers = stack.replica_containers(kernel_id)
    executor = stack.kernel(kernel_id)["executor"]
    on_workers = {rid: c["node"] for rid, c in containers.items()
                  if c["node"] != stack.manager.name}
    return stack.cluster.nodes[on_workers.get(executor) or next(iter(on_workers.values()))]


def wait_registered(stack: MultiNodeStack, host: str, since: float, timeout: float = 240) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if any(h["id"] == host for h in stack.status()["hosts"]):
                return time.monotonic() - since
        except (RuntimeError, json.JSONDecodeError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{host} did not register")


def one_fault(stack: MultiNodeStack, kernel_id: str, fault: str, counter: int,
              cut_s: float) -> dict:
    port, token = stack.jupyter_port, stack.token()
    node = victim(stack, kernel_id)
    executor = stack.kernel(kernel_id)["executor"]
    result: dict = {"fault": fault, "node": node.name, "executor_there": any(
        rid == executor and c["node"] == node.name
        for rid, c in stack.replica_containers(kernel_id).items())}
    start = time.monotonic()
    if fault == "node_lost":
        stack.cluster.kill_node(node)
    elif fault == "network_cut":
        stack.cluster.cut_network(node)
    else:
        result["running_cell_ok"] = asyncio.run(_drain_during_a_cell(stack, node, kernel_id))
        start = time.monotonic()
    cell = asyncio.run(run_cells(port, token, kernel_id, ["n += 1\nn, len(xs)"]))
    result["next_cell_s"] = time.monotonic() - start
    if fault == "node_lost":  # how the Global Scheduler learned of it
        logs = stack.manager.run("service", "logs", "--tail", "80", f"{stack.project}_gs",
                                 check=False, timeout=60)
        result["gs_saw"] = [line.split(" - ", 1)[-1][-200:] for line in
                            (logs.stdout + logs.stderr).splitlines()
                            if any(w in line for w in ("keepalive", "does not answer",
                                                       "removed (", "resubmit"))][-6:]
    result["nothing_lost"] = cell[0]["reply"]["status"] == "ok" and \
        output_text(cell[0]).strip() == f"({counter + 1}, 3)"
    if fault == "network_cut":
        time.sleep(max(0.0, cut_s - (time.monotonic() - start)))
        stack.cluster.restore_network(node)
    result["three_replicas_s"] = three_replicas_s(stack, kernel_id, start, node.name)
    if fault == "node_lost":
        stack.manager.run("node", "rm", "--force", node.name, check=False)
        added = time.monotonic()
        new = stack.add_node()
        result["node_added_registered_s"] = wait_registered(stack, new.name, added)
    elif fault == "drain":
        stack.manager.run("node", "update", "--availability", "active", node.name)
        result["drained_back_registered_s"] = wait_registered(stack, node.name, start)
    return result


async def _drain_during_a_cell(stack: MultiNodeStack, node: Node, kernel_id: str) -> bool:
    """Drain ``node`` 2 s into a 6 s cell; whether that cell ended normally and was not run
    again (a second run, after the first was cut, would end 8 s or more after it was sent)."""
    port, token = stack.jupyter_port, stack.token()
    sent = time.monotonic()
    cell = asyncio.ensure_future(run_cells(port, token, kernel_id,
                                           ["import time\ntime.sleep(6)\n'slept'"]))
    await asyncio.sleep(2)
    await asyncio.to_thread(stack.manager.run, "node", "update", "--availability", "drain",
                            node.name)
    result = (await cell)[0]
    took = time.monotonic() - sent
    return (result["reply"]["status"] == "ok" and output_text(result).strip() == "'slept'"
            and took < 7.5)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=5, help="manager + workers (at least 4)")
    parser.add_argument("--cut-s", type=float, default=30.0)
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--out", type=Path)
    args = smoke.parse_args(parser, argv, rounds=1, faults="node_lost", nodes=4)
    reason = docker_missing(ROOT)
    if reason:
        print(f"skipped: {reason}")
        return 0
    start = time.monotonic()
    build_image(ROOT, IMAGE, torch_choice())
    cluster = DockerCluster(node_image(ROOT))
    figures = {"images_s": time.monotonic() - start}
    stack = MultiNodeStack(ROOT, f"nbosfault{uuid.uuid4().hex[:4]}", IMAGE, free_ports(1)[0],
                           cluster)
    results = []
    try:
        figures.update(stack.bring_up(args.nodes))
        print(json.dumps({k: round(v, 1) for k, v in figures.items()}), flush=True)
        port, token = stack.jupyter_port, stack.token()
        kernel_id = asyncio.run(start_kernel(port, token))
        asyncio.run(run_cells(port, token, kernel_id, ["n = 0\nxs = [1, 2, 3]"]))
        counter = 0
        for _ in range(args.rounds):
            for fault in args.faults.split(","):
                result = one_fault(stack, kernel_id, fault, counter, args.cut_s)
                counter += 1
                results.append(result)
                print(json.dumps({k: round(v, 2) if isinstance(v, float) else v
                                  for k, v in result.items()}), flush=True)
    finally:
        cluster.close()
    table = {}
    for fault in args.faults.split(","):
        rows = [r for r in results if r["fault"] == fault]
        cells = [r["next_cell_s"] for r in rows]
        backs = [r["three_replicas_s"] for r in rows]
        table[fault] = {"n": len(rows), "next_cell_p50_s": statistics.median(cells),
                        "next_cell_p99_s": percentile(cells, 0.99),
                        "three_replicas_p50_s": statistics.median(backs),
                        "three_replicas_p99_s": percentile(backs, 0.99),
                        "nothing_lost": all(r["nothing_lost"] for r in rows)}
        if fault == "drain":
            table[fault]["running_cell_ok"] = all(r["running_cell_ok"] for r in rows)
    added = [r["node_added_registered_s"] for r in results if "node_added_registered_s" in r]
    if added:
        table["node_added"] = {"n": len(added), "registered_p50_s": statistics.median(added)}
    print(json.dumps(table, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"setup": figures, "results": results, "table": table},
                                       indent=1))
    return 0 if all(r["nothing_lost"] and r.get("running_cell_ok", True)
                    for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
