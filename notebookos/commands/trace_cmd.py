"""``notebookos trace``: generate a Sensei-calibrated session template, or print a trace's stats.

Both show a tqdm progress bar on stderr while they work, and nothing when stderr is not a
terminal (tqdm's ``disable=None``), so pipes and logs stay clean."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def progress_bar(desc: str, total: float | None, unit: str) -> Iterator[Callable[[float], None]]:
    """A callback that moves a tqdm bar to an absolute position; quiet off a terminal."""
    from tqdm import tqdm

    with tqdm(total=total, desc=desc, unit=unit, disable=None, leave=False,
              file=sys.stderr) as bar:
        def update(position: float) -> None:
            bar.update(int(position) - bar.n)

        yield update


def register(subparsers: argparse._SubParsersAction) -> None:
    from notebookos.workload.readers import FORMATS, TIME_UNITS

    parser = subparsers.add_parser(
        "trace", help="generate synthetic workloads and print trace statistics",
        description="Generate a Sensei-calibrated session template, or print the statistics the "
                    "calibration is checked against (docs/simulator.md).",
    )
    actions = parser.add_subparsers(dest="trace_action", metavar="ACTION", required=True)
    gen = actions.add_parser("generate", help="write a synthetic session template")
    gen.add_argument("--kind", choices=("sensei",), default="sensei")
    gen.add_argument("--hours", type=float, required=True, help="length of the trace")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--out", type=Path, required=True, metavar="FILE")
    gen.add_argument("--session-rate", type=float, default=None, metavar="PER_HOUR",
                     help="session arrivals per hour (default 5.2)")
    gen.add_argument("--session-hours", type=float, default=None, metavar="MEDIAN",
                     help="median session life in hours (default 72)")
    gen.add_argument("--idle-sessions", type=float, default=None, metavar="FRACTION",
                     help="share of sessions that never train (default 0.3)")
    gen.add_argument("--break-probability", type=float, default=None, metavar="P",
                     help="chance that the user leaves for a while after a cell (default 0.05)")
    gen.add_argument("--break-hours", type=float, default=None, metavar="MEAN",
                     help="mean length of such a break in hours (default 3)")
    gen.set_defaults(func=run_generate)
    stats = actions.add_parser("stats", help="print a trace's calibration statistics")
    stats.add_argument("file", type=Path)
    stats.add_argument("--format", choices=FORMATS, default="template")
    stats.add_argument("--time-unit", choices=tuple(TIME_UNITS), default=None)
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.set_defaults(func=run_stats)


def run_generate(args: argparse.Namespace) -> int:
    from notebookos.workload.generator import SenseiParams, write_sensei

    overrides = {k: v for k, v in (("session_rate_per_hour", args.session_rate),
                                   ("session_hours_median", args.session_hours),
                                   ("idle_session_fraction", args.idle_sessions),
                                   ("break_probability", args.break_probability),
                                   ("break_hours_mean", args.break_hours)) if v is not None}
    try:
        params = SenseiParams(hours=args.hours, seed=args.seed, **overrides)
    except ValueError as exc:
        print(f"notebookos trace generate: {exc}", file=sys.stderr)
        return 2
    with progress_bar("generating", args.hours, "h") as progress:
        template = write_sensei(params, args.out, progress)
    tasks = sum(len(s["trainings"]) for s in template["sessions"])
    print(f"wrote {args.out}: {len(template['sessions'])} sessions, {tasks} tasks, "
          f"{args.hours:g} hours (seed {args.seed})")
    return 0


def run_stats(args: argparse.Namespace) -> int:
    from notebookos.workload.model import TraceError
    from notebookos.workload.readers import read_trace
    from notebookos.workload.stats import trace_stats

    try:
        workload = read_trace(args.file, args.format, args.time_unit)
        with progress_bar("statistics", len(workload.sessions), "sessions") as progress:
            stats = trace_stats(workload, progress)
    except TraceError as exc:
        print(f"notebookos trace stats: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    targets = stats.pop("sensei_targets")
    print(f"{args.file}: {stats['sessions']} sessions, {stats['tasks']} tasks, "
          f"{stats['span_hours']} hours")
    for key in ("task_duration_min", "gap_min"):
        values = "  ".join(f"{k}={v:g}" for k, v in stats[key].items())
        want = "  ".join(f"{k}={v}" for k, v in targets[key].items())
        print(f"{key:>28}: {values}\n{'Sensei':>28}: {want}")
    for key in ("active_sessions", "concurrent_trainings"):
        print(f"{key:>28}: " + "  ".join(f"{k}={v:g}" for k, v in stats[key].items()))
    for key in ("idle_reserved_gpu_fraction", "sessions_util_le_5pct", "sessions_util_le_31pct"):
        print(f"{key:>28}: {stats[key]}   (Sensei {targets[key]})")
    print(f"{'sessions_never_training':>28}: {stats['sessions_never_training']}")
    print(f"{'Sensei 17.5 h excerpt':>28}: {targets['excerpt_17_5h']}")
    return 0
