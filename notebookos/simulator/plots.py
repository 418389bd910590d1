"""PNG plots (matplotlib, Agg): the counterparts of the paper's figures 8, 9, 10 and 12.

Each plot answers one question and says what it draws; every figure names the trace, cluster
and seed (``subtitle``):

- ``cdf_interactivity_tct.png``: how long do users wait for their code to start, and how much
  does the policy add to a cell's completion time (completion time minus the code's own run time,
  which would otherwise hide every difference)? CDFs on a symlog axis (linear below 0.1 s), so a
  zero wait is drawn at 0, and the legend gives each policy's share of tasks whose code started
  within ``immediate_within_s``.
- ``gpu_timeline.png``: how many GPUs does each policy pay for, and how many run code? One panel
  per policy: provisioned (what the provider pays), bound (committed to a container: reserved
  for a whole session under reservation) and in use (cells running).
- ``subscription_migrations.png`` (only for policies that replicate kernels): the cluster's
  subscription ratio against the limit that placement enforced, and migrations over time.
- ``cost.png``: cumulative provider cost over time, and the final cost and revenue per policy.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from notebookos.simulator.records import TIMELINE_COLUMNS, RunRecord

LINEAR_BELOW_S = 0.1


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _column(record: RunRecord, name: str) -> np.ndarray:
    index = TIMELINE_COLUMNS.index(name)
    values = [row[index] if index < len(row) else "" for row in record.timeline]
    return np.asarray([np.nan if v == "" else float(v) for v in values], dtype=float)


def _cdf(ax, values: list[float], label: str) -> None:  # noqa: ANN001
    if not values:
        return
    xs = np.sort(np.asarray(values, dtype=float))
    ys = np.arange(1, xs.size + 1) / xs.size
    ax.step(np.concatenate([[0.0], xs]), np.concatenate([[0.0], ys]), where="post", label=label)


def _finish(fig, path: Path, plt, title: str, subtitle: str) -> Path:  # noqa: ANN001
    # Wrapped so that the trace, cluster and seed stay inside the narrowest figure (10 inches).
    fig.suptitle("\n".join([title, *textwrap.wrap(subtitle, 100)]), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_runs(out_dir: Path, runs: dict[str, RunRecord], gpu_usd_per_hour: float,
              subtitle: str = "", summaries: dict[str, dict] | None = None,
              immediate_within_s: float = 1.0) -> list[Path]:
    """Write the plots for one or more runs (keyed by policy); returns the files written."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    hours = "hours since the start of the trace"

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for name, record in runs.items():
        delays = [t.start - t.submit for t in record.tasks if t.start is not None]
        at_once = np.mean(np.asarray(delays) <= immediate_within_s) if delays else 0.0
        _cdf(axes[0], delays, f"{name} ({at_once:.1%} start within {immediate_within_s:g} s)")
        _cdf(axes[1], [t.end - t.submit - t.duration for t in record.tasks if t.end is not None],
             name)
    # Task completion times are dominated by the cells' own run times (minutes to hours), so
    # their CDFs lie on each other; what a policy adds to them is what tells policies apart.
    labels = ("interactivity delay: cell sent -> its code starts (s)",
              "time added to the cell: completion time - its code's run time (s)")
    for ax, label in zip(axes, labels, strict=True):
        ax.set_xscale("symlog", linthresh=LINEAR_BELOW_S)
        ax.set_xlim(left=0)
        ax.set_xlabel(f"{label}\n(axis linear below {LINEAR_BELOW_S:g} s: a zero wait is at 0)",
                      fontsize=8)
        ax.set_ylabel("fraction of tasks")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    written.append(_finish(fig, out_dir / "cdf_interactivity_tct.png", plt,
                           "How long users wait (paper fig. 9)", subtitle))

    n = len(runs)
    fig, axes = plt.subplots(n, 1, figsize=(10, 1.9 * n + 1.2), sharex=True, sharey=True,
                             squeeze=False)
    for ax, (name, record) in zip(axes[:, 0], runs.items(), strict=True):
        t = _column(record, "time_s") / 3600
        ax.plot(t, _column(record, "gpus_provisioned"), color="tab:blue",
                label="provisioned (provider pays)")
        ax.plot(t, _column(record, "gpus_committed"), color="tab:orange", linestyle="--",
                label="bound to containers")
        ax.fill_between(t, _column(record, "gpus_in_use"), color="tab:green", alpha=0.4,
                        step=None, label="running cells")
        ax.set_ylabel(f"{name}\nGPUs", fontsize=8)
        ax.grid(True, alpha=0.3)
    axes[0, 0].legend(fontsize=7, loc="upper left", ncol=3)
    axes[-1, 0].set_xlabel(hours)
    written.append(_finish(fig, out_dir / "gpu_timeline.png", plt,
                           "GPUs paid for, bound and used, per policy (paper fig. 8)", subtitle))

    replicated = {name: r for name, r in runs.items()
                  if r.timeline and not np.all(np.isnan(_column(r, "sr_limit")))}
    if replicated:
        fig, axes = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
        for name, record in replicated.items():
            t = _column(record, "time_s") / 3600
            line = axes[0].plot(t, _column(record, "subscription_ratio"),
                                label=f"{name}: cluster SR")[0]
            axes[0].plot(t, _column(record, "sr_limit"), linestyle="--",
                         color=line.get_color(), label=f"{name}: SR limit placement enforced")
            axes[1].plot(t, _column(record, "migrations"), color=line.get_color(),
                         label=f"{name}: migrations so far")
        axes[0].set_ylabel("subscribed GPUs /\n(GPUs x replicas)", fontsize=8)
        axes[1].set_ylabel("migrations (cumulative)", fontsize=8)
        axes[1].set_xlabel(hours)
        for ax in axes:
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7, loc="upper left")
        written.append(_finish(fig, out_dir / "subscription_migrations.png", plt,
                               "Subscription ratio and migrations (paper fig. 10)", subtitle))

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    names = list(runs)
    for name, record in runs.items():
        t = _column(record, "time_s")
        prov = _column(record, "gpus_provisioned")
        if t.size < 2:
            continue
        cost = np.concatenate([[0.0], np.cumsum(prov[:-1] * np.diff(t))]) / 3600 * gpu_usd_per_hour
        axes[0].plot(t / 3600, cost, label=name)
    axes[0].set_xlabel(hours)
    axes[0].set_ylabel("provider cost so far (USD)")
    axes[0].grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    if summaries:
        x = np.arange(len(names))
        axes[1].bar(x - 0.2, [summaries[n]["cost_usd"] for n in names], 0.4, label="cost")
        axes[1].bar(x + 0.2, [summaries[n]["revenue_usd"] for n in names], 0.4, label="revenue")
        axes[1].set_xticks(x, names, rotation=30, fontsize=8)
        axes[1].set_ylabel("USD over the whole run")
        axes[1].legend(fontsize=8)
        axes[1].grid(True, axis="y", alpha=0.3)
    else:
        axes[1].axis("off")
    written.append(_finish(fig, out_dir / "cost.png", plt,
                           "What the provider pays, and earns (paper fig. 12)", subtitle))
    return written
