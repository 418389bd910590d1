"""What it costs to check, after every cell, every tensor and array the namespace holds (issue 31).

    python benchmarks/sync_recheck.py [--json] [--gib 1.0] [--small 1000] [--repeats 5] [--smoke]

A cell's AST cannot say what ``W.data += 1``, ``backward()`` or a C extension changed, so after
every cell the executor's encoder hashes the bytes of every tensor and large array the synced
namespace holds (``StateEncoder._recheck``). Measured in process, on the encoder alone (file
store in a temporary folder), for a trivial cell (``x = 1``) after the namespace was synced:

- ``recheck_large_s``: with --gib GiB of float32 tensors (8 tensors); baseline in the same run:
  ``blake3_s``, one multi-threaded BLAKE3 pass over the same bytes (the hash alone), and
  ``clone_s``, copying them once (memory bandwidth);
- ``recheck_small_ms``: with --small small tensors (a model's parameters, 1 KiB each);
  baseline: ``empty_ms``, the same cell with an empty namespace.

Medians of --repeats runs. --smoke: 64 MiB, 100 small tensors, 2 repeats (CI keeps it running).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import blake3

from notebookos.kernel.ast_effects import analyze_cell
from notebookos.kernel.sync_codec import StateEncoder
from notebookos.store import open_store
from notebookos.testing import smoke


def _timed(function, repeats: int) -> list[float]:  # noqa: ANN001
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return times


def _encoder_with(namespace: dict, folder: Path) -> tuple[StateEncoder, callable]:  # type: ignore[valid-type]
    store = open_store(f"file://{folder}", b"bench-key-0123456789abcdef012345")
    encoder = StateEncoder(store, "bench")
    names = sorted(n for n in namespace if not n.startswith("__"))
    encoder.encode(namespace, analyze_cell("\n".join(f"{n} = {n}" for n in names) or "pass"))
    trivial = analyze_cell("x = 1")

    def cell() -> None:
        namespace["x"] = 1
        update = encoder.encode(namespace, trivial)
        assert [e.name for e in update.entries] in ([], ["x"]), update.entries

    return encoder, cell


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = smoke.parse_args(parser, argv, gib=1 / 16, small=100, repeats=2)
    import torch

    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        base = {"__name__": "__main__"}
        _, empty_cell = _encoder_with(dict(base), Path(folder) / "empty")
        results["empty_ms"] = statistics.median(_timed(empty_cell, args.repeats)) * 1e3

        small = dict(base, params=[torch.randn(256) for _ in range(args.small)])
        _, small_cell = _encoder_with(small, Path(folder) / "small")
        results["recheck_small_ms"] = statistics.median(_timed(small_cell, args.repeats)) * 1e3
        del small, small_cell

        elements = int(args.gib * (1 << 30) / 4 / 8)
        large = dict(base, tensors=[torch.rand(elements) for _ in range(8)])
        _, large_cell = _encoder_with(large, Path(folder) / "large")
        results["recheck_large_s"] = statistics.median(_timed(large_cell, args.repeats))

        def hash_only() -> None:
            for tensor in large["tensors"]:
                hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
                hasher.update(memoryview(tensor.numpy()).cast("B"))
                hasher.digest()

        results["blake3_s"] = statistics.median(_timed(hash_only, args.repeats))
        results["clone_s"] = statistics.median(_timed(
            lambda: [t.clone() for t in large["tensors"]], args.repeats))
        results["gib"] = args.gib
        results["small_tensors"] = args.small
    results["recheck_vs_blake3"] = results["recheck_large_s"] / results["blake3_s"]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"{args.gib:g} GiB of tensors: recheck {results['recheck_large_s']:.3f} s, "
              f"BLAKE3 alone {results['blake3_s']:.3f} s ({results['recheck_vs_blake3']:.2f}x), "
              f"one copy {results['clone_s']:.3f} s")
        print(f"{args.small} small tensors: {results['recheck_small_ms']:.2f} ms "
              f"(empty namespace {results['empty_ms']:.2f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
