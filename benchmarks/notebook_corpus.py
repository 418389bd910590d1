"""The notebook corpus as a benchmark: do real public notebooks give plain IPython's outputs on
NotebookOS, and with a SIGKILL of the executor replica after every cell?

``notebookos up --hosts 4`` in a temporary directory; every notebook of tests/jupyter/corpus/
(its manifest.json says where each came from) run cell by cell through Jupyter Server on plain
ipykernel ``python3`` (the reference), on the ``notebookos`` kernel, and on the ``notebookos``
kernel with the executor SIGKILLed after every cell (each kill once the kernel shows three live
replicas again). Outputs are compared cell by cell after normalisation
(notebookos/testing/differential.py says exactly what is normalised). Every cell has a timeout:
a cell that never answers is a hang, counted apart.

Prints a table (notebook, cells, matches / mismatches without faults, with kills: matches /
mismatches / hangs, times), then every mismatch with the cell's code and what differed.

Usage::

    python benchmarks/notebook_corpus.py [--smoke] [--notebooks a,b] [--no-kills]
        [--timeout 120] [--json FILE] [--keep DIR]

``--smoke`` runs one small notebook only. Exit status 1 when a cell mismatched or hung.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

from notebookos.testing import smoke
from notebookos.testing.differential import (
    CELL_TIMEOUT_S,
    MODES,
    CellVerdict,
    Comparison,
    as_json,
    describe,
    differential,
    from_json,
    load_corpus,
)
from notebookos.testing.up_session import UpCluster

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "jupyter" / "corpus"
SMOKE = "pytudes-cheryl"
_ACTIVE: list[UpCluster] = []


def table(rows: list[dict], modes: tuple[str, ...]) -> str:
    """``rows``: ``Comparison.row()`` of each notebook."""
    head = "| notebook | cells | plain (s) |"
    rule = "|---|---|---|"
    titles = {"notebookos": "no faults", "kills": "with kills", "control": "plain again"}
    for mode in modes[1:]:
        head += f" {titles[mode]}: matches / mismatches / hangs |"
        head += " kills | (s) |" if mode == "kills" else " (s) |"
        rule += "---|---|---|" if mode == "kills" else "---|---|"
    lines = [head, rule]
    total = {"cells": 0, "plain": 0.0}
    for mode in modes[1:]:
        total[mode] = [0, 0, 0, 0, 0.0]
    for row in rows:
        total["cells"] += row["cells"]
        total["plain"] += row["plain_seconds"]
        line = f"| {row['notebook']} | {row['cells']} | {row['plain_seconds']:.1f} |"
        for mode in modes[1:]:
            r = row[mode]
            t = total[mode]
            t[0] += r["matches"]
            t[1] += r["mismatches"]
            t[2] += r["hangs"]
            t[3] += r["kills"]
            t[4] += r["seconds"]
            hangs = f"{r['hangs']}" + (f" (+{r['not_run']} not run)" if r["not_run"] else "")
            line += f" {r['matches']} / {r['mismatches']} / {hangs} |"
            if mode == "kills":
                line += f" {r['kills']} |"
            line += f" {r['seconds']:.1f} |"
        lines.append(line)
    line = f"| all | {total['cells']} | {total['plain']:.1f} |"
    for mode in modes[1:]:
        t = total[mode]
        line += f" {t[0]} / {t[1]} / {t[2]} |" + (f" {t[3]} |" if mode == "kills" else "") \
            + f" {t[4]:.1f} |"
    lines.append(line)
    return "\n".join(lines)


async def run(args: argparse.Namespace, workdir: Path) -> list[Comparison]:
    names = args.notebooks
    notebooks = load_corpus(CORPUS, names)
    cluster = UpCluster(workdir, 4)
    _ACTIVE.append(cluster)
    comparisons = []
    try:
        await asyncio.to_thread(cluster.wait_up)
        for nb in notebooks:
            t0 = time.monotonic()
            comparison = await differential(cluster, nb, args.modes, args.timeout,
                                            progress=_progress if args.verbose else None)
            comparisons.append(comparison)
            print(f"{nb.name}: {len(nb.cells)} cells in {time.monotonic() - t0:.0f} s; "
                  + ", ".join(f"{m}: {comparison.matches(m)} match"
                              for m in comparison.mismatches), file=sys.stderr, flush=True)
            if args.json:
                with open(args.json, "a") as out:  # a run cut short keeps its notebooks
                    out.write(json.dumps(as_json(comparison)) + "\n")
        return comparisons
    finally:
        await asyncio.to_thread(cluster.stop)
        _ACTIVE.remove(cluster)


def print_table_of(path: Path) -> int:
    results = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for i, result in enumerate(results):  # compared again under today's manifest
        comparison = from_json(result, CORPUS)
        if comparison is not None:
            results[i] = as_json(comparison)
    rows = [r["row"] for r in results]
    modes = ("plain", *[m for m in ("notebookos", "kills", "control")
                        if rows and all(m in row for row in rows)])
    print(table(rows, modes))
    bad = 0
    for result in results:
        for v in result["mismatches"]:
            bad += 1
            print(f"\n{result['row']['notebook']} " + describe(CellVerdict(**v)))
        for mode, notes in result["notes"].items():
            for index, note in notes:
                print(f"\n{result['row']['notebook']} cell {index} [{mode}] note: {note}")
    return 1 if bad else 0


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _stop_and_exit(signum: int, _frame: object) -> None:
    for cluster in _ACTIVE:
        cluster.stop()
    sys.exit(128 + signum)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--notebooks", type=lambda v: v.split(","), default=None,
                        help="these notebooks of the manifest, comma-separated (default all)")
    parser.add_argument("--no-kills", dest="kills", action="store_false",
                        help="leave out the run with kills")
    parser.add_argument("--timeout", type=float, default=CELL_TIMEOUT_S,
                        help=f"seconds a cell may take (default {CELL_TIMEOUT_S:g})")
    parser.add_argument("--control", action="store_true",
                        help="run plain python3 a second time too, to find the cells whose "
                             "outputs differ between two plain runs (they need a rule in the "
                             "manifest)")
    parser.add_argument("--json", metavar="FILE", help="append each notebook's result to FILE")
    parser.add_argument("--table-of", metavar="FILE",
                        help="only print the table and mismatches of the runs --json wrote to "
                             "FILE (also of a run cut short), compared again under the "
                             "manifest's current rules")
    parser.add_argument("--keep", metavar="DIR", help="run in DIR and keep the logs there")
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per cell")
    args = smoke.parse_args(parser, notebooks=[SMOKE])  # --smoke: one small notebook
    args.modes = MODES if args.kills else MODES[:2]
    if args.table_of:
        return print_table_of(Path(args.table_of))
    if args.control:
        args.modes = (*args.modes, "control")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop_and_exit)
    with contextlib.ExitStack() as stack:
        if args.keep:
            workdir = Path(args.keep)
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="corpus-")))
        t0 = time.monotonic()
        comparisons = asyncio.run(run(args, workdir))
        elapsed = time.monotonic() - t0
    print(table([c.row() for c in comparisons], args.modes))
    print(f"\n{sum(c.cells for c in comparisons)} cells of {len(comparisons)} notebooks in "
          f"{elapsed:.0f} s (one `notebookos up --hosts 4`; cell timeout {args.timeout:g} s)")
    bad = 0
    for c in comparisons:
        for verdicts in c.mismatches.values():
            for v in verdicts:
                bad += 1
                print(f"\n{c.name} {describe(v)}")
        for mode, notes in c.notes.items():
            for index, note in notes:
                print(f"\n{c.name} cell {index} [{mode}] note: {note}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
