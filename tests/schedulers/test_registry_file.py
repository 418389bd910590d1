"""The Global Scheduler's file registry: a snapshot and a journal of changes beside it; what a
restarted scheduler reads back is what the last one wrote, whatever point a crash stopped it at."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from notebookos.global_scheduler.registry_store import FileRegistryStore, read_file_registry


def kernel_doc(n: int) -> dict:
    return {"key": f"secret-{n}", "replicas": {"1": {"host_id": "host-0"}}, "n": n}


def test_changes_survive_a_restart_without_rewriting_the_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    store = FileRegistryStore(path)
    snapshot = path.read_bytes()
    store.put_host("host-0", {"ip": "127.0.0.1"})
    store.put_kernel("k1", kernel_doc(1))
    store.put_kernel("k2", kernel_doc(2))
    store.put_kernel("k1", kernel_doc(11))
    store.delete_kernel("k2")
    store.delete_kernel("never-there")
    assert path.read_bytes() == snapshot  # a change is one journal line, not a new snapshot
    assert len(store.journal_path.read_bytes().splitlines()) == 5
    # the scheduler is SIGKILLed here: nothing is closed
    assert read_file_registry(path) == ({"host-0": {"ip": "127.0.0.1"}}, {"k1": kernel_doc(11)})
    again = FileRegistryStore(path)
    assert again.load() == ({"host-0": {"ip": "127.0.0.1"}}, {"k1": kernel_doc(11)})
    assert again.journal_path.read_bytes() == b""  # folded into the snapshot at start
    again.close()
    store.close()


def test_a_line_torn_by_a_crash_is_ignored_and_a_damaged_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    store = FileRegistryStore(path)
    store.put_kernel("k1", kernel_doc(1))
    store.close()
    with open(store.journal_path, "ab") as f:
        f.write(b'{"table":"kernels","id":"k2","doc":{"key":"sec')  # the write a crash cut
    assert read_file_registry(path) == ({}, {"k1": kernel_doc(1)})

    store.journal_path.write_bytes(b'{"table":"kernels","id":"k1"}\nnot json\n'
                                   b'{"table":"kernels","id":"k3","doc":{}}\n')
    with pytest.raises(ValueError, match=r"registry journal .*registry\.json\.journal is "
                                         r"unreadable at line 2"):
        FileRegistryStore(path)
    store.journal_path.write_bytes(b'{"table":"nodes","id":"x","doc":{}}\n\n')
    with pytest.raises(ValueError, match="unreadable at line 1"):
        read_file_registry(path)


def test_the_journal_is_folded_into_the_snapshot_once_it_outgrows_it(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    store = FileRegistryStore(path)
    changes = 0
    while store.journal_path.stat().st_size or changes == 0:
        store.put_kernel(f"k{changes % 3}", kernel_doc(changes))
        changes += 1
        assert changes <= FileRegistryStore.COMPACT_MIN_LINES + 1
    assert changes == FileRegistryStore.COMPACT_MIN_LINES + 1
    on_disk = json.loads(path.read_text())
    assert on_disk["kernels"] == {f"k{i % 3}": kernel_doc(i) for i in range(changes - 3, changes)}
    store.put_kernel("k9", kernel_doc(9))  # the journal goes on after a fold
    assert read_file_registry(path)[1]["k9"] == kernel_doc(9)
    store.close()


def test_a_crash_between_the_new_snapshot_and_the_emptied_journal_replays_harmlessly(
        tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    store = FileRegistryStore(path)
    store.put_kernel("k1", kernel_doc(1))
    store.put_kernel("k2", kernel_doc(2))
    store.delete_kernel("k1")
    journal = store.journal_path.read_bytes()
    store.close()
    FileRegistryStore(path).close()  # folds: the snapshot holds k2 only
    store.journal_path.write_bytes(journal)  # as if the fold died before emptying it
    assert read_file_registry(path) == ({}, {"k2": kernel_doc(2)})


def test_a_registry_written_by_the_earlier_release_is_read(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    path.write_text(json.dumps({"hosts": {"h": {"ip": "10.0.0.1"}}, "kernels": {"k": {"a": 1}}}))
    store = FileRegistryStore(path)
    assert store.load() == ({"h": {"ip": "10.0.0.1"}}, {"k": {"a": 1}})
    store.close()


def test_the_registry_files_hold_keys_and_only_their_owner_may_read_them(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    store = FileRegistryStore(path)
    store.put_kernel("k1", kernel_doc(1))
    for f in (path, store.journal_path):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    store.close()


def test_an_unreadable_snapshot_is_refused_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="registry file .*registry.json is unreadable"):
        FileRegistryStore(path)
