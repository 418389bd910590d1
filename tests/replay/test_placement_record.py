"""The replay driver's migration flag: a cell that runs on another host than its kernel's replicas
were on is a migration, except under a policy whose containers live one cell (its lifetime
strategy says so, whether the policy is built in or a plug-in)."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from notebookos.policies import registry
from notebookos.replay.driver import Replay, ReplayOptions, containers_per_cell
from notebookos.replay.records import SessionResult, TaskResult
from notebookos.workload.model import Workload


class KernelDocs:
    """The two calls of the Jupyter Server extension that the placement record reads."""

    def __init__(self, doc: dict) -> None:
        self.doc = doc

    async def notebookos_kernel(self, kernel_id: str) -> dict:
        return self.doc


@pytest.fixture
def per_cell_plugin(tmp_path, monkeypatch):
    """A plug-in per-cell policy (not named batch or lcp), installed as a dist-info on sys.path."""
    (tmp_path / "nbos_cell_plugin.py").write_text(textwrap.dedent('''
        from typing import ClassVar
        from notebookos.policies.batch import BatchPolicy

        class EveryCellFresh(BatchPolicy):
            name: ClassVar[str] = "every-cell-fresh"
    '''))
    dist = tmp_path / "nbos_cell_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nbos-cell-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[notebookos.policies]\nevery-cell-fresh = nbos_cell_plugin:EveryCellFresh\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.refresh()
    yield "every-cell-fresh"
    monkeypatch.undo()
    registry.refresh()


def placed_on_another_host(policy: str) -> TaskResult:
    """One cell that ran on host-b while the kernel's only replica was on host-a before it."""
    doc = {"replicas": [{"replica_id": 0, "host_id": "host-b"}],
           "last_cell_gpus": {"host_id": "host-b", "device_ids": [0]}, "executor": 0}
    replay = Replay(KernelDocs(doc), Workload(()), ReplayOptions(policy=policy))
    record = TaskResult("s/0", "s", 0, 1, 0.0, 1.0)
    session = SessionResult("s", 1, "notebookos-1gpu", 0.0, 10.0, 1, kernel_id="k")
    before = {0: "host-a"}
    asyncio.run(replay._record_placement(record, session, before))
    assert before == {0: "host-b"} and record.executor_host == "host-b"
    return record


def test_a_cell_on_a_new_host_is_a_migration_only_for_session_containers(per_cell_plugin):
    assert placed_on_another_host("notebookos").migrated
    assert placed_on_another_host("reservation").migrated
    for per_cell in ("batch", "lcp", per_cell_plugin):
        assert containers_per_cell(per_cell)
        record = placed_on_another_host(per_cell)
        assert not record.migrated and record.executor_host == "host-b"
    assert not containers_per_cell("no-such-policy") and not containers_per_cell("fifo")
