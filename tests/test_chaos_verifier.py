"""benchmarks/chaos.py's verdicts: a rebuild that kept every cell is intact, one that went back
to an older checkpoint is an announced rollback, and anything else that went back is a silent
loss (the campaign's figures of issue 33 rest on these)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from notebookos.testing.up_session import CellResult

_SPEC = importlib.util.spec_from_file_location(
    "chaos_benchmark", Path(__file__).resolve().parent.parent / "benchmarks" / "chaos.py")
chaos = importlib.util.module_from_spec(_SPEC)
sys.modules["chaos_benchmark"] = chaos
_SPEC.loader.exec_module(chaos)

STORE = ("NotebookOS: every replica of this kernel was lost; the kernel was rebuilt from the "
         "checkpoint taken after cell [{n}]. Work after that cell is lost.\n")
SURVIVOR = ("NotebookOS: the kernel's Raft group lost its quorum; it was rebuilt from the "
            "checkpoint of cell [{n}], which holds every cell replica 4, its most up-to-date "
            "survivor, had applied.\n")


def _cell(count: int, before: str, after: str, stderr: str = "") -> CellResult:
    return CellResult("ok", count, f"CHAOS {before} {after}\n", stderr, "", 0.0)


def _verifier() -> object:
    verifier = chaos.Verifier()
    for count, digest in ((1, "a"), (2, "b"), (3, "c")):
        verifier.accept(count, digest)
    return verifier


def test_a_rebuild_that_kept_every_cell_is_intact() -> None:
    verdict, note = _verifier().record(_cell(4, "c", "d", SURVIVOR.format(n=3)))
    assert verdict == "intact" and "nothing lost" in note


def test_a_rebuild_from_an_older_checkpoint_is_an_announced_rollback() -> None:
    for message in (STORE, SURVIVOR):
        verdict, _ = _verifier().record(_cell(4, "b", "e", message.format(n=2)))
        assert verdict == "rollback", message


def test_state_that_went_back_unannounced_or_further_is_a_silent_loss() -> None:
    assert _verifier().record(_cell(4, "b", "e"))[0] == "silent-loss"
    assert _verifier().record(_cell(4, "a", "e", STORE.format(n=2)))[0] == "silent-loss"
