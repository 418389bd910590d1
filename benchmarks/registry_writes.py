"""What a registry write costs the Global Scheduler's lock (issue 32).

    python benchmarks/registry_writes.py [--json] [--kernels 1000] [--writes 3000]

The service changes a kernel's record while it holds ``service.lock``; every front hook and
gRPC call waits behind it. For each registry backend (the file registry, the embedded default;
Redis at --redis-url when it answers), ``--kernels`` records are written, then ``--writes``
changes of them (a realistic ~600-byte document) are timed as the caller sees them:

- ``direct``: the store's own ``put_kernel``, as the service called it under the lock before
  (the file registry now and then folds its journal into a new snapshot: the max);
- ``writer``: ``RegistryWriter.put_kernel`` (global_scheduler/registry_writer.py), what the
  service calls now: the change is taken and one writer thread applies it; then the time until
  every change is written (``flush_ms``) and how many writes reached the store (a newer version
  of a record replaces one not yet written).

Alternating direct and writer runs (--repeats), p50 / p99 / max in ms per change.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from notebookos.global_scheduler.registry_store import (  # noqa: E402
    FileRegistryStore,
    RedisRegistryStore,
    RegistryStore,
)
from notebookos.global_scheduler.registry_writer import RegistryWriter  # noqa: E402
from notebookos.testing import smoke  # noqa: E402

DOC: dict[str, Any] = {
    "key": "k" * 64, "scheme": "hmac-sha256", "ports": [41001, 41002, 41003, 41004, 41005],
    "state": "idle", "message": "", "env": {"NOTEBOOKOS_INCARNATION": "0", "A": "b" * 40},
    "replicas": [{"replica_id": i, "host_id": f"host-{i}", "address": "127.0.0.1",
                  "ports": [42000 + i, 42010 + i, 42020 + i, 42030 + i, 42040 + i]}
                 for i in range(1, 4)],
    "request": {"gpus": 1, "millicpus": 100, "memory_mb": 128}, "checkpoint_count": 3,
}


class CountingStore(RegistryStore):
    """Counts the writes that reach ``store``."""

    def __init__(self, store: RegistryStore) -> None:
        self.store, self.writes = store, 0

    def load(self) -> tuple[dict, dict]:
        return self.store.load()

    def put_host(self, host_id: str, doc: dict) -> None:
        self.writes += 1
        self.store.put_host(host_id, doc)

    def delete_host(self, host_id: str) -> None:
        self.writes += 1
        self.store.delete_host(host_id)

    def put_kernel(self, kernel_id: str, doc: dict) -> None:
        self.writes += 1
        self.store.put_kernel(kernel_id, doc)

    def delete_kernel(self, kernel_id: str) -> None:
        self.writes += 1
        self.store.delete_kernel(kernel_id)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(make: Any, kernels: int, writes: int, through_writer: bool) -> dict[str, Any]:
    counting = CountingStore(make())
    store: RegistryStore = RegistryWriter(counting) if through_writer else counting
    for i in range(kernels):
        store.put_kernel(f"k{i}", DOC)
    if through_writer:
        store.flush()
    before = counting.writes
    times = []
    started = time.perf_counter()
    for n in range(writes):
        t0 = time.perf_counter()
        store.put_kernel(f"k{n % kernels}", DOC)
        times.append((time.perf_counter() - t0) * 1e3)
    flush_ms = 0.0
    if through_writer:
        t0 = time.perf_counter()
        store.flush()
        flush_ms = (time.perf_counter() - t0) * 1e3
        store.close()
    return {"p50_ms": round(_pct(times, 0.5), 4), "p99_ms": round(_pct(times, 0.99), 4),
            "max_ms": round(max(times), 3), "caller_total_ms": round(sum(times), 1),
            "flush_ms": round(flush_ms, 1),
            "all_written_ms": round((time.perf_counter() - started) * 1e3, 1),
            "store_writes": counting.writes - before}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--kernels", type=int, default=1000, help="records in the registry")
    parser.add_argument("--writes", type=int, default=3000, help="changes timed per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each, alternating")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0",
                        help="Redis for the Redis registry ('' to skip it)")
    args = smoke.parse_args(parser, argv, kernels=20, writes=50, repeats=1, redis_url="")
    backends: dict[str, Any] = {
        "file": lambda: FileRegistryStore(Path(tempfile.mkdtemp()) / "registry.json")}
    if args.redis_url:
        try:
            import redis

            redis.Redis.from_url(args.redis_url, socket_timeout=2).ping()
            prefix = f"bench-registry-{uuid.uuid4().hex[:8]}"
            backends["redis"] = lambda: RedisRegistryStore(args.redis_url, prefix=prefix)
        except Exception as exc:  # noqa: BLE001 - a benchmark without Redis measures the file
            print(f"Redis at {args.redis_url} not used: {exc}", file=sys.stderr)
    results: dict[str, Any] = {}
    for name, make in backends.items():
        runs: dict[str, list[dict]] = {"direct": [], "writer": []}
        for _ in range(args.repeats):
            for side in ("direct", "writer"):
                runs[side].append(measure(make, args.kernels, args.writes, side == "writer"))
        results[name] = {side: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
                         for side, rs in runs.items()}
        if name == "redis":
            import redis

            client = redis.Redis.from_url(args.redis_url)
            for key in client.scan_iter(f"{prefix}:*"):
                client.delete(key)
    if args.json:
        print(json.dumps({"kernels": args.kernels, "writes": args.writes,
                          "repeats": args.repeats, "registry_writes": results}, indent=1))
    else:
        for name, sides in results.items():
            for side, figures in sides.items():
                print(f"{name:5} {side:6} " + " ".join(f"{k}={v}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
