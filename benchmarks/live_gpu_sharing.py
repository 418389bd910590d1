"""Live GPU sharing end to end: two NotebookOS kernels (``gpu_sla`` 2) on a one-GPU host whose
Global Scheduler shares GPUs (``global_scheduler.gpu_sharing = tensorshare``), each training a
small CIFAR-style CNN in a cell; each kernel's training rate alone and while both cells run on
the one device, without and with MPS caps on the sharing replicas. delta = rate alone / shared.

The model, optimizer and data are notebook state: dynamic GPU binding moves them to the device
the Local Scheduler binds for the cell (the same device for both kernels when they share) and
back after it. On a host without CUDA the GPU is virtual and the loops run on the CPU (a check
of the script, not a measurement).

    python benchmarks/live_gpu_sharing.py --seconds 10 --json live_sharing.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path

from notebookos.testing import smoke

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "schedulers"))  # the tests' loopback cluster harness
sys.path.insert(0, str(REPO / "benchmarks"))

SETUP = """
import time, torch
from notebookos.kernel.gpu_binding import assigned_gpus, assigned_device
torch.manual_seed(0)
def block(cin, cout):
    return [torch.nn.Conv2d(cin, cout, 3, padding=1, bias=False), torch.nn.BatchNorm2d(cout),
            torch.nn.ReLU()]
model = torch.nn.Sequential(*block(3, {w}), *block({w}, {w}), torch.nn.MaxPool2d(2),
                            *block({w}, 2 * {w}), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten(), torch.nn.Linear(2 * {w}, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn({b}, 3, 32, 32)
y = torch.randint(0, 10, ({b},))
"""

TRAIN = """
def _sync():
    if assigned_device().startswith("cuda"):
        torch.cuda.synchronize()
for _ in range(3):  # warm-up on this device (cuDNN autotuning)
    opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()
_sync(); _t0 = time.time(); _n = 0
while time.time() < _t0 + {s}:
    opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()
    _n += 1
    if _n % 10 == 0: _sync()
_sync()
print(list(assigned_gpus()), assigned_device(), _n / (time.time() - _t0))
"""


def run_case(mps_share: int | None, seconds: float, width: int, batch: int) -> dict:
    from notebookos.testing.credentials import install_session_credentials

    install_session_credentials()
    from gpu_sharing import Mps
    from sched_cluster import Cluster, run_seen, stream_text

    with tempfile.TemporaryDirectory() as tmp:
        env = {"NOTEBOOKOS_GLOBAL_SCHEDULER_GPU_SHARING": "tensorshare",
               "NOTEBOOKOS_GLOBAL_SCHEDULER_GPU_SHARING_PREDICTOR": "ridge",
               "NOTEBOOKOS_CLUSTER_REPLICAS_PER_KERNEL": "1",
               "NOTEBOOKOS_CLUSTER_MAX_SUBSCRIPTION_RATIO": "8",
               "NOTEBOOKOS_GLOBAL_SCHEDULER_CELL_QUEUE_TIMEOUT_S": "300"}
        mps = None
        if mps_share is not None:
            mps = Mps(Path(tmp))
            if not mps.start():
                return {"mps": mps_share, "error": mps.error}
            env.update(mps.env())
            env.update({"NOTEBOOKOS_LOCAL_SCHEDULER_MPS": "true",
                        "NOTEBOOKOS_LOCAL_SCHEDULER_MPS_PERCENTAGE": str(mps_share)})
        cluster = Cluster(Path(tmp), env)
        try:
            cluster.start_gs()
            cluster.start_ls("host-0", gpus=1, prewarm=0)
            cluster.wait_hosts(1)
            clients = {}
            for name in ("a", "b"):
                _, kc = cluster.start_kernel(gpus=1, hints={"gpu_sla": "2",
                                                            "gpu_workload": "cifar-cnn"})
                setup = run_seen(kc, SETUP.format(w=width, b=batch), timeout=180)
                assert setup["reply"]["content"]["status"] == "ok", setup["reply"]["content"]
                clients[name] = kc

            def train(name: str, out: dict) -> None:
                run = run_seen(clients[name], TRAIN.format(s=seconds), timeout=300)
                content = run["reply"]["content"]
                if content["status"] != "ok":
                    out[name] = {"error": content.get("evalue", content)}
                    return
                ids, device, rate = stream_text(run, "stdout").strip().rsplit(" ", 2)
                out[name] = {"gpus": json.loads(ids), "device": device, "rate": float(rate)}

            alone: dict = {}
            train("a", alone)
            train("b", alone)
            shared: dict = {}
            threads = [threading.Thread(target=train, args=(n, shared)) for n in ("a", "b")]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            result = {"mps": mps_share, "alone": alone, "shared": shared}
            if all("rate" in alone[n] and "rate" in shared.get(n, {}) for n in ("a", "b")):
                result["delta"] = {n: round(alone[n]["rate"] / shared[n]["rate"], 3)
                                   for n in ("a", "b")}
            return result
        finally:
            cluster.close()
            if mps is not None:
                mps.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--mps-share", type=int, default=50, help="MPS percent per sharing replica")
    ap.add_argument("--no-mps", action="store_true", help="only the time-sliced case")
    ap.add_argument("--json", type=Path)
    args = smoke.parse_args(ap, seconds=1.0, width=8, batch=16, no_mps=True)
    cases = [None] if args.no_mps else [None, args.mps_share]
    rows = []
    for share in cases:
        row = run_case(share, args.seconds, args.width, args.batch)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
