"""PNG plots (matplotlib, Agg): the counterparts of the paper's figures 8, 9, 10 and 12."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from notebookos.simulator.records import RunRecord


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _cdf(ax, values: list[float], label: str) -> None:
    if not values:
        return
    xs = np.sort(np.asarray(values, dtype=float))
    ys = np.arange(1, xs.size + 1) / xs.size
    ax.plot(np.maximum(xs, 1e-3), ys, label=label)


def plot_runs(out_dir: Path, runs: dict[str, RunRecord], gpu_usd_per_hour: float) -> list[Path]:
    """Write the plots for one or more runs (keyed by policy); returns the files written."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, record in runs.items():
        _cdf(axes[0], [t.start - t.submit for t in record.tasks if t.start is not None], name)
        _cdf(axes[1], [t.end - t.submit for t in record.tasks if t.end is not None], name)
    for ax, title in zip(axes, ("Interactivity delay (fig. 9a)", "Task completion time (fig. 9b)"),
                         strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("seconds")
        ax.set_ylabel("CDF")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    written.append(_save(fig, out_dir / "cdf_interactivity_tct.png", plt))

    fig, ax = plt.subplots(figsize=(9, 4))
    for name, record in runs.items():
        t, prov, busy = _timeline_columns(record, (0, 5, 6))
        line = ax.plot(t / 3600, prov, label=f"{name}: provisioned")[0]
        ax.plot(t / 3600, busy, linestyle="--", color=line.get_color(), label=f"{name}: busy")
    ax.set_xlabel("hours")
    ax.set_ylabel("GPUs")
    ax.set_title("GPUs provisioned and busy (fig. 8)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    written.append(_save(fig, out_dir / "gpu_timeline.png", plt))

    fig, ax = plt.subplots(figsize=(9, 4))
    ax2 = ax.twinx()
    for name, record in runs.items():
        t, ratio, migrations = _timeline_columns(record, (0, 7, 8))
        line = ax.plot(t / 3600, ratio, label=f"{name}: subscription ratio")[0]
        ax2.plot(t / 3600, migrations, linestyle=":", color=line.get_color(),
                 label=f"{name}: migrations (cumulative)")
    ax.set_xlabel("hours")
    ax.set_ylabel("cluster subscription ratio")
    ax2.set_ylabel("migrations")
    ax.set_title("Subscription ratio and migrations (fig. 10)")
    ax.grid(True, alpha=0.3)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize="small")
    written.append(_save(fig, out_dir / "subscription_migrations.png", plt))

    fig, ax = plt.subplots(figsize=(9, 4))
    for name, record in runs.items():
        t, prov = _timeline_columns(record, (0, 5))
        if t.size < 2:
            continue
        cost = np.concatenate([[0.0], np.cumsum(prov[:-1] * np.diff(t))]) / 3600 * gpu_usd_per_hour
        ax.plot(t / 3600, cost, label=name)
    ax.set_xlabel("hours")
    ax.set_ylabel("provider cost (USD, cumulative)")
    ax.set_title("Provider cost (fig. 12a)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    written.append(_save(fig, out_dir / "cost.png", plt))
    return written


def _timeline_columns(record: RunRecord, columns: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    if not record.timeline:
        return tuple(np.zeros(0) for _ in columns)
    data = np.asarray([[row[c] for c in columns] for row in record.timeline], dtype=float)
    return tuple(data[:, i] for i in range(len(columns)))


def _save(fig, path: Path, plt) -> Path:  # noqa: ANN001
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
