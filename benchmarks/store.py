"""Large-object store throughput next to the raw clients, on the same servers, in the same run.

For each backend (file, redis, s3) and value size (1 MiB, 64 MiB, 1 GiB by default) it times
``store.put`` / ``store.get`` and the raw client doing the same transfer:

- file: a plain ``open(..., "wb").write`` / ``open(..., "rb").read`` in the same directory;
- redis: redis-py ``SET`` / ``GET`` of the whole value (the benchmark starts its own redis-server
  with ``proto-max-bulk-len`` raised so that one ``SET`` of 1 GiB is possible);
- s3: boto3 ``put_object`` / ``get_object`` and boto3's managed transfer ``upload_fileobj`` /
  ``download_fileobj`` against a SeaweedFS server the benchmark starts. The raw client gets the same
  botocore settings as the store's (no payload signing, checksums only where required), so the
  comparison is of the same bytes on the wire; the ratio is against the faster of the two.

Each (backend, size) runs ``--repeat`` rounds, alternating store and raw so that load drift on a
shared machine hits both; the figures are medians. Ratios are store / raw. This is a benchmark,
not a test: it asserts nothing. ``--json`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from boto3.s3.transfer import TransferConfig

from notebookos.store import open_store
from notebookos.testing import smoke
from notebookos.testing.processes import free_port, kill_group, wait_for_port
from notebookos.testing.seaweed import S3Server

HMAC_KEY = b"benchmark-hmac-key"
TARGET = 0.8
SIZES = {"1MiB": 1 << 20, "64MiB": 64 << 20, "1GiB": 1 << 30}


def _timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    result = action()
    elapsed = time.perf_counter() - start
    del result
    return elapsed


class Round:
    """Times for one (backend, size): lists of seconds per operation name."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}

    def add(self, name: str, seconds: float) -> None:
        self.times.setdefault(name, []).append(seconds)

    def mbps(self, name: str, size: int) -> float:
        return size / statistics.median(self.times[name]) / 1e6


def start_redis(workdir: Path) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
         "--save", "", "--appendonly", "no", "--proto-max-bulk-len", "2147483648",
         "--client-query-buffer-limit", "2147483648"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    if not wait_for_port(port, 20, proc):
        kill_group(proc)
        raise RuntimeError(f"redis-server did not start on port {port}")
    return proc, f"redis://127.0.0.1:{port}/0"


def bench_file(workdir: Path, data: bytes, rounds: int) -> Round:
    store = open_store(f"file://{workdir}/store", HMAC_KEY)
    raw_path = workdir / "raw.bin"
    result = Round()
    for _ in range(rounds):
        result.add("store.put", _timed(lambda: store.put("bench/objects/value", data)))
        result.add("store.get", _timed(lambda: store.get("bench/objects/value")))

        def raw_put() -> None:
            with open(raw_path, "wb") as out:
                out.write(data)

        def raw_get() -> bytes:
            with open(raw_path, "rb") as src:
                return src.read()

        result.add("raw.put:write", _timed(raw_put))
        result.add("raw.get:read", _timed(raw_get))
        store.delete("bench/objects/value")
        raw_path.unlink()
    store.close()
    return result


def bench_redis(url: str, data: bytes, rounds: int) -> Round:
    store = open_store(url, HMAC_KEY)
    client = redis.Redis.from_url(url, socket_timeout=300)
    result = Round()
    for _ in range(rounds):
        result.add("store.put", _timed(lambda: store.put("bench/objects/value", data)))
        result.add("store.get", _timed(lambda: store.get("bench/objects/value")))
        store.delete("bench/objects/value")
        result.add("raw.put:SET", _timed(lambda: client.set("bench:raw", data)))
        result.add("raw.get:GET", _timed(lambda: client.get("bench:raw")))
        client.delete("bench:raw")
    store.close()
    client.close()
    return result


def bench_s3(server: S3Server, data: bytes, rounds: int) -> Round:
    bucket = server.new_bucket()
    store = open_store(server.store_url(bucket, credentials=True), HMAC_KEY)
    client = server.client(
        s3={"addressing_style": "path", "payload_signing_enabled": False},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        max_pool_connections=12,
    )
    transfer = TransferConfig()  # boto3's defaults: 8 MiB parts, 10 threads
    result = Round()
    for _ in range(rounds):
        result.add("store.put", _timed(lambda: store.put("bench/objects/value", data)))
        result.add("store.get", _timed(lambda: store.get("bench/objects/value")))
        store.delete("bench/objects/value")
        result.add(
            "raw.put:put_object",
            _timed(lambda: client.put_object(Bucket=bucket, Key="raw", Body=data)),
        )
        result.add(
            "raw.get:get_object",
            _timed(lambda: client.get_object(Bucket=bucket, Key="raw")["Body"].read()),
        )
        client.delete_object(Bucket=bucket, Key="raw")

        def upload() -> None:
            client.upload_fileobj(io.BytesIO(data), bucket, "raw", Config=transfer)

        def download() -> bytes:
            sink = io.BytesIO()
            client.download_fileobj(bucket, "raw", sink, Config=transfer)
            return sink.getvalue()

        result.add("raw.put:upload_fileobj", _timed(upload))
        result.add("raw.get:download_fileobj", _timed(download))
        client.delete_object(Bucket=bucket, Key="raw")
    store.close()
    return result


def summarise(backend: str, size_name: str, size: int, result: Round) -> list[dict[str, Any]]:
    rows = []
    for op in ("put", "get"):
        store = result.mbps(f"store.{op}", size)
        raw = {
            name.split(":", 1)[1]: result.mbps(name, size)
            for name in result.times
            if name.startswith(f"raw.{op}:")
        }
        best_name = max(raw, key=raw.__getitem__)
        rows.append(
            {
                "backend": backend,
                "size": size_name,
                "bytes": size,
                "op": op,
                "store_MBps": round(store, 1),
                "raw_MBps": {name: round(value, 1) for name, value in raw.items()},
                "baseline": best_name,
                "ratio": round(store / raw[best_name], 3),
                "rounds": len(result.times[f"store.{op}"]),
            }
        )
    return rows


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "memory_GiB": round(memory_gb, 1),
        "python": platform.python_version(),
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
    }


def table(report: dict[str, Any]) -> str:
    lines = [
        "| backend | size | op | store MB/s | raw MB/s (client) | store / best raw |",
        "|---|---|---|---:|---|---:|",
    ]
    for row in report["results"]:
        raw = ", ".join(f"{value:.0f} ({name})" for name, value in row["raw_MBps"].items())
        lines.append(
            f"| {row['backend']} | {row['size']} | {row['op']} | {row['store_MBps']:.0f} | "
            f"{raw} | {row['ratio']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--backends", default="file,redis,s3", help="comma-separated subset")
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"subset of {','.join(SIZES)}")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per size (median)")
    parser.add_argument("--repeat-large", type=int, default=2, help="rounds for 1GiB values")
    args = smoke.parse_args(parser, argv, backends="file", sizes="1MiB", repeat=1)
    backends = [b for b in args.backends.split(",") if b]
    sizes = [s for s in args.sizes.split(",") if s]
    bad = [b for b in backends if b not in ("file", "redis", "s3")] + [
        s for s in sizes if s not in SIZES
    ]
    if bad:
        parser.error(f"unknown backend or size: {', '.join(bad)}")

    report: dict[str, Any] = {
        "benchmark": "store",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(),
        "target_ratio": TARGET,
        "results": [],
    }
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="nbos-store-bench-") as tmp:
        workdir = Path(tmp)
        redis_proc = s3 = None
        try:
            if "redis" in backends:
                (workdir / "redis").mkdir()
                redis_proc, redis_url = start_redis(workdir / "redis")
            if "s3" in backends:
                s3 = S3Server(workdir / "weed").start()
            big = os.urandom(max(SIZES[s] for s in sizes))
            for size_name in sizes:
                size = SIZES[size_name]
                data = big if size == len(big) else big[:size]
                rounds = args.repeat_large if size >= SIZES["1GiB"] else args.repeat
                for backend in backends:
                    print(f"... {backend} {size_name}", file=sys.stderr, flush=True)
                    if backend == "file":
                        (workdir / "file").mkdir(exist_ok=True)
                        result = bench_file(workdir / "file", data, rounds)
                    elif backend == "redis":
                        result = bench_redis(redis_url, data, rounds)
                    else:
                        assert s3 is not None
                        result = bench_s3(s3, data, rounds)
                    report["results"] += summarise(backend, size_name, size, result)
                del data
        finally:
            if redis_proc is not None:
                kill_group(redis_proc)
            if s3 is not None:
                s3.stop()
    large = [r for r in report["results"] if r["bytes"] >= SIZES["64MiB"]]
    report["meets_target_64MiB_and_up"] = all(r["ratio"] >= TARGET for r in large)
    report["seconds"] = round(time.time() - started, 1)
    if args.json:
        print(json.dumps(report))
    else:
        print(f"machine: {report['machine']}")
        print(table(report))
        print(f"target: store >= {TARGET:.0%} of the best raw client for 64 MiB and up: "
              f"{'met' if report['meets_target_64MiB_and_up'] else 'NOT met'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
