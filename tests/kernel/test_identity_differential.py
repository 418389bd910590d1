"""Differential test on real replica processes: random programs in plain IPython and in a
NotebookOS replica group (real Raft, file store), with the executor moving between cells and one
executor SIGKILLed; after each cell every live replica's namespace must render like IPython's:
equal values, and the same objects shared between the same names and places (issue 20).

A few programs run by default (each starts a group: about 2 s); for a longer run:

    NOTEBOOKOS_DIFF_E2E_EXAMPLES=100 pytest -s tests/kernel/test_identity_differential.py

which prints how many programs were tried. The codec-level variant with many more programs per
second is tests/kernel/test_shared_identity.py.
"""

from __future__ import annotations

import os

import pytest
from harness import ReplicaGroup
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.interactiveshell import InteractiveShell
from programs import CANON_SOURCE, SETUP, canon, cells

EXAMPLES = int(os.environ.get("NOTEBOOKOS_DIFF_E2E_EXAMPLES", "3"))
CHECK = CANON_SOURCE + "\nprint(_notebookos_canon(globals()))"
tried = {"programs": 0, "cells": 0}


@pytest.fixture(scope="module", autouse=True)
def report_programs_tried():
    yield
    print(f"\nidentity differential: {tried['programs']} programs, {tried['cells']} cells "
          f"tried on real replica groups")


@pytest.fixture(scope="module")
def ipython() -> InteractiveShell:
    return InteractiveShell.instance()


@settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 5,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=cells(max_cells=4), targets=st.lists(st.integers(0, 2), min_size=4, max_size=4),
       kill_after=st.integers(0, 3))
def test_random_programs_match_ipython_with_failovers(
    tmp_path_factory: pytest.TempPathFactory, ipython: InteractiveShell,
    program: list[str], targets: list[int], kill_after: int,
) -> None:
    tried["programs"] += 1
    ipython.reset(new_session=False)
    assert ipython.run_cell(SETUP).success
    workdir = tmp_path_factory.mktemp("diff")
    group = ReplicaGroup(workdir, store_url=f"file://{workdir}/store")
    try:
        group.start()
        assert group.execute(SETUP, target=1).reply(1)["content"]["status"] == "ok"
        for index, code in enumerate(program):
            tried["cells"] += 1
            alive = group.alive_ids()
            executor = alive[targets[index] % len(alive)]
            result = group.execute(code, target=executor)
            assert result.reply(executor)["content"]["status"] == "ok", result.summary()
            ipython.run_cell(code)
            expected = canon(ipython.user_ns)
            for rid in group.alive_ids():
                seen = group.execute(CHECK, target=rid)
                assert seen.stdout().strip() == expected, (
                    f"replica {rid} differs after cell {index} (run on replica {executor}):\n"
                    f"{code}\n{seen.summary()}\n{seen.stderr()}")
            if index == kill_after and len(group.alive_ids()) == 3:
                group.kill(executor)  # the next cell runs on a survivor: a real failover
    finally:
        group.stop()
