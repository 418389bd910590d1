"""TensorShare against its paper's Fig. 10 (issue 35): gSLA violations over the jobs that shared
and over all jobs (the paper's count), excess, JCT and GPU time against dedicated use (fifo), on
the Philly-derived Muri traces, at Muri's cluster (8x8) and the paper's (32x8).

    .venv/bin/python benchmarks/tensorshare_paper.py                      # traces 1-4, both clusters
    .venv/bin/python benchmarks/tensorshare_paper.py --traces 3 --clusters 8x8 \\
        --variants mlp,blind,oracle,oracle_error=0.06 --job-types table1 --json

Variants: ``mlp`` (the default predictor), ``ridge``, ``blind``, ``oracle``, ``oracle_error=E``
(the truth with a fixed per-pair error of relative size E; 0.06 is about the paper's SMAPE), each
optionally ``@S`` for the policy's seed (``mlp@3``). The figures are in docs/evaluation.md
("TensorShare (seed 001)"). A Muri trace takes 10-90 s per run on the shared VM.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from notebookos.simulator.config import SimConfig, parse_cluster
from notebookos.simulator.runner import simulate
from notebookos.testing import smoke
from notebookos.workload.job_types import assign_types
from notebookos.workload.model import Workload, jobs_workload
from notebookos.workload.readers import read_trace

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / ".." / "shared" / "traces" / "philly-muri"
MURI_TYPES = ("vgg16", "vgg19", "bert", "shufflenet_v2_x1_0", "a2c", "gpt2", "dqn", "resnet18")


def variant_params(variant: str) -> dict[str, object]:
    """``mlp``, ``oracle_error=0.06``, ``blind@2`` -> tensorshare's policy parameters."""
    name, _, seed = variant.partition("@")
    params: dict[str, object] = {"seed": int(seed)} if seed else {}
    if name.startswith("oracle_error="):
        params.update(predictor="oracle", oracle_error=float(name.partition("=")[2]))
    else:
        params["predictor"] = name
    return params


def tiny_workload(jobs: int) -> Workload:
    """A stand-in trace (smoke mode, or without ../shared): bursts of 1- and 8-GPU jobs."""
    rows = [(f"j{i}", float(60 * (i // 6)), 600.0 + 97.0 * (i % 11), (1, 8)[i % 2],
             MURI_TYPES[i % len(MURI_TYPES)]) for i in range(jobs)]
    return jobs_workload(rows, "tiny")


def figures(fifo: dict, ts: dict) -> dict[str, object]:
    return {
        "violations_shared": ts.get("gsla_violation_fraction"),
        "violations_all": ts.get("gsla_violation_fraction_all_jobs"),
        "shared_jobs": ts.get("shared_jobs"), "jobs": ts.get("jobs"),
        "excess_p50": ts.get("excess_ratio_p50"), "excess_p90": ts.get("excess_ratio_p90"),
        "jct_vs_dedicated": round(ts["avg_jct_s"] / fifo["avg_jct_s"] - 1, 4),
        "gpu_time_vs_dedicated": round(ts["gpu_hours_committed"]
                                       / max(fifo["gpu_hours_committed"], 1e-9) - 1, 4),
        "predictor_smape": ts.get("predictor_smape"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default="1,2,3,4", help="Muri trace numbers")
    parser.add_argument("--clusters", default="8x8,32x8")
    parser.add_argument("--variants", default="mlp,blind,oracle")
    parser.add_argument("--job-types", choices=("trace", "table1"), default="trace")
    parser.add_argument("--jobs", type=int, default=0, help="only the first N jobs (0: all)")
    parser.add_argument("--json", action="store_true")
    args = smoke.parse_args(parser, argv, traces="tiny", clusters="1x8", variants="oracle,blind",
                            jobs=60)
    rows = []
    for trace in args.traces.split(","):
        path = TRACES / f"trace{trace}.csv"
        workload = (read_trace(path, "muri") if trace != "tiny" and path.is_file()
                    else tiny_workload(args.jobs or 60))
        if args.jobs:
            workload = Workload(workload.sessions[:args.jobs], workload.source, job_trace=True)
        workload = assign_types(workload, args.job_types)
        for cluster in args.clusters.split(","):
            hosts, gpus = parse_cluster(cluster)
            fifo, _ = simulate(workload, "fifo", SimConfig(hosts=hosts, gpus_per_host=gpus))
            for variant in args.variants.split(","):
                config = SimConfig(hosts=hosts, gpus_per_host=gpus,
                                   policy_params={"tensorshare": variant_params(variant)})
                ts, _ = simulate(workload, "tensorshare", config)
                rows.append({"trace": trace, "cluster": cluster, "variant": variant,
                             "job_types": args.job_types, **figures(fifo, ts)})
                if not args.json:
                    print(json.dumps(rows[-1]), flush=True)
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
