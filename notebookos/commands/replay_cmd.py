"""``notebookos replay``: play notebook sessions through Jupyter Server against a live cluster,
beside the simulator's prediction for the same input (docs/replay.md)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:
    from notebookos.replay.cells import WORK_KINDS

    parser = subparsers.add_parser(
        "replay", help="replay notebook sessions against a live cluster (workload driver)",
        description="Play a session template, a Sensei trace slice or the Sensei-calibrated "
                    "generator's output through Jupyter Server (one kernel and websocket per "
                    "session, cells at the trace's times), measure every cell, and run the "
                    "same input through the simulator. See docs/replay.md.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--template", type=Path, metavar="JSON",
                        help="a NotebookOS session template (ticks of 60 s)")
    source.add_argument("--sensei", type=Path, metavar="CSV",
                        help="a Sensei job trace (Tiresias CSV in minutes, or a *_sec/canonical "
                             "file in seconds), grouped into sessions by the Sensei model")
    source.add_argument("--generate", type=float, metavar="HOURS",
                        help="the Sensei-calibrated generator's output, HOURS of trace")
    source.add_argument("--resimulate", type=Path, metavar="RUN_DIR",
                        help="no live run: simulate a finished run's plan again (with other "
                             "--sim-set values) beside its live figures; writes to --out")
    parser.add_argument("--time-scale", type=float, default=1.0, metavar="F",
                        help="multiply every trace time by F (0.02 plays a 60 s tick in 1.2 s; "
                             "default 1)")
    parser.add_argument("--sessions", type=int, default=None, metavar="N",
                        help="play only the first N sessions (by start time)")
    parser.add_argument("--training-only", action="store_true",
                        help="with --sessions: count only sessions that run cells")
    parser.add_argument("--window", default=None, metavar="START:END",
                        help="trace-time window, e.g. 2h:4h or 0:90m (before --time-scale)")
    parser.add_argument("--no-idle-sessions", action="store_true",
                        help="--sensei: do not add the sessions that never train")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the session grouping, the generator and the simulator")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--url", help="a running Jupyter Server with NotebookOS, e.g. "
                                      "http://127.0.0.1:8888")
    target.add_argument("--local", metavar="HOSTSxGPUS",
                        help="start an embedded cluster of HOSTS hosts with GPUS (virtual) GPUs "
                             "each for this run, and stop it afterwards")
    parser.add_argument("--token", default="", help="--url: the Jupyter Server token")
    parser.add_argument("--policy", default=None,
                        help="--local: the scheduling policy (default from the configuration)")
    parser.add_argument("--autoscale", action="store_true",
                        help="let the cluster (and the simulator) scale out; --local keeps a "
                             "fixed cluster otherwise")
    parser.add_argument("--max-hosts", type=int, default=None,
                        help="with --autoscale: the most hosts (default 2 x HOSTS)")
    parser.add_argument("--cluster-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="--local: a cluster setting, e.g. cluster.max_subscription_ratio=7")
    parser.add_argument("--work", choices=WORK_KINDS, default="sleep",
                        help="what a cell does: sleep for its duration holding its GPUs, or "
                             "train a small torch model on them (default sleep)")
    parser.add_argument("--cell-timeout", type=float, default=120.0, metavar="S",
                        help="a cell with no reply this long after its expected end fails "
                             "(default 120)")
    parser.add_argument("--immediate-threshold", type=float, default=1.0, metavar="S",
                        help="a cell counts as given its GPUs immediately if it was not migrated "
                             "and its code started within S seconds (default 1)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="output folder (default replay-runs/<time>-<policy>)")
    parser.add_argument("--no-simulate", action="store_true", help="skip the simulator run")
    parser.add_argument("--sim-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a simulator setting, e.g. container_start_s=5 (docs/simulator.md)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--dry-run", action="store_true",
                        help="print what would be played and exit")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _pairs(items: list[str], flag: str) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key.strip()] = _value(raw)
    return out


def build_plan(args: argparse.Namespace):  # noqa: ANN201 - a Workload
    from notebookos.replay import plan

    if args.template is not None:
        workload = plan.load_input("template", args.template, args.seed)
    elif args.sensei is not None:
        workload = plan.load_input("sensei", args.sensei, args.seed,
                                   idle_sessions=not args.no_idle_sessions)
    else:
        workload = plan.load_input("generate", None, args.seed, hours=args.generate)
    if args.window:
        workload = plan.window(workload, *plan.parse_window(args.window))
    if args.sessions is not None:
        workload = plan.first_sessions(workload, args.sessions, args.training_only)
    return plan.scale_time(plan.rebase_to_zero(workload), args.time_scale)


def run(args: argparse.Namespace) -> int:
    from notebookos.simulator.config import SimConfig, parse_cluster
    from notebookos.workload.model import TraceError

    try:
        sim_settings = _pairs(args.sim_set, "--sim-set")
        if args.resimulate is not None:
            return _resimulate(args, sim_settings)
        if not args.url and not args.local:
            raise ValueError("say where to replay: --url URL or --local HOSTSxGPUS")
        workload = build_plan(args)
        known = {f.name for f in dataclasses.fields(SimConfig)} - {
            "hosts", "gpus_per_host", "autoscale", "max_hosts", "seed", "policy_params"}
        unknown = sorted(set(sim_settings) - known)
        if unknown:
            raise ValueError(f"--sim-set {', '.join(unknown)}: unknown simulator setting(s); "
                             f"known: {', '.join(sorted(known))}")
        SimConfig(**sim_settings)  # refuse bad values before the run
        cluster_values = _pairs(args.cluster_set, "--cluster-set")
        # The simulation beside the replay serves waiting cells in the live cluster's order.
        order = cluster_values.get("global_scheduler.cell_order")
        if order is not None and "cell_order" not in sim_settings:
            sim_settings["cell_order"] = order
            SimConfig(**sim_settings)
        local = parse_cluster(args.local) if args.local else None
        if args.cell_timeout <= 0 or args.immediate_threshold < 0:
            raise ValueError("--cell-timeout must be > 0 and --immediate-threshold >= 0")
    except (ValueError, TypeError, TraceError) as exc:
        print(f"notebookos replay: {exc}", file=sys.stderr)
        return 2
    span = workload.span_s
    print(f"replay: {len(workload.sessions)} sessions, {workload.task_count} cells, "
          f"{span:.1f} s of replay time (time scale {args.time_scale:g}); source "
          f"{workload.source}", file=sys.stderr)
    if args.dry_run:
        return 0
    if local is None:
        return _replay(args, workload, args.url, args.token, None, sim_settings)
    from notebookos.commands._replay_local import LocalCluster
    from notebookos.config import ConfigError

    hosts, gpus = local

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # stop the cluster on SIGTERM too, while it starts
    try:
        if args.policy is not None:
            cluster_values["cluster.policy"] = args.policy
        policy = cluster_values.pop("cluster.policy", None)
        from notebookos.config import load_config

        policy = policy or load_config(args.config).cluster.policy
        cluster = LocalCluster(hosts, gpus, policy, autoscale=args.autoscale,
                               max_hosts=args.max_hosts or (2 * hosts if args.autoscale else None),
                               extra=cluster_values, config_path=args.config)
    except (ConfigError, KeyError) as exc:
        print(f"notebookos replay: {exc}", file=sys.stderr)
        return 2
    from notebookos.replay.compare import settings_from_live

    sim_settings = settings_from_live(cluster.config, sim_settings)
    out = _out_dir(args, cluster.config.cluster.policy)
    try:
        print(f"replay: starting a local cluster ({hosts} hosts x {gpus} GPUs, policy "
              f"{policy}) ...", file=sys.stderr)
        try:
            url = cluster.start()
        except RuntimeError as exc:
            print(f"notebookos replay: the local cluster did not start: {exc}", file=sys.stderr)
            return 1
        return _replay(args, workload, url, cluster.token, cluster, sim_settings, out)
    except KeyboardInterrupt:
        print("notebookos replay: interrupted while starting", file=sys.stderr)
        return 130
    finally:
        leftovers = cluster.stop(keep_logs=out / "cluster-logs")
        print("replay: local cluster stopped" + (f" (killed leftovers {leftovers})"
                                                 if leftovers else ""), file=sys.stderr)


def _out_dir(args: argparse.Namespace, policy: str) -> Path:
    if args.out is not None:
        return args.out
    return Path("replay-runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{policy}"


def _replay(args: argparse.Namespace, workload, url: str, token: str,  # noqa: ANN001
            cluster, sim_settings: dict[str, Any], out: Path | None = None) -> int:
    from notebookos.replay.jupyter import JupyterServer, ServerError

    try:
        JupyterServer(url, token)  # refuse a malformed --url before anything starts
    except ValueError as exc:
        print(f"notebookos replay: {exc}", file=sys.stderr)
        return 2
    try:
        try:
            outcome = asyncio.run(_play(args, workload, url, token, cluster))
        except ServerError as exc:
            print(f"notebookos replay: {exc}", file=sys.stderr)
            return 1
        played, run_result, policy, shape, config = outcome
        out = out or _out_dir(args, policy)
        summary = _finish(args, played, run_result, policy, shape, config, url,
                          cluster is not None, sim_settings, out)
        if cluster is not None:  # removed with everything else when the run ends (tests check)
            summary["local_state_dir"] = str(cluster.state_dir)
            (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True)
                                              + "\n")
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        print((out / "comparison.md").read_text())
        print(f"replay: results in {out}", file=sys.stderr)
    return 130 if run_result.interrupted else 0


def _patient_ctrl_c() -> None:
    """From the end of the run until its results are written: the first Ctrl-C (often the
    impatient second one of a user who stopped the run, when the sessions closed quickly) is
    told to wait; another one abandons the writing. Without it, that Ctrl-C cut the writing
    short and what was measured was lost."""
    def wait(*_: object) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("\nreplay: writing what was measured; Ctrl-C again abandons it", file=sys.stderr)

    signal.signal(signal.SIGINT, wait)


async def _play(args: argparse.Namespace, workload, url: str, token: str,  # noqa: ANN001
                cluster) -> tuple:  # noqa: ANN001
    from notebookos.config import load_config
    from notebookos.replay.driver import Replay, ReplayOptions
    from notebookos.replay.jupyter import JupyterServer
    from notebookos.replay.plan import as_played
    from notebookos.replay.progress import ReplayProgress

    server = JupyterServer(url, token)
    specs = await server.notebookos_kernelspecs()
    if not specs:
        from notebookos.replay.jupyter import ServerError

        raise ServerError(f"{url} offers no NotebookOS kernelspec: is NotebookOS installed "
                          "there (notebookos kernelspec install)?")
    offered: dict[int, Any] = {}
    for _, spec in sorted(specs.items(), key=lambda kv: (kv[1].gpus, kv[0])):
        offered.setdefault(spec.gpus, spec)
    played = as_played(workload, offered)
    doc = await server.notebookos_cluster() or {}
    config = cluster.config if cluster is not None else load_config(getattr(args, "config", None))
    policy = doc.get("policy") or (args.policy or config.cluster.policy)
    if cluster is not None:
        shape = (cluster.hosts, cluster.gpus_per_host)
    else:
        per_host = [int((h.get("gpus") or {}).get("total", 0)) for h in doc.get("hosts") or []]
        shape = (len(per_host), max(per_host, default=1)) if per_host else (0, 1)
    options = ReplayOptions(work=args.work, cell_timeout_s=args.cell_timeout,
                            immediate_threshold_s=args.immediate_threshold, seed=args.seed,
                            policy=policy)
    print(f"replay: playing {len(played.sessions)} sessions against {url} (policy {policy}); "
          "Ctrl-C stops and keeps what was measured", file=sys.stderr, flush=True)
    progress = ReplayProgress(played.task_count, played.span_s, quiet=args.quiet,
                              time_scale=args.time_scale)
    replay = Replay(server, played, options, progress)
    replay.use_kernelspecs(specs)
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(replay.run())

    def stop() -> None:
        print("\nreplay: stopping (closing the sessions; what was measured is kept) ...",
              file=sys.stderr)
        task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    watcher = asyncio.ensure_future(_watch_cluster(cluster, replay))
    try:
        result = await task
    finally:
        watcher.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        _patient_ctrl_c()
        progress.close()
    result.notes = list(getattr(replay, "cluster_notes", []))
    return played, result, policy, shape, config


async def _watch_cluster(cluster, replay) -> None:  # noqa: ANN001
    """--local: restart a daemon that died, as ``notebookos up`` does, and note it (the run goes
    on; cells that it breaks fail with their reasons)."""
    if cluster is None:
        return
    replay.cluster_notes = []
    given_up = False
    while True:
        await asyncio.sleep(1.0)
        why = None if given_up else cluster.supervise()
        while cluster.notes:
            note = cluster.notes.pop(0)
            replay.cluster_notes.append(f"{replay.now():.1f} s: {note}")
            print(f"\nreplay: {note}", file=sys.stderr)
        if why and not given_up:
            given_up = True
            replay.cluster_notes.append(f"{replay.now():.1f} s: {why}")
            print(f"\nreplay: {why}", file=sys.stderr)


def _finish(args: argparse.Namespace, played, run_result, policy: str,  # noqa: ANN001
            shape: tuple[int, int], config, url: str, local: bool,  # noqa: ANN001
            sim_settings: dict[str, Any], out: Path) -> dict[str, Any]:
    from notebookos.replay.compare import live_policy_params, live_profile_spec
    from notebookos.replay.plan import played_to_json, played_until
    from notebookos.replay.records import COMPLETED, summarize, write_run

    summary = summarize(run_result, reservation=policy == "reservation")
    source = {"template": args.template, "sensei": args.sensei}
    summary.update({
        "policy": policy, "time_scale": args.time_scale, "work": args.work, "seed": args.seed,
        "input": str(source["template"] or source["sensei"] or f"generate {args.generate} h"),
        "source": played.source, "window": args.window, "sessions_requested": args.sessions,
        "cluster": f"{shape[0]}x{shape[1]}", "target": "local" if local else url,
        "autoscale": bool(args.autoscale), "immediate_threshold_s": args.immediate_threshold,
        "planned_span_s": round(played.span_s, 3),
    })
    summary["max_hosts"] = args.max_hosts or shape[0] * (2 if args.autoscale else 1)
    params = live_policy_params(config) if config.cluster.policy == policy else {}
    profile = live_profile_spec(config) if config.cluster.policy == policy else None
    write_run(out, summary, run_result)
    delays = [t.interactivity_s for t in run_result.tasks if t.interactivity_s is not None]
    tcts = [t.tct_s for t in run_result.tasks if t.status == COMPLETED and t.tct_s is not None]
    # A stopped run is compared with the simulation of the part it played, not the whole plan.
    stopped = run_result.stopped_at_s
    simulated = played if stopped is None else played_until(played, stopped)
    _simulate_and_write(args, simulated, summary, params, sim_settings, out, delays, tcts,
                        profile)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    (out / "plan.json").write_text(json.dumps(played_to_json(played), indent=1) + "\n")
    return summary


def _simulate_and_write(args: argparse.Namespace, played, summary: dict[str, Any],  # noqa: ANN001
                        params: dict[str, Any], sim_settings: dict[str, Any], out: Path,
                        live_delays: list[float], live_tcts: list[float],
                        profile: dict[str, Any] | None = None) -> None:
    """The simulator beside the live figures: simulated/, comparison.md, the CDF plot; under
    the live scheduler's ``profile`` spec when known."""
    from notebookos.replay.compare import comparison_table, plot_live_vs_simulated, simulate_played
    from notebookos.simulator.config import parse_cluster
    from notebookos.simulator.output import write_run as write_sim_run

    hosts, gpus = parse_cluster(summary["cluster"])
    record = None
    if not args.no_simulate and hosts > 0 and played is not None:
        figures, record = simulate_played(
            played, summary["policy"], hosts, gpus, params, autoscale=bool(summary["autoscale"]),
            max_hosts=summary.get("max_hosts") or hosts, seed=int(summary["seed"]),
            settings=sim_settings, profile=profile)
        summary["simulated"] = figures
        write_sim_run(out / "simulated", figures["simulator_summary"], record)
    table = comparison_table(summary, summary.get("simulated"))
    (out / "comparison.md").write_text(
        f"# Replay: {summary['input']}\n\npolicy {summary['policy']}, cluster "
        f"{summary['cluster']}, time scale {summary['time_scale']:g}, work {summary['work']}, "
        f"{summary['sessions']} sessions"
        + (f"; simulator settings {sim_settings}" if sim_settings else "")
        + (f"; stopped at {summary['stopped_at_s']:.1f} s: both sides are the cells due by then"
           if summary.get("stopped_at_s") is not None else "") + f"\n\n{table}\n")
    if not args.no_plots:
        title = (f"{Path(summary['input']).name}: policy {summary['policy']}, cluster "
                 f"{summary['cluster']}, time scale {summary['time_scale']:g}, seed "
                 f"{summary['seed']}" + (f", simulator {sim_settings}" if sim_settings else ""))
        plot_live_vs_simulated(out, title, live_delays, live_tcts, record)


def _resimulate(args: argparse.Namespace, sim_settings: dict[str, Any]) -> int:
    import csv

    from notebookos.replay.plan import played_from_json, played_until

    run_dir = args.resimulate
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        played = played_from_json(json.loads((run_dir / "plan.json").read_text()),
                                  str(run_dir / "plan.json"))
        rows = list(csv.DictReader((run_dir / "tasks.csv").open()))
    except (OSError, ValueError) as exc:
        print(f"notebookos replay: --resimulate {run_dir}: not a replay output folder ({exc})",
              file=sys.stderr)
        return 2
    if summary.get("stopped_at_s") is not None:  # a stopped run: the part it played
        played = played_until(played, float(summary["stopped_at_s"]))
    out = args.out or run_dir / "resimulated"
    out.mkdir(parents=True, exist_ok=True)
    stored = (summary.get("simulated") or {}).get("settings", {})
    params = stored.get("policy_params", {})
    profile = stored.get("profile")  # None: a run recorded before the profile was
    from notebookos.replay.compare import resimulate_settings

    sim_settings = resimulate_settings(summary, sim_settings)
    summary.pop("simulated", None)
    summary["resimulated_from"] = str(run_dir)
    delays = [float(r["interactivity_s"]) for r in rows if r["interactivity_s"]]
    tcts = [float(r["tct_s"]) for r in rows if r["status"] == "completed" and r["tct_s"]]
    _simulate_and_write(args, played, summary, params, sim_settings, out, delays, tcts,
                        profile)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    print(json.dumps(summary, indent=2, sort_keys=True) if args.json
          else (out / "comparison.md").read_text())
    return 0
