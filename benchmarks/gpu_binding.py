"""Dynamic GPU binding's cost: a notebook's model and Adam optimizer moved to the cell's GPU and
back by ``bound_gpus`` (what the executor replica does around every GPU cell), against the same
objects moved with plain ``module.to`` and per-tensor ``.to`` in the same run (the baseline: what a
user's own code would pay to move them). Needs CUDA.

    python benchmarks/gpu_binding.py --sizes-mib 16 256 1024 --json binding.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from notebookos.testing import smoke

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def notebook_state(torch, size_mib: int) -> dict:
    """A model of about ``size_mib`` of float32 parameters with Adam's two moments filled in."""
    width = 2048
    layers = max(1, size_mib * 2**20 // (4 * width * width))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, width)).sum().backward()
    opt.step()
    return {"model": model, "opt": opt, "features": torch.randn(1024, width)}


def state_bytes(torch, ns: dict) -> int:
    params = [p for p in ns["model"].parameters()]
    moments = [t for p in params for t in ns["opt"].state[p].values() if torch.is_tensor(t)]
    grads = [p.grad for p in params if p.grad is not None]
    return sum(t.numel() * t.element_size() for t in [*params, *moments, *grads, ns["features"]])


def plain_round_trip(torch, ns: dict, device: str) -> tuple[float, float]:
    """The baseline: module.to, each optimizer state tensor and the features moved by hand."""
    def move(target: str) -> None:
        ns["model"].to(target)
        for state in ns["opt"].state.values():
            for key, value in state.items():
                if torch.is_tensor(value) and value.dim() > 0:
                    state[key] = value.to(target)
        ns["features"] = ns["features"].to(target)

    t0 = time.perf_counter()
    move(device)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    move("cpu")
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def bound_round_trip(torch, ns: dict) -> tuple[float, float]:
    from notebookos.kernel.gpu_binding import bound_gpus

    t0 = time.perf_counter()
    with bound_gpus(ns, [0]):
        torch.cuda.synchronize()
        t1 = time.perf_counter()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mib", type=int, nargs="+", default=[16, 256, 1024])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = smoke.parse_args(ap, sizes_mib=[4], repeats=1)
    try:
        import torch
    except ImportError:
        print("gpu_binding benchmark skipped: torch is not installed", file=sys.stderr)
        return
    if not torch.cuda.is_available():
        print("gpu_binding benchmark skipped: it needs CUDA", file=sys.stderr)
        return
    torch.zeros(1, device="cuda:0")  # the CUDA context, outside the timings
    rows = []
    for size in args.sizes_mib:
        ns = notebook_state(torch, size)
        moved = state_bytes(torch, ns)
        plain = [plain_round_trip(torch, ns, "cuda:0") for _ in range(args.repeats)]
        bound = [bound_round_trip(torch, ns) for _ in range(args.repeats)]
        row = {"model_mib": size, "moved_mib": round(moved / 2**20, 1)}
        for name, runs in (("plain", plain), ("bound", bound)):
            row[f"{name}_to_gpu_ms"] = round(statistics.median(r[0] for r in runs) * 1000, 2)
            row[f"{name}_to_host_ms"] = round(statistics.median(r[1] for r in runs) * 1000, 2)
        row["to_gpu_ratio"] = round(row["bound_to_gpu_ms"] / row["plain_to_gpu_ms"], 2)
        row["to_host_ratio"] = round(row["bound_to_host_ms"] / row["plain_to_host_ms"], 2)
        row["bound_gib_per_s_each_way"] = round(
            2 * moved / 2**30 / ((row["bound_to_gpu_ms"] + row["bound_to_host_ms"]) / 1000), 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
        del ns
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
