"""A differential run of real notebooks: each code cell, in order, through Jupyter Server on plain
ipykernel (``python3``), on the NotebookOS kernel, and on the NotebookOS kernel with a SIGKILL of
the executor replica after every cell; outputs compared cell by cell with plain IPython's.

Shared by the short corpus test (tests/jupyter/test_corpus_differential.py) and the whole corpus
as a benchmark (benchmarks/notebook_corpus.py). The corpus (tests/jupyter/corpus/) is public
notebooks with a ``manifest.json`` that says where each came from and which of its cells need more
normalisation than the default (see ``normalise``).

What is compared, per cell: the reply's status; stdout and stderr, each concatenated over the
cell's stream messages; in order, every ``execute_result``'s ``text/plain``, every ``error``'s
``ename`` and, for every ``display_data`` / ``update_display_data``, the set of mime types it
carries (a figure's bytes are not compared). Before comparing:

- memory addresses (``0x7f...``) and ipykernel's per-process cell file names
  (``/tmp/ipykernel_<pid>/<hash>.py``) are replaced by placeholders, in every text;
- IPython's own timing lines (``%timeit``'s ``... per loop (mean ± std. dev. ...)``, ``%time``'s
  ``CPU times:`` / ``Wall time:``) are replaced by ``<timing>``;
- NotebookOS's own notes on stderr (a line that starts with ``NotebookOS: `` or
  ``NotebookOS warning: ``, as kernel/replica.py, kernel/sync_codec.py, kernel/gpu_glue.py and
  global_scheduler/front.py write them) are taken out of stderr and kept apart (``notes``): a
  failover or rebuild notice is reported, not compared;
- the rules the manifest names for a cell (by its index among the notebook's code cells):
  ``numbers`` (the cell shows unseeded randomness: every number becomes ``#``, runs of blanks
  and line breaks one blank, none inside brackets, since column padding and line wrapping
  follow the numbers), ``set-order``
  (an ``execute_result`` that is a set or dict of strings: its items sorted, since their order
  follows the process's string hash seed), ``timing`` (every duration ``<number> <unit>`` becomes
  ``<t>``, for a notebook that times itself).

Seeded randomness is compared exactly. Every cell has a timeout (``CELL_TIMEOUT_S``): a cell
without a reply by then is a ``timeout`` (a hang), the kernel is interrupted, and when it does not
go idle within ``INTERRUPT_WAIT_S`` the notebook's remaining cells are ``not-run``.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from notebookos.testing.up_session import Notebook, UpCluster

CELL_TIMEOUT_S = 120.0
INTERRUPT_WAIT_S = 30.0
WHOLE_TIMEOUT_S = 120.0
MODES = ("plain", "notebookos", "kills")
# ``control``: plain ipykernel a second time; what differs between two plain runs is
# nondeterministic on its own and needs a rule in the manifest.
KERNELS = {"plain": "python3", "control": "python3", "notebookos": "notebookos",
           "kills": "notebookos"}

NOTE = re.compile(r"^NotebookOS(?: warning)?: [^\n]*(?:\n|$)", re.M)
ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")
CELL_FILE = re.compile(r"/tmp/ipykernel_\d+/\d+\.py")
TIMING_LINE = re.compile(
    r"^.*(?:per loop \(mean ± std\. dev\.|^CPU times:|^Wall time:).*$", re.M)
DURATION = re.compile(r"\d+(?:\.\d+)?\s*(?:ns|µs|us|ms|s|sec|seconds)\b")
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
RULES = ("numbers", "set-order", "timing")


# -- the corpus ------------------------------------------------------------------------------

@dataclass
class Cell:
    index: int  # among the notebook's code cells
    source: str
    rules: tuple[str, ...] = ()


@dataclass
class CorpusNotebook:
    name: str
    cells: list[Cell]
    source: dict  # the manifest's entry


def load_corpus(directory: Path, names: Iterable[str] | None = None) -> list[CorpusNotebook]:
    """The corpus' notebooks (all, or ``names`` in that order), code cells only."""
    import nbformat

    entries = {e["name"]: e for e in json.loads((directory / "manifest.json").read_text())
               ["notebooks"]}
    chosen = list(names) if names is not None else list(entries)
    notebooks = []
    for name in chosen:
        entry = entries[name]
        nb = nbformat.read(directory / f"{name}.ipynb", as_version=4)
        rules = {int(k): tuple(v) for k, v in entry.get("normalise", {}).items()}
        for k, v in rules.items():
            unknown = set(v) - set(RULES)
            if unknown:
                raise ValueError(f"{name} cell {k}: unknown normalisation {sorted(unknown)}")
        code = [c.source for c in nb.cells if c.cell_type == "code"]
        notebooks.append(CorpusNotebook(
            name, [Cell(i, src, rules.get(i, ())) for i, src in enumerate(code)], entry))
    return notebooks


# -- one run of a notebook --------------------------------------------------------------------

@dataclass
class CellRun:
    status: str  # ok, error, aborted, timeout, not-run
    outputs: list[dict] = field(default_factory=list)  # {"type": msg_type, "content": ...}
    seconds: float = 0.0
    killed_pid: int | None = None  # the executor SIGKILLed after this cell
    whole_s: float | None = None  # the wait for three live replicas before that kill
    kill_note: str = ""  # why no kill happened after this cell, when none did


@dataclass
class NotebookRun:
    name: str
    mode: str
    cells: list[CellRun]
    seconds: float
    kernel_id: str = ""

    @property
    def hangs(self) -> int:
        return sum(c.status == "timeout" for c in self.cells)

    @property
    def kills(self) -> int:
        return sum(c.killed_pid is not None for c in self.cells)


class Session(Notebook):
    """A notebook over Jupyter Server's REST API and kernel websocket, on any kernel, keeping
    every output message of a cell."""

    async def open(self, kernel_name: str = "notebookos", path: str = "corpus.ipynb") -> None:
        body = {"path": path, "type": "notebook", "name": path, "kernel": {"name": kernel_name}}
        resp = await AsyncHTTPClient().fetch(HTTPRequest(
            f"{self.base}/api/sessions", method="POST", body=json.dumps(body),
            headers={"Authorization": f"token {self.token}"}, request_timeout=300))
        self.kernel_id = json.loads(resp.body)["kernel"]["id"]
        await self._connect()

    async def run(self, code: str, timeout: float = CELL_TIMEOUT_S) -> CellRun:
        t0 = time.monotonic()
        deadline = t0 + timeout
        for attempt in range(2):
            msg_id = self.send_execute(code)
            try:
                return await self._collect(msg_id, t0, deadline)
            except ConnectionError:  # JupyterLab reconnects its websocket too
                if attempt:
                    raise
                self.reconnects += 1
                await self._connect()
        raise AssertionError("unreachable")

    async def _collect(self, msg_id: str, t0: float, deadline: float) -> CellRun:
        outputs: list[dict] = []
        reply, idle = None, False
        try:
            async for channel, msg in self._messages(deadline):
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["header"]["msg_type"], msg["content"]
                if kind in ("stream", "execute_result", "display_data", "update_display_data",
                            "error"):
                    outputs.append({"type": kind, "content": content})
                elif kind == "clear_output":
                    outputs.append({"type": kind, "content": {}})
                elif kind == "status" and content["execution_state"] == "idle":
                    idle = True
                elif channel == "shell" and kind == "execute_reply":
                    reply = content
                if reply is not None and idle:
                    break
        except TimeoutError:
            run = CellRun("timeout", outputs, time.monotonic() - t0)
            run.kill_note = "no reply" if reply is None else "reply but no idle"
            await self._interrupt(msg_id)
            return run
        return CellRun(reply.get("status", "?"), outputs, time.monotonic() - t0)

    async def _interrupt(self, msg_id: str) -> None:
        """Interrupt a hung cell and wait (a while) for its idle."""
        with contextlib.suppress(Exception):
            await AsyncHTTPClient().fetch(HTTPRequest(
                f"{self.base}/api/kernels/{self.kernel_id}/interrupt", method="POST", body="",
                headers={"Authorization": f"token {self.token}"}, request_timeout=30))
        self.wedged = True
        with contextlib.suppress(TimeoutError, ConnectionError):
            async for _, msg in self._messages(time.monotonic() + INTERRUPT_WAIT_S):
                if msg["parent_header"].get("msg_id") == msg_id \
                        and msg["header"]["msg_type"] == "status" \
                        and msg["content"]["execution_state"] == "idle":
                    self.wedged = False
                    return

    wedged = False


async def wait_whole(cluster: UpCluster, kernel_id: str,
                     timeout: float = WHOLE_TIMEOUT_S) -> bool:
    """Three live replicas on distinct hosts, the kernel idle, every host registered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(cluster.whole, kernel_id):
            return True
        await asyncio.sleep(0.1)
    return False


def executor_pid(cluster: UpCluster, kernel_id: str) -> int | None:
    """The pid of the replica that ran the kernel's latest cell (the Global Scheduler's status:
    ``executor_replica_id``, or the replica flagged ``executor``), when it is a live process."""
    status = cluster.kernel(kernel_id)
    if status is None:
        return None
    for replica in status.replicas:
        if (replica.replica_id == status.executor_replica_id or replica.executor) \
                and replica.pid > 0 and psutil.pid_exists(replica.pid):
            return replica.pid
    return None


async def kill_executor(cluster: UpCluster, kernel_id: str, run: CellRun) -> None:
    """Wait for three live replicas again, then SIGKILL the executor (recorded in ``run``)."""
    t0 = time.monotonic()
    if not await wait_whole(cluster, kernel_id):
        run.kill_note = f"not three live replicas within {WHOLE_TIMEOUT_S:.0f} s: no kill"
        return
    run.whole_s = time.monotonic() - t0
    pid = await asyncio.to_thread(executor_pid, cluster, kernel_id)
    if pid is None:
        run.kill_note = "no live executor in the scheduler's status: no kill"
        return
    os.kill(pid, signal.SIGKILL)
    run.killed_pid = pid


async def run_notebook(cluster: UpCluster, nb: CorpusNotebook, mode: str,
                       timeout: float = CELL_TIMEOUT_S,
                       progress: Callable[[str], None] | None = None) -> NotebookRun:
    """``nb``'s code cells, in order, on a fresh kernel: ``mode`` is ``plain`` (ipykernel
    ``python3``), ``notebookos``, or ``kills`` (notebookos, the executor SIGKILLed after every
    cell but the last, each kill once the kernel has three live replicas again)."""
    session = Session(cluster.base, cluster.token)
    t0 = time.monotonic()
    await session.open(KERNELS[mode], f"{nb.name}-{mode}.ipynb")
    cells: list[CellRun] = []
    try:
        for i, cell in enumerate(nb.cells):
            if session.wedged:
                cells.append(CellRun("not-run", kill_note="the kernel hung on an earlier cell"))
                continue
            run = await session.run(cell.source, timeout)
            if mode == "kills" and i < len(nb.cells) - 1 and run.status != "timeout":
                await kill_executor(cluster, session.kernel_id, run)
            cells.append(run)
            if progress is not None:
                progress(f"{nb.name} [{mode}] cell {i}: {run.status} {run.seconds:.1f} s"
                         + (f", killed {run.killed_pid}" if run.killed_pid else "")
                         + (f" ({run.kill_note})" if run.kill_note else ""))
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(session.close(), 60)
    return NotebookRun(nb.name, mode, cells, time.monotonic() - t0, session.kernel_id)


# -- normalising and comparing ----------------------------------------------------------------

def _text(value: object) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _clean(text: str, rules: tuple[str, ...]) -> str:
    text = ADDRESS.sub("0x?", text)
    text = CELL_FILE.sub("<cell>", text)
    text = TIMING_LINE.sub("<timing>", text)
    if "timing" in rules:
        text = DURATION.sub("<t>", text)
    if "numbers" in rules:  # digit grouping, column padding and line wrapping (torch wraps
        # a tensor's rows by the width of its numbers) follow the numbers too
        text = re.sub(r"\s+", " ", re.sub(r"#(?:,#)+", "#", NUMBER.sub("#", text)))
        text = re.sub(r"([\[(]) | ([\])])", r"\1\2", text)
    return text


def _sorted_literal(text: str) -> str:
    """A set's or dict's repr with its items in a fixed order (string hashes are per process)."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(repr(v) for v in value)) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(f"{k!r}: {v!r}" for k, v in value.items())) + "}"
    return text


def normalise(run: CellRun, rules: tuple[str, ...] = ()) -> dict:
    """What is compared of a cell's run (see the module's docstring); ``notes`` is not."""
    stdout, stderr, results = [], [], []
    for out in run.outputs:
        kind, content = out["type"], out["content"]
        if kind == "stream":
            (stdout if content.get("name") == "stdout" else stderr).append(_text(content["text"]))
        elif kind == "execute_result":
            text = _clean(_text(content.get("data", {}).get("text/plain", "")), rules)
            if "set-order" in rules:
                text = _sorted_literal(text)
            results.append(["execute_result", text])
        elif kind in ("display_data", "update_display_data"):
            results.append([kind, sorted(content.get("data", {}))])
        elif kind == "error":
            results.append(["error", content.get("ename", "?")])
        elif kind == "clear_output":
            results.append(["clear_output"])
    err = "".join(stderr)
    notes = [n.rstrip("\n") for n in NOTE.findall(err)]
    return {"status": run.status, "stdout": _clean("".join(stdout), rules),
            "stderr": _clean(NOTE.sub("", err), rules), "results": results, "notes": notes}


def differences(expected: dict, actual: dict) -> list[str]:
    """The fields of two normalised cells that differ (``notes`` aside)."""
    return [k for k in ("status", "stdout", "stderr", "results") if expected[k] != actual[k]]


@dataclass
class CellVerdict:
    index: int
    mode: str
    differs: list[str]
    expected: dict
    actual: dict
    source: str


@dataclass
class Comparison:
    name: str
    cells: int
    runs: dict[str, NotebookRun]
    mismatches: dict[str, list[CellVerdict]]  # per mode other than plain
    notes: dict[str, list[tuple[int, str]]]  # NotebookOS notes per mode: (cell, note)

    def matches(self, mode: str) -> int:
        return self.cells - len(self.mismatches[mode])

    def row(self) -> dict:
        row = {"notebook": self.name, "cells": self.cells}
        for mode in self.mismatches:
            run = self.runs[mode]
            row[mode] = {"matches": self.matches(mode), "mismatches": len(self.mismatches[mode]),
                         "hangs": run.hangs, "not_run": sum(c.status == "not-run"
                                                           for c in run.cells),
                         "kills": run.kills, "seconds": round(run.seconds, 1),
                         "notes": len(self.notes[mode])}
        row["plain_seconds"] = round(self.runs["plain"].seconds, 1)
        return row


def compare(nb: CorpusNotebook, runs: dict[str, NotebookRun]) -> Comparison:
    plain = runs["plain"]
    mismatches: dict[str, list[CellVerdict]] = {}
    notes: dict[str, list[tuple[int, str]]] = {}
    for mode, run in runs.items():
        if mode == "plain":
            continue
        mismatches[mode], notes[mode] = [], []
        for cell, want, got in zip(nb.cells, plain.cells, run.cells, strict=True):
            expected, actual = normalise(want, cell.rules), normalise(got, cell.rules)
            notes[mode].extend((cell.index, n) for n in actual["notes"])
            diff = differences(expected, actual)
            if diff:
                mismatches[mode].append(
                    CellVerdict(cell.index, mode, diff, expected, actual, cell.source))
    return Comparison(nb.name, len(nb.cells), runs, mismatches, notes)


async def differential(cluster: UpCluster, nb: CorpusNotebook, modes: Iterable[str] = MODES,
                       timeout: float = CELL_TIMEOUT_S,
                       progress: Callable[[str], None] | None = None) -> Comparison:
    """``nb`` in every mode (plain first: it is the reference), compared."""
    runs = {}
    for mode in ("plain", *[m for m in modes if m != "plain"]):
        runs[mode] = await run_notebook(cluster, nb, mode, timeout, progress)
    return compare(nb, runs)


def describe(verdict: CellVerdict, width: int = 600) -> str:
    """A mismatch, for a report: the cell's code and what differed."""
    lines = [f"cell {verdict.index} [{verdict.mode}] differs in {', '.join(verdict.differs)}",
             "  code: " + verdict.source.strip().replace("\n", "\n        ")[:width]]
    for key in verdict.differs:
        lines.append(f"  plain:      {key} = {_short(verdict.expected[key], width)}")
        lines.append(f"  notebookos: {key} = {_short(verdict.actual[key], width)}")
    return "\n".join(lines)


def _short(value: object, width: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return repr(text[:width] + ("..." if len(text) > width else ""))


def as_json(comparison: Comparison) -> dict:
    """The comparison, and the runs themselves (outputs without their non-text payloads) so that
    ``from_json`` can compare them again under a newer manifest."""
    runs = {}
    for mode, run in comparison.runs.items():
        cells = []
        for cell in run.cells:
            record = asdict(cell)
            for out in record["outputs"]:
                data = out["content"].get("data")
                if isinstance(data, dict):
                    out["content"]["data"] = {k: (v if k == "text/plain" else "") for k, v
                                              in data.items()}
            cells.append(record)
        runs[mode] = {"cells": cells, "seconds": run.seconds, "kernel_id": run.kernel_id}
    return {"row": comparison.row(),
            "mismatches": [asdict(v) for vs in comparison.mismatches.values() for v in vs],
            "notes": comparison.notes, "runs": runs}


def from_json(record: dict, corpus: Path) -> Comparison | None:
    """``as_json``'s record compared again under the corpus' current manifest (None for a
    record without its runs)."""
    if "runs" not in record:
        return None
    (nb,) = load_corpus(corpus, [record["row"]["notebook"]])
    runs = {mode: NotebookRun(nb.name, mode, [CellRun(**c) for c in r["cells"]], r["seconds"],
                              r["kernel_id"]) for mode, r in record["runs"].items()}
    return compare(nb, runs)
