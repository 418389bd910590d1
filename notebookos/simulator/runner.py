"""Run one policy on a workload: pick the engine by the policy's kind, return summary + record."""

from __future__ import annotations

from collections.abc import Callable

from notebookos.policies import PolicyKind, get_policy
from notebookos.simulator.config import SimConfig
from notebookos.simulator.jobsim import JobSimulator
from notebookos.simulator.records import RunRecord, summarize
from notebookos.simulator.sessionsim import SessionSimulator
from notebookos.workload.model import Workload


def simulate(
    workload: Workload,
    policy_name: str,
    config: SimConfig,
    progress: Callable[[float], None] | None = None,
) -> tuple[dict, RunRecord]:
    """Job policies run the workload's tasks as batch jobs on a fixed cluster; session policies
    run its sessions (a batch-job trace is one-task sessions)."""
    policy = get_policy(policy_name, **config.policy_params.get(policy_name, {}))
    engine = JobSimulator if policy.kind is PolicyKind.JOB else SessionSimulator
    record = engine(workload, policy, config, progress).run()
    summary = summarize(record, config.gpus_per_host, config.gpu_usd_per_hour, config.markup,
                        config.standby_fraction)
    summary.update({
        "trace": workload.source,
        "cluster": f"{config.hosts}x{config.gpus_per_host}",
        "placement": config.placement,
        "autoscale": bool(config.autoscale and policy.kind is PolicyKind.SESSION),
        "seed": config.seed,
    })
    return summary, record
