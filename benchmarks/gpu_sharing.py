"""Two notebook executors on one GPU: slowdown of each (TensorShare's delta) and the latency of a
short interactive cell beside a long training (LithOS's HP/BE case), with and without MPS limits.

Each executor is its own process, started with the environment the Local Scheduler gives a replica
that shares a GPU (``notebookos.local_scheduler.sharing.replica_environment``:
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` when the host runs MPS). Phases, each measured over the
same wall-clock window in every process of the phase:

- ``alone``: one training loop on the GPU (the baseline of delta);
- ``pair``: two training loops time-sliced on the GPU (no MPS);
- ``pair-mps``: the same two under MPS, each limited to ``--share`` percent of the SMs;
- ``hp-alone``: short interactive cells alone (an evaluation of the model on one batch);
- ``hp+be``: the same cells beside a training loop, time-sliced;
- ``hp+be-mps``: the same under MPS, the training limited to ``--be-share`` percent.

delta = iteration rate alone / iteration rate shared (1.0: no slowdown). Needs CUDA; run with
``--device cpu --seconds 1`` to check the script itself on a machine without one.

    python benchmarks/gpu_sharing.py --json results.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from notebookos.testing import smoke

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


# -- the worker: one executor's loop --------------------------------------------------------------


def _model(torch, width: int):
    """A small CIFAR-style convolutional network (TensorShare's worst pairs were CIFAR models)."""
    nn = torch.nn

    def block(cin: int, cout: int) -> list:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(*block(3, width), *block(width, width), nn.MaxPool2d(2),
                         *block(width, 2 * width), *block(2 * width, 2 * width), nn.MaxPool2d(2),
                         *block(2 * width, 4 * width), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4 * width, 10))


def worker(kind: str, device: str, start_at: float, seconds: float, batch: int, width: int,
           gap_s: float) -> dict:
    import torch

    torch.manual_seed(0)
    dev = torch.device(device)
    model = _model(torch, width).to(dev).to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, 32, 32, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device=dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def train_step() -> None:
        with autocast:
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def interactive_cell() -> float:
        """What a short cell does: evaluate the model on one batch and print a number."""
        model.eval()
        with torch.no_grad(), autocast:
            accuracy = (model(x).argmax(1) == y).float().mean().item()
        model.train()
        return accuracy

    for _ in range(5):  # CUDA context, cuDNN autotuning, allocator warm-up
        train_step() if kind == "train" else interactive_cell()
    sync()
    while time.time() < start_at:
        time.sleep(min(0.01, max(0.0, start_at - time.time())))
    end = start_at + seconds
    iterations, latencies = 0, []
    while time.time() < end:
        if kind == "train":
            train_step()
            iterations += 1
            if iterations % 10 == 0:
                sync()
        else:
            t0 = time.perf_counter()
            interactive_cell()
            latencies.append(time.perf_counter() - t0)
            time.sleep(gap_s)  # think time between the user's cells
    sync()
    elapsed = time.time() - start_at
    return {"kind": kind, "iterations": iterations, "rate": iterations / elapsed,
            "latencies_ms": [round(v * 1000, 3) for v in latencies],
            "mps_share": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}


# -- MPS ------------------------------------------------------------------------------------------


class Mps:
    """The host's MPS control daemon for the duration of the MPS phases."""

    def __init__(self, workdir: Path) -> None:
        self.pipe_dir = workdir / "mps-pipe"
        self.log_dir = workdir / "mps-log"
        self.error = ""
        self.started = False

    def env(self) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
                "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def start(self) -> bool:
        exe = shutil.which("nvidia-cuda-mps-control")
        if exe is None:
            self.error = "nvidia-cuda-mps-control is not installed"
            return False
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([exe, "-d"], env={**os.environ, **self.env()},
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            self.error = f"nvidia-cuda-mps-control -d: {done.returncode} {done.stderr.strip()}"
            return False
        self.started = True
        return True

    def stop(self) -> None:
        if not self.started:
            return
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True,
                       env={**os.environ, **self.env()}, capture_output=True, timeout=30)
        self.started = False

    def log_tail(self) -> str:
        path = self.log_dir / "control.log"
        return path.read_text()[-2000:] if path.exists() else ""


# -- phases ---------------------------------------------------------------------------------------


def run_phase(name: str, members: list[tuple[str, dict[str, str]]], args: argparse.Namespace
              ) -> dict:
    """Start one worker per (kind, extra environment) and measure them over the same window."""
    start_at = time.time() + args.warmup_s
    procs = []
    for kind, extra in members:
        cmd = [sys.executable, __file__, "worker", "--kind", kind, "--device", args.device,
               "--start-at", repr(start_at), "--seconds", repr(args.seconds),
               "--batch", str(args.batch), "--width", str(args.width), "--gap-s", repr(args.gap_s)]
        procs.append(subprocess.Popen(cmd, env={**os.environ, **extra}, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=args.warmup_s + args.seconds + 120)
        if proc.returncode != 0:
            raise RuntimeError(f"phase {name}: worker failed ({proc.returncode}): {err[-2000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return {"phase": name, "workers": results}


def summarise(phases: dict[str, dict]) -> dict:
    def rate(phase: str, i: int) -> float:
        return max(phases[phase]["workers"][i]["rate"], 1e-9)  # no iteration: a huge delta

    def pct(phase: str, q: float) -> float:
        lat = sorted(next(w for w in phases[phase]["workers"] if w["kind"] == "interactive")
                     ["latencies_ms"])
        return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")

    out: dict = {"alone_rate": rate("alone", 0)}
    for phase in ("pair", "pair-mps"):
        if phase in phases:
            out[f"{phase}_delta"] = [round(out["alone_rate"] / rate(phase, i), 3) for i in (0, 1)]
    for phase in ("hp-alone", "hp+be", "hp+be-mps"):
        if phase in phases:
            out[f"{phase}_p50_ms"] = pct(phase, 0.5)
            out[f"{phase}_p99_ms"] = pct(phase, 0.99)
            be = [w for w in phases[phase]["workers"] if w["kind"] == "train"]
            if be:
                out[f"{phase}_be_delta"] = round(out["alone_rate"] / max(be[0]["rate"], 1e-9),
                                                 3)  # no iteration: a huge delta, as rate()
    if "hp-alone" in phases:
        for phase in ("hp+be", "hp+be-mps"):
            if phase in phases:
                out[f"{phase}_p99_vs_alone"] = round(
                    out[f"{phase}_p99_ms"] / out["hp-alone_p99_ms"], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command")
    w = sub.add_parser("worker")
    w.add_argument("--kind", choices=("train", "interactive"), required=True)
    w.add_argument("--start-at", type=float, required=True)
    for p in (ap, w):
        p.add_argument("--device", default="cuda:0")
        p.add_argument("--seconds", type=float, default=10.0)
        p.add_argument("--batch", type=int, default=256)
        p.add_argument("--width", type=int, default=64)
        p.add_argument("--gap-s", type=float, default=0.05)
    ap.add_argument("--warmup-s", type=float, default=20.0)
    ap.add_argument("--share", type=int, default=50, help="MPS percent per executor of a pair")
    ap.add_argument("--be-share", type=int, default=30, help="MPS percent of the training (BE)")
    ap.add_argument("--json", type=Path)
    args = smoke.parse_args(ap, seconds=1.0, warmup_s=1.0, batch=16, width=8)
    if args.command == "worker":
        print(json.dumps(worker(args.kind, args.device, args.start_at, args.seconds, args.batch,
                                args.width, args.gap_s)))
        return
    if args.device.startswith("cuda") and not _cuda():
        if not args.smoke:
            print("gpu_sharing benchmark skipped: it needs CUDA (or --device cpu)",
                  file=sys.stderr)
            return
        args.device = "cpu"  # the smoke run checks the code path, not the GPU

    from notebookos.local_scheduler.sharing import replica_environment

    def env(device_id: int, share: int | None, mps: Mps | None) -> dict[str, str]:
        extra = replica_environment(mps_percentage=share)
        return {**extra, **(mps.env() if mps else {})}

    phases: dict[str, dict] = {}
    phases["alone"] = run_phase("alone", [("train", env(0, None, None))], args)
    phases["pair"] = run_phase("pair", [("train", env(0, None, None))] * 2, args)
    phases["hp-alone"] = run_phase("hp-alone", [("interactive", env(0, None, None))], args)
    phases["hp+be"] = run_phase("hp+be", [("interactive", env(0, None, None)),
                                          ("train", env(0, None, None))], args)
    mps_error = ""
    if args.device.startswith("cuda"):
        with tempfile.TemporaryDirectory() as tmp:
            mps = Mps(Path(tmp))
            if mps.start():
                try:
                    phases["pair-mps"] = run_phase(
                        "pair-mps", [("train", env(0, args.share, mps))] * 2, args)
                    phases["hp+be-mps"] = run_phase(
                        "hp+be-mps", [("interactive", env(0, 100, mps)),
                                      ("train", env(0, args.be_share, mps))], args)
                except (RuntimeError, subprocess.TimeoutExpired) as err:
                    mps_error = f"{err}\nMPS log: {mps.log_tail()}"
                finally:
                    mps.stop()
            else:
                mps_error = mps.error
    summary = summarise(phases)
    report = {"device": _device_name(args.device), "args": {k: v for k, v in vars(args).items()
                                                             if k != "json" and k != "command"},
              "summary": summary, "mps_error": mps_error, "phases": phases}
    print(json.dumps({"device": report["device"], "summary": summary, "mps_error": mps_error},
                     indent=2, default=str))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return device


if __name__ == "__main__":
    main()
