"""Simulator performance (issue 6): the 7-day Sensei slice, a 3-month generated trace, and the
per-event cost at 100, 1,000 and 10,000 hosts.

    .venv/bin/python benchmarks/simulator.py --json

Times are the best of 3 runs (one run for the 3-month trace), with the process CPU seconds of
that run beside them, because the development VM is shared. Targets: ``sensei_week_s`` <= 1 s under every job policy (20x8) but themis and tensorshare
(``sensei_week_solver_s`` <= 10 s: their auctions, and the MLP trained when the policy is built);
the seeds' policies are built inside the timed run, model fitting included; ``three_month_s`` <= 30 s per
session policy (>= 400 sessions, >= 50,000 tasks, 30 hosts of 8 GPUs); ``hosts_10000_s`` close to
``hosts_100_s`` (the ratio is reported against the 100-host baseline measured in the same run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from notebookos.cluster import Cluster
from notebookos.simulator.config import SimConfig
from notebookos.simulator.hosts import HostFactory
from notebookos.simulator.runner import simulate
from notebookos.testing import smoke
from notebookos.workload.generator import SenseiParams, write_sensei
from notebookos.workload.readers import read_trace

ROOT = Path(__file__).resolve().parents[1]
SENSEI_WEEK = ROOT / ".." / "shared" / "traces" / "sensei" / "sensei_week7d_tiresias_sec.csv"
THREE_MONTHS = SenseiParams(hours=24 * 91, seed=0, session_rate_per_hour=2.0,
                            idle_session_fraction=0.5, break_probability=0.3, break_hours_mean=8.0)
EXCERPT = SenseiParams(hours=17.5, seed=1)


SOLVER_POLICIES = ("themis", "tensorshare")
CPU_S: dict[str, float] = {}  # process CPU seconds per measurement (less sensitive to a busy box)


def timed(workload, policy: str, config: SimConfig, label: str = "",
          repeat: int = 1) -> tuple[float, dict]:
    """Best of ``repeat`` runs (the shared VM is noisy); CPU seconds of the best run."""
    best = float("inf")
    summary: dict = {}
    for _ in range(repeat):
        cpu = time.process_time()
        start = time.perf_counter()
        summary, _ = simulate(workload, policy, config)
        elapsed = time.perf_counter() - start
        if elapsed < best:
            best = elapsed
            if label:
                CPU_S[label] = round(time.process_time() - cpu, 3)
    return best, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="skip the 3-month trace")
    args = smoke.parse_args(parser, argv, quick=True)
    repeat = 1 if args.smoke else 3
    sizes = (100,) if args.smoke else (100, 1000, 10_000)
    result: dict = {"targets": {"sensei_week_s": 1.0, "sensei_week_solver_s": 10.0,
                                "three_month_s": 30.0}}

    if SENSEI_WEEK.is_file():
        week = read_trace(SENSEI_WEEK, "tiresias", "s")
        policies = ("fifo", SOLVER_POLICIES[0]) if args.smoke else (
            "fifo", "sjf", "srtf", "tiresias", "qssf", "ces", "lucid", *SOLVER_POLICIES)
        by_policy = {p: round(timed(week, p, SimConfig(hosts=20, gpus_per_host=8),
                                    f"sensei_week_{p}", repeat=repeat)[0], 3)
                     for p in policies}
        result["sensei_week_jobs"] = week.task_count
        result["sensei_week_by_policy_s"] = by_policy
        result["sensei_week_s"] = max(v for p, v in by_policy.items() if p not in SOLVER_POLICIES)
        result["sensei_week_solver_s"] = max(by_policy[p] for p in SOLVER_POLICIES
                                             if p in by_policy)
    else:
        result["sensei_week_s"] = None
        result["sensei_week_skipped"] = f"{SENSEI_WEEK} is absent"

    with tempfile.TemporaryDirectory() as tmp:
        if not args.quick:
            path = Path(tmp) / "three_months.json"
            start = time.perf_counter()
            write_sensei(THREE_MONTHS, path)
            months = read_trace(path, "template")
            result["three_month_generate_s"] = round(time.perf_counter() - start, 3)
            result["three_month_sessions"] = len(months.sessions)
            result["three_month_tasks"] = months.task_count
            by_policy = {}
            for policy in ("notebookos", "reservation", "batch", "lcp"):
                by_policy[policy] = round(timed(months, policy, SimConfig(
                    hosts=30, gpus_per_host=8), f"three_month_{policy}")[0], 3)
            result["three_month_by_policy_s"] = by_policy
            result["three_month_s"] = max(by_policy.values())

        path = Path(tmp) / "excerpt.json"
        write_sensei(EXCERPT, path)
        excerpt = read_trace(path, "template")
        result["hosts_trace_tasks"] = excerpt.task_count
        for hosts in sizes:
            config = SimConfig(hosts=hosts, gpus_per_host=8, max_hosts=hosts)
            result[f"hosts_{hosts}_s"] = round(
                timed(excerpt, "notebookos", config, f"hosts_{hosts}", repeat=repeat)[0], 3)
            week_config = SimConfig(hosts=hosts, gpus_per_host=8)
            if SENSEI_WEEK.is_file():
                result[f"hosts_{hosts}_tiresias_s"] = round(timed(
                    week, "tiresias", week_config, f"hosts_{hosts}_tiresias", repeat)[0], 3)
        if args.smoke:
            return _report(result, args.json)
        result["hosts_10000_over_100"] = round(result["hosts_10000_s"] / result["hosts_100_s"], 2)
        # Creating N Host objects is O(N) and happens once; the rest is the per-event cost.
        for hosts in (100, 10_000):
            best = float("inf")
            for _ in range(3):
                factory = HostFactory(Cluster(), 8, 21.0)
                start = time.perf_counter()
                for _ in range(hosts):
                    factory.new_host()
                best = min(best, time.perf_counter() - start)
            result[f"hosts_{hosts}_setup_s"] = round(best, 4)
        result["hosts_10000_over_100_without_setup"] = round(
            (result["hosts_10000_s"] - result["hosts_10000_setup_s"])
            / (result["hosts_100_s"] - result["hosts_100_setup_s"]), 2)
    return _report(result, args.json)


def _report(result: dict, as_json: bool) -> int:
    result["cpu_s"] = CPU_S
    result["load_average_1min"] = round(os.getloadavg()[0], 2)
    result["meets_targets"] = bool(
        (result["sensei_week_s"] is None or result["sensei_week_s"] <= 1.0)
        and result.get("sensei_week_solver_s", 0.0) <= 10.0
        and result.get("three_month_s", 0.0) <= 30.0)
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
