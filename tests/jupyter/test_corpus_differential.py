"""A short differential test over real public notebooks (tests/jupyter/corpus/): each runs cell by
cell through the Jupyter Server of `notebookos up --hosts 4` on plain ipykernel ``python3``, on
the NotebookOS kernel, and on the NotebookOS kernel with a SIGKILL of the executor replica after
every cell; every cell's outputs must be plain IPython's, after the normalisation of
notebookos/testing/differential.py (the whole corpus is benchmarks/notebook_corpus.py).

``KNOWN`` lists the cells that differ today because of defects being fixed elsewhere (issue 31):
such a case is an expected failure only while exactly those cells (or fewer) differ; any other
cell that differs, or hangs, fails the test."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from notebookos.testing.differential import (
    CELL_TIMEOUT_S,
    Comparison,
    describe,
    differential,
    load_corpus,
)
from notebookos.testing.up_session import UpCluster

CORPUS = Path(__file__).resolve().parent / "corpus"
NOTEBOOKS = ("pdsh-01.06-errors", "pdsh-02.02-numpy-basics", "pdsh-02.08-sorting")
MODES = ("notebookos", "kills")

# (notebook, mode) -> {code cell index: why it differs today}; remove an entry with its fix.
KNOWN: dict[tuple[str, str], dict[int, str]] = {}


@pytest.fixture(scope="module")
def up_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpCluster]:
    cluster = UpCluster(tmp_path_factory.mktemp("corpus"), 4)
    try:
        cluster.wait_up()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def comparisons(up_cluster: UpCluster) -> dict[str, Comparison]:
    """Each notebook run once per mode (lazily, the first time a test asks for it)."""
    return {}


def _comparison(cluster: UpCluster, cache: dict[str, Comparison], name: str) -> Comparison:
    if name not in cache:
        (nb,) = load_corpus(CORPUS, [name])
        cache[name] = asyncio.run(differential(cluster, nb, ("plain", *MODES), CELL_TIMEOUT_S))
    return cache[name]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_gives_plain_ipythons_outputs(up_cluster: UpCluster,
                                               comparisons: dict[str, Comparison],
                                               name: str, mode: str) -> None:
    comparison = _comparison(up_cluster, comparisons, name)
    run = comparison.runs[mode]
    hung = [i for i, c in enumerate(run.cells) if c.status in ("timeout", "not-run")]
    assert not hung, f"{name} [{mode}]: cells {hung} hung or never ran"
    if mode == "kills":  # every cell but the last was followed by a kill
        missed = [(i, c.kill_note) for i, c in enumerate(run.cells[:-1]) if c.killed_pid is None]
        assert not missed, f"{name}: no kill after cells {missed}"
    mismatches = comparison.mismatches[mode]
    known = KNOWN.get((name, mode), {})
    unexpected = [v for v in mismatches if v.index not in known]
    report = "\n\n".join(describe(v) for v in mismatches)
    assert not unexpected, f"{name} [{mode}]: {len(mismatches)} cells differ\n\n{report}"
    if mismatches:
        why: dict[str, list[int]] = {}
        for v in mismatches:
            why.setdefault(known[v.index], []).append(v.index)
        pytest.xfail("known defects: " + "; ".join(
            f"cells {', '.join(map(str, cells))}: {reason}" for reason, cells in why.items()))
