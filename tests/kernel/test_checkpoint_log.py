"""Segmented checkpoints (kernel/checkpoint_log.py) on a real file store: a checkpoint writes the
names changed since the last one, and reading the manifest gives the whole namespace."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import pytest
from codec_pair import HMAC_KEY, Pair, new_namespace

from notebookos.kernel.ast_effects import analyze_cell
from notebookos.kernel.checkpoint_log import CheckpointLog
from notebookos.kernel.sync_codec import (
    CHECKPOINT_MANIFEST_MAGIC,
    StateApplier,
    StateEncoder,
    SyncState,
    SyncUpdate,
    checkpoint_key,
    read_checkpoint,
    restore_namespace,
)
from notebookos.store import KeyNotFound, StoreError
from notebookos.store.file_store import FileStore


class FlakyStore(FileStore):
    """A real file store whose writes fail while ``down`` is set (a store outage)."""

    down = False

    def put(self, key, value):  # noqa: ANN001, ANN201
        if self.down:
            raise StoreError("file", key, "injected outage")
        return super().put(key, value)


@pytest.fixture
def store(tmp_path: Path) -> FlakyStore:
    return FlakyStore(tmp_path / "store", HMAC_KEY)


def restored(store: FlakyStore, kernel_id: str) -> dict:
    namespace = new_namespace()
    checkpoint = read_checkpoint(store, kernel_id)
    assert restore_namespace(store, checkpoint, namespace, state=SyncState()) == []
    return {k: v for k, v in namespace.items() if not k.startswith("__")}


def test_a_checkpoint_writes_only_what_changed_and_reads_back_whole(store: FlakyStore) -> None:
    pair = Pair(store)
    log = CheckpointLog(store, pair.kernel_id)
    try:
        pair.run("\n".join(f"v{i} = {{'n': {i}}}" for i in range(300)) + "\nalias = v1")
        log.write(pair.executor_state, 1)
        full_size = len(store.get(read_manifest_base(store.get(checkpoint_key(pair.kernel_id)))))
        pair.run("v2['n'] = -2\ndel v3\nalias['n'] = -1")
        log.write(pair.executor_state, 2)
        assert (log.full_writes, log.segment_writes) == (1, 1)
        manifest = store.get(checkpoint_key(pair.kernel_id))
        segment = store.get(read_manifest_segments(manifest)[-1])
        assert len(segment) * 10 < full_size  # four entries, not 300 names
        state = restored(store, pair.kernel_id)
        assert state["v2"] == {"n": -2} and "v3" not in state and len(state) == 300
        assert state["alias"] is state["v1"] and state["v1"] == {"n": -1}
        assert read_checkpoint(store, pair.kernel_id).execution_count == 2
    finally:
        pair.close()


def _manifest(manifest: bytes) -> dict:
    assert manifest.startswith(CHECKPOINT_MANIFEST_MAGIC)
    return pickle.load(io.BytesIO(manifest[len(CHECKPOINT_MANIFEST_MAGIC):]))


def read_manifest_segments(manifest: bytes) -> list[str]:
    return _manifest(manifest)["segments"]


def read_manifest_base(manifest: bytes) -> str:
    return _manifest(manifest)["base"]


def test_segments_are_compacted_and_old_parts_deleted(store: FlakyStore) -> None:
    pair = Pair(store)
    log = CheckpointLog(store, pair.kernel_id, max_segments=3)
    try:
        pair.run("x = 0\nkeep = [1, 2]")
        for count in range(1, 10):
            pair.run(f"x = {count}")
            log.write(pair.executor_state, count)
        assert log.full_writes == 3 and log.segment_writes == 6
        parts = list(store.root.glob(f"{pair.kernel_id}.d/checkpoint-parts.d/*.v"))
        assert 0 < len(parts) <= 8  # the current and the previous generation at most
        assert restored(store, pair.kernel_id) == {"x": 9, "keep": [1, 2]}
    finally:
        pair.close()


def test_a_failed_write_keeps_the_changes_for_the_next_one(store: FlakyStore) -> None:
    pair = Pair(store)
    log = CheckpointLog(store, pair.kernel_id)
    try:
        pair.run("a = 1")
        log.write(pair.executor_state, 1)
        pair.run("b = 2")
        store.down = True
        with pytest.raises(StoreError):
            log.write(pair.executor_state, 2)
        store.down = False
        pair.run("c = 3")
        log.write(pair.executor_state, 3)
        assert restored(store, pair.kernel_id) == {"a": 1, "b": 2, "c": 3}
    finally:
        pair.close()


def test_alternating_executors_each_write_a_complete_checkpoint(store: FlakyStore) -> None:
    """Replica A checkpoints, B takes over and checkpoints, A takes over again: A's next segment
    must cover what it applied from B (its manifest replaces B's)."""
    kernel = "k-alt"
    states = [SyncState(), SyncState()]
    namespaces = [new_namespace(), new_namespace()]
    encoders = [StateEncoder(store, kernel, state=s) for s in states]
    appliers = [StateApplier(store, state=s) for s in states]
    logs = [CheckpointLog(store, kernel), CheckpointLog(store, kernel)]
    try:
        for count, (executor, code) in enumerate(
            [(0, "a = [1]"), (1, "b = a\nb.append(2)"), (0, "c = 3")], start=1
        ):
            exec(code, namespaces[executor])
            record = encoders[executor].encode(namespaces[executor], analyze_cell(code))
            for replica in (0, 1):
                appliers[replica].apply(namespaces[replica],
                                        SyncUpdate.from_bytes(record.to_bytes()))
            logs[executor].write(states[executor], count)
        state = restored(store, kernel)
        assert state == {"a": [1, 2], "b": [1, 2], "c": 3} and state["a"] is state["b"]
    finally:
        for applier in appliers:
            applier.close()


def test_no_checkpoint_and_a_malformed_manifest_are_clear_errors(store: FlakyStore) -> None:
    with pytest.raises(KeyNotFound):
        read_checkpoint(store, "k-none")
    store.put(checkpoint_key("k-bad"), CHECKPOINT_MANIFEST_MAGIC + b"\x80\x05K\x01.")
    with pytest.raises(ValueError, match="checkpoint manifest"):
        read_checkpoint(store, "k-bad")
