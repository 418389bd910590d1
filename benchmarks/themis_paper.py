"""Themis against the figures Muri's simulator publishes for it (issue 35): average JCT of SRTF,
Tiresias and Themis on the Philly-derived Muri traces at Muri's cluster (8x8), with the job
engine's placement sensitivity off and on (``placement_slowdown``), beside the published values.

    .venv/bin/python benchmarks/themis_paper.py                 # trace 3 (about 2 minutes)
    .venv/bin/python benchmarks/themis_paper.py --traces 3 --runs themis:model --json

Published: Rivendile/Muri ``simulator/draw_fig9-10.py`` (the raw data of the SIGCOMM'22 paper's
Figs. 9-10, seconds): ``SRTF_JCT_raw``, ``Tiresias_L_JCT_raw`` (dlas-gpu), ``themis_JCT_raw``;
the traces' runs are n8g8 with YARN's consolidating placement. A run is ``POLICY:MODE``, MODE
``off`` (placement costs nothing), ``model`` (a spread job runs slower by its model's factor,
pooled placement prefers one host) or ``las`` (``event-las``, below, with consolidated
placement: what Muri's "themis" does). The figures are in docs/evaluation.md ("Themis (seed 004)").

``event-las``: Muri's simulator's ``themis_sim_jobs`` (run_sim.py) is Gavel's finish-time-fairness
policy: at every arrival and completion it solves max-min rho over time fractions x (cvxpy), then
runs jobs greedily in the order of x / executed time, never-run jobs first: least attained
service, re-sorted at events, no leases and no auction. ``event-las`` is that order with every
x equal (new jobs first, then least executed time), re-sorted at the same events: the engine
(``MuriEvents``) schedules only at an instant with an arrival or a real completion, where the job
engine also schedules at the stale completion times of preempted runs (harmless for its policies,
whose order those instants do not change, but under LAS each would be one more time slice).
Muri's restart overhead (4-46 s per running job per event, ``overhead_dict``) is left out: about
0.2% of a job's run at this trace's rate of about one event per hour.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import ClassVar

from notebookos.policies import get_policy
from notebookos.policies.base import Policy, PolicyKind, QueuedJob
from notebookos.simulator.config import SimConfig, parse_cluster
from notebookos.simulator.job_ftf import MuriEvents
from notebookos.simulator.jobsim import JobSimulator
from notebookos.simulator.runner import job_engine_for, simulate, summarize_run
from notebookos.testing import smoke
from notebookos.workload.model import Workload, jobs_workload
from notebookos.workload.readers import read_trace

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / ".." / "shared" / "traces" / "philly-muri"
MURI_TYPES = ("vgg16", "vgg19", "bert", "shufflenet_v2_x1_0", "a2c", "gpt2", "dqn", "resnet18")

# Rivendile/Muri simulator/draw_fig9-10.py, traces 1-4 (the non-"_pr" columns), n8g8, seconds.
PUBLISHED = {
    "1": {"srtf": 1370603.198, "tiresias": 3330371.307, "themis": 1823179.078},
    "2": {"srtf": 2665607.375, "tiresias": 7396368.514, "themis": 4628171.542},
    "3": {"srtf": 193081.796, "tiresias": 347213.2481, "themis": 397058.802},
    "4": {"srtf": 581982.9002, "tiresias": 1319382.936, "themis": 994970.736},
}


class EventLAS(Policy):
    """Muri's "themis" order with equal shares: never-run jobs first, then least executed time."""

    name: ClassVar[str] = "event-las"
    kind: ClassVar[PolicyKind] = PolicyKind.JOB
    preemptive: ClassVar[bool] = True
    backfill: ClassVar[bool] = True

    def priority_key(self, job: QueuedJob, now: float) -> tuple:
        executed = job.attained_gpu_s / max(job.num_gpus, 1)
        return (executed > 0, executed, job.submit_time, job.seq)


class MuriEventsOrder(MuriEvents):
    """The job engine's order, scheduled only at Muri's events."""

    def _schedule(self, now: float) -> None:
        if self._live_at == now:
            super()._schedule(now)


def tiny_workload(jobs: int) -> Workload:
    """A stand-in trace (smoke mode, or without ../shared): 1-, 8- and 16-GPU jobs in bursts."""
    rows = [(f"j{i}", float(60 * (i // 6)), 600.0 + 97.0 * (i % 11), (1, 8, 16)[i % 3],
             MURI_TYPES[i % len(MURI_TYPES)]) for i in range(jobs)]
    return jobs_workload(rows, "tiny")


def run_ftf(workload: Workload, mode: str, hosts: int, gpus: int) -> tuple:
    """``ftf[/OPTION...]``: Muri's "themis", the policy ``gavel-ftf`` (Gavel's finish-time
    fairness, ``job_ftf``) as ``notebookos simulate --policy gavel-ftf`` runs it; options
    ``center`` (the dependency-free solve, else ECOS as Muri), ``gavel`` (Gavel's units for the
    isolated time, else Muri's), ``nooverhead`` (no restart cost per event), ``nofactor`` (the
    trace's iteration times without Muri's 1.015)."""
    options = set(mode.split("/")[1:])
    unknown = options - {"center", "gavel", "nooverhead", "nofactor"}
    if unknown:
        raise SystemExit(f"unknown ftf options {sorted(unknown)}")
    params = {"solver": "center" if "center" in options else "ecos",
              "units": "gavel" if "gavel" in options else "muri",
              "overhead": "nooverhead" not in options,
              "iteration_factor": 1.0 if "nofactor" in options else 1.015}
    config = SimConfig(hosts=hosts, gpus_per_host=gpus, placement="consolidated",
                       policy_params={"gavel-ftf": params})
    _, record = simulate(workload, "gavel-ftf", config)
    return record, config


def run_one(workload: Workload, run: str, hosts: int, gpus: int,
            placement: str = "pooled") -> dict:
    name, _, mode = run.partition(":")
    mode = mode or "off"
    if mode.startswith("ftf"):
        record, config = run_ftf(workload, mode, hosts, gpus)
        return summary_row(name, mode, record, config)
    if mode == "las":
        policy: Policy = EventLAS()
        config = SimConfig(hosts=hosts, gpus_per_host=gpus, placement="consolidated")
        engine: type[JobSimulator] = MuriEventsOrder
    else:
        policy = get_policy(name)
        config = SimConfig(hosts=hosts, gpus_per_host=gpus, placement=placement,
                           placement_slowdown=mode)
        engine = job_engine_for(policy)
    record = engine(workload, policy, config).run()
    return summary_row(name, mode, record, config)


def summary_row(name: str, mode: str, record, config: SimConfig) -> dict:  # noqa: ANN001
    summary = summarize_run(record, config)
    return {"policy": name, "mode": mode, "placement": config.placement, "avg_jct_s": summary["avg_jct_s"],
            "p50_jct_s": summary["p50_jct_s"], "p99_jct_s": summary["p99_jct_s"],
            "makespan_s": summary["makespan_s"], "preemptions": summary.get("preemptions"),
            "spread_starts": record.extra.get("spread_starts"),
            "max_rho": record.extra.get("max_finish_time_fairness"),
            "wall_s": round(record.wall_s, 2),
            **{k: record.extra[k] for k in ("ftf_solves", "ftf_solve_wall_s") if k in record.extra}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default="3", help="Muri trace numbers (default 3)")
    parser.add_argument("--cluster", default="8x8")
    parser.add_argument("--runs", default="srtf:off,srtf:model,tiresias:off,tiresias:model,"
                                          "themis:off,themis:model,themis:las")
    parser.add_argument("--placement", choices=("pooled", "consolidated", "sensitive"),
                        default="pooled", help="for the off and model runs (las: consolidated)")
    parser.add_argument("--json", action="store_true")
    args = smoke.parse_args(parser, argv, traces="tiny", cluster="2x8",
                            runs="tiresias:model,themis:off,themis:model,themis:las")
    hosts, gpus = parse_cluster(args.cluster)
    rows = []
    for trace in args.traces.split(","):
        path = TRACES / f"trace{trace}.csv"
        workload = (read_trace(path, "muri") if trace != "tiny" and path.is_file()
                    else tiny_workload(60))
        for run in args.runs.split(","):
            row = {"trace": trace, "cluster": args.cluster,
                   **run_one(workload, run, hosts, gpus, args.placement)}
            published = PUBLISHED.get(trace, {}).get(row["policy"])
            row["published_avg_jct_s"] = published
            row["ours_over_published"] = (round(row["avg_jct_s"] / published, 3)
                                          if published and row["avg_jct_s"] else None)
            rows.append(row)
            if not args.json:
                print(json.dumps(row), flush=True)
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
