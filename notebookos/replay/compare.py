"""The replay's workload through the simulator, and live vs simulated side by side.

The simulator gets the workload exactly as it was played (time-scaled, sliced, each session's
GPUs those of its kernelspec), the scheduling profile the live Global Scheduler builds from the
same configuration (its policy with the same parameters, its queue sort and plug-ins' sections:
``live_profile_spec``), the same cluster shape, and no autoscaling unless the live
cluster had it. Its latencies are its own settings (``--sim-set``), not the live system's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from notebookos.config import Config
from notebookos.policies.live import policy_params
from notebookos.policies.profile import Profile, profile_spec
from notebookos.simulator.records import RunRecord
from notebookos.workload.model import Workload

# (key, label, format, absolute tolerance): the figures compared live vs simulated. A pair is
# marked when it differs by more than 10% of the larger one and by more than the tolerance
# (so 20 ms of live overhead against a simulated 0 is not a disagreement).
COMPARED = (
    ("tasks_submitted", "tasks submitted", "{:.0f}", 0),
    ("tasks_completed", "tasks completed", "{:.0f}", 0),
    ("tasks_failed", "tasks failed", "{:.0f}", 0),
    ("immediate_fraction", "immediate fraction", "{:.3f}", 0.0),
    ("interactivity_p50_s", "interactivity p50 (s)", "{:.3f}", 0.1),
    ("interactivity_p90_s", "interactivity p90 (s)", "{:.3f}", 0.1),
    ("tct_p50_s", "TCT p50 (s)", "{:.2f}", 0.1),
    ("tct_p90_s", "TCT p90 (s)", "{:.2f}", 0.1),
    ("gpu_hours_committed", "GPU-hours committed", "{:.4f}", 0.0),
    ("gpu_hours_reservation", "GPU-hours a reservation holds", "{:.4f}", 0.0),
    ("migrations", "migrations", "{:.0f}", 0),
)
DISAGREEMENT = 0.10


def live_policy_params(config: Config) -> dict[str, Any]:
    """The policy parameters the live Global Scheduler derives from ``config`` (the same
    function: ``notebookos.policies.live.policy_params``)."""
    return policy_params(config)


def live_profile_spec(config: Config) -> dict[str, Any]:
    """The scheduling profile the live Global Scheduler runs under ``config`` (the same
    function as its daemon's: ``notebookos.policies.profile.profile_spec``), as a mapping
    (``Profile.load``) that a run's summary keeps."""
    return profile_spec(config)


def simulated_profile(spec: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with the queue sort the simulator's settings name (``cell_order``: the live
    cluster's, or ``--sim-set``'s, which take precedence), its configuration section kept when
    the order is the same."""
    order = settings.get("cell_order", spec.get("queue_sort", "arrival"))
    if order == spec.get("queue_sort"):
        return spec
    config = {k: v for k, v in (spec.get("config") or {}).items() if k != "queue_sort"}
    return {**spec, "queue_sort": order, "config": config}


# The latencies of a ``--local`` cluster, which the simulator's defaults do not describe: those
# are the paper's deployment (a Docker container per replica, 2.24 s cold, 1.0 s from the
# prewarm pool; 3.6 ms client -> code and back), while --local starts replica processes on this
# machine and its cells cross Jupyter Server's websocket on a loaded VM. Measured by
# ``notebookos replay --local`` of the 8-session template under notebookos (docs/evaluation.md,
# "Live vs simulated", 2026-11-28): a kernel is ready (past ``starting``) 0.57 s p50 after POST
# /api/sessions, 8 kernels within 2 s included (0.41-0.71 s); a cell's send -> code plus code end
# -> execute_reply is 0.083 s p50 (0.050 + 0.033). Calibrated with --resimulate.
LOCAL_LATENCIES: dict[str, float] = {
    "container_start_s": 0.57,
    "prewarm_promotion_s": 0.57,  # no pool is faster than a start here
    "request_overhead_s": 0.083,
}


def settings_from_live(config: Config, sim_settings: dict[str, Any]) -> dict[str, Any]:
    """The simulator settings that mirror the live ``--local`` cluster's own (the order of waiting
    cells, hibernation after ``global_scheduler.hibernate_after_s`` of no cell, 3600 s by
    default; its latencies, ``LOCAL_LATENCIES``), with ``--sim-set`` taking precedence: a replay
    compares like with like (issues 34, 35)."""
    live = {"cell_order": config.global_scheduler.cell_order,
            "hibernate_after_s": config.global_scheduler.hibernate_after_s, **LOCAL_LATENCIES}
    return {**live, **sim_settings}


# The simulator settings a run records under summary.json's "simulated" that are not latencies
# or settings of its own but the cluster's shape and policy (simulate_played passes them apart).
_SHAPE = ("hosts", "gpus_per_host", "autoscale", "policy_params", "profile")


def resimulate_settings(summary: dict[str, Any], sim_settings: dict[str, Any]) -> dict[str, Any]:
    """The simulator settings to simulate a stored run again with: those the run was simulated
    with (the live cluster's cell_order and hibernate_after_s among them, settings_from_live),
    with ``--sim-set`` taking precedence. Without them a run of a cluster that serves waiting cells
    in ``qssf`` or ``themis`` order was re-simulated in arrival order, and with no hibernation."""
    stored = ((summary.get("simulated") or {}).get("settings") or {})
    kept = {k: v for k, v in stored.items() if k not in _SHAPE}
    return {**kept, **sim_settings}


def simulate_played(workload: Workload, policy: str, hosts: int, gpus_per_host: int,
                    params: dict[str, Any], autoscale: bool, max_hosts: int, seed: int,
                    settings: dict[str, Any] | None = None,
                    profile: dict[str, Any] | None = None) -> tuple[dict[str, Any], RunRecord]:
    """The played workload through the simulator: under ``profile`` (the live scheduler's
    profile spec, ``live_profile_spec``) when given, else ``policy`` with ``params`` (a run
    recorded before the profile was)."""
    from notebookos.simulator.config import SimConfig
    from notebookos.simulator.runner import simulate

    config = SimConfig(hosts=hosts, gpus_per_host=gpus_per_host, autoscale=autoscale,
                       max_hosts=max(hosts, max_hosts), seed=seed,
                       policy_params={policy: params}, **(settings or {}))
    if profile is not None:
        profile = simulated_profile(profile, settings or {})
    summary, record = simulate(workload, policy, config,
                               profile=Profile.load(profile) if profile is not None else None)
    done = [t for t in record.tasks if t.end is not None]
    tct = [t.end - t.submit for t in done]
    reservation_gpu_s = sum(s.request.gpus * ((s.stop if s.stop is not None else s.start)
                                              - s.start) for s in workload.sessions)
    figures = {
        "tasks_submitted": len(record.tasks),
        "tasks_completed": len(done),
        "tasks_failed": len(record.tasks) - len(done),
        "immediate_fraction": summary["immediate_fraction"],
        "interactivity_p50_s": summary["interactivity_p50_s"],
        "interactivity_p90_s": summary["interactivity_p90_s"],
        "interactivity_p99_s": summary["interactivity_p99_s"],
        "tct_p50_s": round(float(np.percentile(tct, 50)), 4) if tct else None,
        "tct_p90_s": round(float(np.percentile(tct, 90)), 4) if tct else None,
        "gpu_hours_committed": summary["gpu_hours_committed"],
        "gpu_hours_reservation": round(reservation_gpu_s / 3600, 6),
        "migrations": summary["migrations"],
        "settings": {"hosts": hosts, "gpus_per_host": gpus_per_host, "autoscale": autoscale,
                     "policy_params": params, **(settings or {}),
                     **({"profile": profile} if profile is not None else {})},
        "simulator_summary": summary,
    }
    return figures, record


def disagrees(live: Any, sim: Any, tolerance: float = 0.0) -> bool:
    if not isinstance(live, int | float) or not isinstance(sim, int | float):
        return False
    gap = abs(live - sim)
    return gap > DISAGREEMENT * max(abs(live), abs(sim)) and gap > tolerance


def _differs(live: Any, sim: Any, tolerance: float) -> str:
    if not isinstance(live, int | float) or not isinstance(sim, int | float):
        return ""
    if live == sim:
        return "0%"
    diff = f"{(live - sim) / abs(sim):+.0%}" if sim else f"{live - sim:+g} (simulated 0)"
    return diff + (" **>10%**" if disagrees(live, sim, tolerance) else "")


def comparison_table(live: dict[str, Any], simulated: dict[str, Any] | None) -> str:
    """A Markdown table: figure, live, simulated, live vs simulated."""
    lines = ["| figure | live | simulated | live vs simulated |", "|---|---|---|---|"]
    for key, label, fmt, tolerance in COMPARED:
        a = live.get(key)
        b = None if simulated is None else simulated.get(key)
        cell_a = "-" if a is None else fmt.format(a)
        cell_b = "-" if b is None else fmt.format(b)
        lines.append(f"| {label} | {cell_a} | {cell_b} | {_differs(a, b, tolerance)} |")
    return "\n".join(lines)


def plot_live_vs_simulated(out: Path, title: str, live_delays: list[float],
                           live_tct: list[float], record: RunRecord | None) -> Path:
    """CDFs of interactivity delay and task completion time, live vs simulated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sim_delays = [] if record is None else [t.start - t.submit for t in record.tasks
                                            if t.start is not None]
    sim_tct = [] if record is None else [t.end - t.submit for t in record.tasks
                                         if t.end is not None]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    panels = ((axes[0], live_delays, sim_delays, "Interactivity delay (execute_request to "
               "execute_input)"), (axes[1], live_tct, sim_tct, "Task completion time "
                                   "(execute_request to execute_reply)"))
    for ax, live, sim, label in panels:
        for values, name, style in ((live, "live", "-"), (sim, "simulated", "--")):
            if not values:
                continue
            xs = np.sort(np.asarray(values, dtype=float))
            zeros = int((xs <= 0).sum())
            extra = f", {zeros} at 0 s" if zeros else ""
            legend = f"{name} (n={xs.size}{extra})"
            ys = np.arange(1, xs.size + 1) / xs.size
            xs, ys = np.concatenate([[xs[0]], xs]), np.concatenate([[0.0], ys])
            ax.step(xs, ys, where="post", linestyle=style, label=legend)
        ax.set_xscale("symlog", linthresh=0.01)
        ax.set_xlim(left=0)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("seconds of replay time (symlog: linear below 0.01 s)")
        ax.set_ylabel("fraction of tasks")
        ax.set_title(label, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = out / "cdf_live_vs_simulated.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
