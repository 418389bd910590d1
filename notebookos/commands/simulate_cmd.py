"""``notebookos simulate``: run a trace through one policy, or compare several (docs/simulator.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

SUMMARY_COLUMNS = (
    ("policy", "policy", "{}"), ("jobs", "tasks", "{}"), ("avg_jct_s", "avg JCT s", "{:.1f}"),
    ("p99_jct_s", "p99 JCT s", "{:.1f}"), ("avg_queue_s", "avg queue s", "{:.1f}"),
    ("p999_queue_s", "p99.9 queue s", "{:.0f}"),
    ("interactivity_p50_s", "delay p50", "{:.1f}"), ("interactivity_p99_s", "delay p99", "{:.1f}"),
    ("immediate_fraction", "immediate", "{:.3f}"),
    ("executor_reuse_fraction", "reuse", "{:.3f}"), ("migrations", "migr.", "{}"),
    ("gpu_hours_provisioned", "GPU-h prov.", "{:.1f}"), ("gpu_hours_used", "GPU-h used", "{:.1f}"),
    ("cost_usd", "cost $", "{:.0f}"), ("revenue_usd", "revenue $", "{:.0f}"),
    ("wall_s", "wall s", "{:.2f}"),
)
# Shown when a run hibernated (--hibernate-after-s).
HIBERNATION_COLUMNS = (
    ("replica_hours", "replica-h", "{:.0f}"),
    ("replica_hours_without_hibernation", "replica-h awake", "{:.0f}"),
    ("hibernations", "hibern.", "{}"), ("wakes", "wakes", "{}"),
    ("wake_delay_p50_s", "wake p50 s", "{:.1f}"), ("wake_delay_p99_s", "wake p99 s", "{:.1f}"),
)


def register(subparsers: argparse._SubParsersAction) -> None:
    from notebookos.policies import DEFAULT_POLICY, policy_names
    from notebookos.workload.readers import FORMATS, TIME_UNITS

    parser = subparsers.add_parser(
        "simulate", help="trace-driven simulation of the scheduling policies",
        description="Run a trace through a policy (or --compare several) on a simulated cluster. "
                    f"Policies: {', '.join(policy_names())}.",
    )
    parser.add_argument("--trace", required=True, metavar="PATH", help="the trace file")
    parser.add_argument("--format", required=True, choices=FORMATS, help="the trace's format")
    parser.add_argument("--time-unit", choices=tuple(TIME_UNITS), default=None,
                        help="unit of the trace's times (default: s for tiresias/canonical, ms for "
                             "muri, min (= template ticks) for template)")
    parser.add_argument("--cluster", default="4x8", metavar="HOSTSxGPUS",
                        help="initial (and smallest) cluster; the fixed cluster for job policies "
                             "(default 4x8)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--policy", default=None, help=f"policy (default {DEFAULT_POLICY})")
    group.add_argument("--compare", default=None, metavar="P1,P2,...",
                       help="run several policies and write one report")
    parser.add_argument("--job-types", choices=("trace", "table1"), default="trace",
                        help="job traces: keep the trace's model names (default), or give each "
                             "job one of the 29 types of TensorShare's Table 1 by a hash of its "
                             "id and --seed, as that paper's simulation did")
    parser.add_argument("--placement", choices=("pooled", "consolidated", "sensitive"),
                        default="pooled",
                        help="job policies: may a job's GPUs span hosts (default pooled; "
                             "sensitive: only models slowed by a spread wait for one host, as "
                             "Tiresias consolidates)")
    parser.add_argument("--placement-slowdown", choices=("off", "model"), default=None,
                        help="job policies: model: a job spread over hosts runs slower by its "
                             "model's factor, and placement prefers one host (Themis's S(G); "
                             "default off, the same as --set placement_slowdown=...)")
    parser.add_argument("--seed", type=int, default=0, help="seed (the run is deterministic)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="write summary.json, tasks.csv, timeline.csv and plots here")
    parser.add_argument("--no-autoscale", action="store_true",
                        help="session policies: keep the cluster at --cluster")
    parser.add_argument("--max-hosts", type=int, default=100_000, help="autoscaler's ceiling")
    parser.add_argument("--hibernate-after-s", type=float, default=None, metavar="S",
                        help="session kernels with no cell for S seconds hibernate (replicas "
                             "stopped) and the next cell wakes them, as live "
                             "global_scheduler.hibernate_after_s (live default 3600); 0 or "
                             "unset: never (the same as --set hibernate_after_s=S)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a simulator setting, e.g. container_start_s=20 (docs/simulator.md)")
    parser.add_argument("--policy-param", action="append", default=[], metavar="POLICY.KEY=VALUE",
                        help="a policy parameter, e.g. tiresias.thresholds=[3600,36000]")
    parser.add_argument("--config", default=None, metavar="PATH",
                        help="simulate under the scheduling profile a live Global Scheduler "
                             "configured by this NotebookOS config file runs: its policy "
                             "(the default for --policy), queue order, post-filters and scale "
                             "plug-ins with their sections (global_scheduler.plugin_config), "
                             "and its hibernate_after_s; --set, --policy-param and "
                             "--hibernate-after-s take precedence")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--json", action="store_true", help="print the summaries as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def _value(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _live_profile(args: argparse.Namespace) -> dict | None:
    """``--config``: the profile spec the live Global Scheduler runs under that file (the same
    function as its daemon's), with the live settings the simulator mirrors under ``settings``.
    A bad file or setting raises ``ValueError`` (``ConfigError``) with the file's own message."""
    if getattr(args, "config", None) is None:
        return None
    from notebookos.config import load_config
    from notebookos.policies.profile import profile_spec

    path = Path(args.config)
    if not path.exists():
        raise ValueError(f"--config {args.config}: no such file")
    try:
        config = load_config(path)
    except ValueError as exc:  # ConfigError: the file's own message
        raise ValueError(f"--config {args.config}: {exc}") from exc
    gs = config.global_scheduler
    return {**profile_spec(config),
            "settings": {"cell_order": gs.cell_order, "hibernate_after_s": gs.hibernate_after_s}}


def _profiles(live: dict | None, names: list[str], config) -> dict:  # noqa: ANN001
    """The ``Profile`` to run each policy under: the live one for the live policy (with the
    queue order the simulator's settings name), none (the policy's own) for the others."""
    if live is None:
        return {}
    from notebookos.policies.profile import Profile
    from notebookos.replay.compare import simulated_profile

    spec = {k: v for k, v in live.items() if k != "settings"}
    if spec["policy"] not in names:
        return {}
    spec = simulated_profile(spec, {"cell_order": config.cell_order})
    params = config.policy_params.get(spec["policy"])
    if params:  # --policy-param over the file's section
        sections = dict(spec.get("config") or {})
        sections["policy"] = {**sections.get("policy", {}), **params}
        spec = {**spec, "config": sections}
    return {spec["policy"]: Profile.load(spec)}


def build_config(args: argparse.Namespace, live: dict | None = None):  # noqa: ANN201
    """The simulator's settings: ``--config``'s live settings (``live``), then ``--set``,
    ``--hibernate-after-s``, ``--placement-slowdown`` and ``--policy-param`` over them."""
    from notebookos.simulator.config import SimConfig, parse_cluster

    hosts, gpus = parse_cluster(args.cluster)
    settings: dict[str, object] = dict((live or {}).get("settings", {}))
    known = {f.name for f in dataclasses.fields(SimConfig)} - {"policy_params"}
    for item in args.set:
        key, sep, raw = item.partition("=")
        if not sep or key not in known:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE with KEY one of "
                             f"{', '.join(sorted(known))}")
        settings[key] = _value(raw)
    if args.hibernate_after_s is not None:
        settings["hibernate_after_s"] = args.hibernate_after_s
    if getattr(args, "placement_slowdown", None) is not None:
        settings["placement_slowdown"] = args.placement_slowdown
    params: dict[str, dict[str, object]] = {}
    for item in args.policy_param:
        key, sep, raw = item.partition("=")
        policy, dot, name = key.partition(".")
        if not sep or not dot or not name:
            raise ValueError(f"--policy-param {item!r}: expected POLICY.KEY=VALUE")
        params.setdefault(policy, {})[name] = _value(raw)
    return SimConfig(hosts=hosts, gpus_per_host=gpus, placement=args.placement,
                     autoscale=not args.no_autoscale, max_hosts=max(args.max_hosts, hosts),
                     seed=args.seed, policy_params=params, **settings)


def run(args: argparse.Namespace) -> int:
    from notebookos.policies import DEFAULT_POLICY, get_policy
    from notebookos.simulator.output import write_run
    from notebookos.simulator.progress import ProgressBar
    from notebookos.simulator.runner import simulate
    from notebookos.workload.model import TraceError
    from notebookos.workload.readers import read_trace

    try:
        live = _live_profile(args)
        default = live["policy"] if live is not None else DEFAULT_POLICY
        names = [n.strip() for n in (args.compare or args.policy or default).split(",")
                 if n.strip()]
        config = build_config(args, live)
        for name in names:
            get_policy(name, **config.policy_params.get(name, {}))
        profiles = _profiles(live, names, config)
        workload = read_trace(args.trace, args.format, args.time_unit)
        if args.job_types != "trace":
            from notebookos.workload.job_types import assign_types

            workload = assign_types(workload, args.job_types, args.seed)
    except (ValueError, TypeError, TraceError, OSError) as exc:
        print(f"notebookos simulate: {exc}", file=sys.stderr)
        return 2
    summaries, records = [], {}
    for name in names:
        bar = ProgressBar(f"{name:>12}", enabled=False if args.quiet else None)
        try:
            summary, record = simulate(workload, name, config, bar, profile=profiles.get(name))
        finally:
            bar.close()
        summaries.append(summary)
        records[name] = record
        if args.out is not None:
            write_run(args.out / name if len(names) > 1 else args.out, summary, record)
    if args.out is not None:
        if len(names) > 1:
            (args.out / "compare.json").write_text(json.dumps(summaries, indent=2) + "\n")
        if not args.no_plots:
            from notebookos.simulator.plots import plot_runs

            subtitle = (f"trace {trace_label(Path(args.trace))}, cluster {args.cluster} "
                        f"({'autoscaled from there' if not args.no_autoscale else 'fixed'} for "
                        f"session policies), simulate --seed {args.seed}")
            plot_runs(args.out, records, config.gpu_usd_per_hour, subtitle,
                      {s["policy"]: s for s in summaries}, config.immediate_within_s)
    if args.json:
        print(json.dumps(summaries if len(names) > 1 else summaries[0], indent=2))
    else:
        print(format_table(summaries))
    return 0


def trace_label(path: Path) -> str:
    """The trace's file name and, for a generated template, its title and generator seed (the
    seed that decides the workload; ``simulate --seed`` does not change a session run)."""
    label = path.name
    try:
        with path.open("rb") as handle:
            head = handle.read(4096).decode("utf-8", errors="replace")
    except OSError:
        return label
    title = re.search(r'"workloadTitle"\s*:\s*"([^"]*)"', head)
    seed = re.search(r'"workloadSeed"\s*:\s*(-?\d+)', head)
    if title and seed:
        label += f" ({title.group(1)}, generated with --seed {seed.group(1)})"
    return label


def format_table(summaries: list[dict]) -> str:
    columns = SUMMARY_COLUMNS
    if any(s.get("hibernations") for s in summaries):
        columns += HIBERNATION_COLUMNS
    header = [label for _, label, _ in columns]
    rows = [[("-" if s.get(key) is None else fmt.format(s[key])) for key, _, fmt in columns]
            for s in summaries]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)
