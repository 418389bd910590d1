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

# name: seconds it may take here (a 2-core machine shared with other work)
CHEAP = {
    "placement": 40,
    "tls": 40,
    "store": 40,  # --smoke: the file backend only, 1 MiB
    "simulator": 60,
    "gpu_binding": 40,  # skips without CUDA; a tiny run with it
}


def test_every_benchmark_has_a_smoke_mode() -> None:
    missing = [p.name for p in sorted(BENCHMARKS.glob("*.py"))
               if "smoke.parse_args(" not in p.read_text()]
    assert missing == [], f"benchmarks without --smoke (notebookos.testing.smoke): {missing}"


@pytest.mark.parametrize("name", sorted(CHEAP))
def test_a_cheap_benchmark_runs_in_its_smoke_mode(name: str, tmp_path: Path) -> None:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), "--smoke"],
                          capture_output=True, text=True, timeout=CHEAP[name] + 60, cwd=tmp_path)
    took = time.monotonic() - t0
    assert done.returncode == 0, f"{name} --smoke: exit {done.returncode}\n{done.stderr[-3000:]}"
    assert took < CHEAP[name], f"{name} --smoke took {took:.0f} s"
