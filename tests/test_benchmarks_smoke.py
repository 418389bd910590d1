"""Every benchmark has a smoke mode (``--smoke``: the same code path, tiny arguments), and the
cheap ones run in it here, so that a benchmark cannot rot unseen (issue 32: routing.py had
crashed at start, and `make bench` stopped at it). The ones that start a cluster or need CUDA or
Docker are left to their own smoke commands (docs/performance.md, "Smoke runs")."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

# name[:variant]: (extra arguments, seconds it may take here: a 2-core machine shared with other
# work).
# Quiet, they take 0.5 s each (simulator 3 s, gpu_binding 2.5 s: torch's import, routing 7 s).
CHEAP = {
    "placement": ([], 40),
    "tls": ([], 40),
    "store": ([], 40),  # --smoke: the file backend only, 1 MiB
    "simulator": ([], 60),
    "tensorshare_paper": ([], 40),  # a 60-job stand-in trace, no torch
    "themis_paper": ([], 40),  # a 60-job stand-in trace
    "gpu_binding": ([], 40),  # skips without CUDA; a tiny run with it
    "cell_order": (["--no-live"], 40),  # the simulated orders; the live one needs a cluster
    "routing": ([], 90),  # a GS, three LSs, one kernel: the benchmark that had crashed
    "gs_scale": ([], 60),  # real fronts on stand-in replicas
    "cell_release": ([], 40),
    "registry_writes": ([], 40),  # the file registry, 20 records  # in-process: 10 cells waiting for a host, one release
    # in-process: 10 replicated kernels' cells waiting for GPUs, one release
    "cell_release:notebookos": (["--policy", "notebookos"], 40),
}


def test_every_benchmark_has_a_smoke_mode() -> None:
    missing = [p.name for p in sorted(BENCHMARKS.glob("*.py"))
               if "smoke.parse_args(" not in p.read_text()]
    assert missing == [], f"benchmarks without --smoke (notebookos.testing.smoke): {missing}"


@pytest.mark.parametrize("name", sorted(CHEAP))
def test_a_cheap_benchmark_runs_in_its_smoke_mode(name: str, tmp_path: Path) -> None:
    t0 = time.monotonic()
    extra, limit = CHEAP[name]
    script = BENCHMARKS / f"{name.split(':')[0]}.py"
    done = subprocess.run([sys.executable, str(script), "--smoke", *extra],
                          capture_output=True, text=True, timeout=limit + 60, cwd=tmp_path)
    took = time.monotonic() - t0
    assert done.returncode == 0, f"{name} --smoke: exit {done.returncode}\n{done.stderr[-3000:]}"
    assert took < limit, f"{name} --smoke took {took:.0f} s"
