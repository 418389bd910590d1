"""Run one policy on a workload: pick the engine by the policy's kind, return summary + record."""

from __future__ import annotations

from collections.abc import Callable

from notebookos.policies import PolicyKind, get_policy
from notebookos.policies.profile import Profile
from notebookos.simulator.config import SimConfig
from notebookos.simulator.jobsim import JobSimulator
from notebookos.simulator.records import RunRecord, summarize
from notebookos.simulator.sessionsim import SessionSimulator
from notebookos.workload.model import Workload


def summarize_run(record: RunRecord, config: SimConfig) -> dict:
    return summarize(record, config.gpus_per_host, config.gpu_usd_per_hour, config.markup,
                     config.standby_fraction, immediate_within_s=config.immediate_within_s,
                     standby_billing=config.standby_billing,
                     reservation_billing=config.reservation_billing)


def job_engine_for(policy) -> type[JobSimulator]:  # noqa: ANN001
    """The job engine with the extensions the policy's extension points need."""
    if getattr(policy, "ftf_solver", None):  # gavel-ftf: Muri's event loop with Gavel's solve
        from notebookos.simulator.job_ftf import FTFJobSimulator

        return FTFJobSimulator
    if getattr(policy, "partner_among_running", None) or getattr(policy, "partner_from_queue",
                                                                   None):
        from notebookos.simulator.job_sharing import SharingJobSimulator

        return SharingJobSimulator
    if getattr(policy, "lease_s", None):
        from notebookos.simulator.job_leases import LeaseJobSimulator

        return LeaseJobSimulator
    return JobSimulator


def simulate(
    workload: Workload,
    policy_name: str,
    config: SimConfig,
    progress: Callable[[float], None] | None = None,
    profile: Profile | None = None,
) -> tuple[dict, RunRecord]:
    """Job policies run the workload's tasks as batch jobs on a fixed cluster; session policies
    run its sessions (a batch-job trace is one-task sessions). With ``profile`` (a replay: the
    live Global Scheduler's), its policy and plug-ins run, not ``config.policy_params``'."""
    if profile is not None:
        named = profile.names.get("policy", profile.policy.name)
        if named != policy_name:
            raise ValueError(f"the profile's policy is {named!r}, not {policy_name!r}")
        policy = profile.policy
    else:
        policy = get_policy(policy_name, **config.policy_params.get(policy_name, {}))
    if policy.kind is PolicyKind.JOB:
        engine = job_engine_for(policy)
        record = engine(workload, policy, config, progress).run()
    else:
        engine = SessionSimulator
        record = engine(workload, policy, config, progress, profile=profile).run()
    summary = summarize_run(record, config)
    base_name = getattr(policy, "base_name", None)
    if base_name is not None:  # a wrapper (ces): what it changed against its base alone
        base = engine(workload, policy.base, config).run()
        base_summary = summarize_run(base, config)
        summary["base_policy"] = base_name
        for key in ("avg_queue_s", "p99_queue_s", "avg_jct_s"):
            if summary[key] is not None and base_summary[key] is not None:
                summary[f"added_{key}"] = round(summary[key] - base_summary[key], 3)
        summary["base_gpu_hours_provisioned"] = base_summary["gpu_hours_provisioned"]
    summary.update({
        "trace": workload.source,
        "cluster": f"{config.hosts}x{config.gpus_per_host}",
        "placement": getattr(engine, "placement_name", config.placement),
        "autoscale": bool(config.autoscale and policy.kind is PolicyKind.SESSION),
        "seed": config.seed,
    })
    if config.placement_slowdown != "off":  # (absent when off: summaries as before issue 35)
        summary["placement_slowdown"] = config.placement_slowdown
    return summary, record
