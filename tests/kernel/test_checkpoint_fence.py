"""A late checkpoint write never replaces a newer checkpoint (issue 34), on every store backend.

The fault campaign (benchmarks/chaos.py, seed 10) found a replica frozen by SIGSTOP while writing
its checkpoint finish the write after it resumed, over the newer checkpoint the group's next
executor had written meanwhile; a later wake read the older one. The manifest is now written
with ``put_fenced``, fenced with (incarnation, execution_count).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator

import pytest
from codec_pair import HMAC_KEY, new_namespace

from notebookos.kernel.ast_effects import analyze_cell
from notebookos.kernel.checkpoint_log import CheckpointLog
from notebookos.kernel.state_sync import StateSync
from notebookos.kernel.sync_codec import (
    StateApplier,
    StateEncoder,
    SyncState,
    SyncUpdate,
    checkpoint_key,
    read_checkpoint,
    restore_namespace,
)
from notebookos.store import LargeObjectStore, open_store


@pytest.fixture(params=["file", "redis", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    if request.param == "file":
        yield f"file://{tmp_path}/store"
    elif request.param == "redis":
        prefix = f"nbos-fence-{uuid.uuid4().hex[:8]}"
        yield f"{request.getfixturevalue('redis_url')}?prefix={prefix}"
        import redis

        client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
        keys = list(client.scan_iter(f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
    else:
        yield request.getfixturevalue("s3_store_url")


@pytest.fixture
def store(store_url: str) -> Iterator[LargeObjectStore]:
    opened = open_store(store_url, HMAC_KEY)
    yield opened
    opened.close()


class Group:
    """Two replicas of one kernel joined by the codec: whichever executes, both apply."""

    def __init__(self, store: LargeObjectStore, kernel: str) -> None:
        self.states = [SyncState(), SyncState()]
        self.namespaces = [new_namespace(), new_namespace()]
        self.encoders = [StateEncoder(store, kernel, state=s) for s in self.states]
        self.appliers = [StateApplier(store, state=s) for s in self.states]

    def run(self, executor: int, code: str, appliers: tuple[int, ...] = (0, 1)) -> bytes:
        exec(code, self.namespaces[executor])
        record = self.encoders[executor].encode(self.namespaces[executor],
                                                analyze_cell(code)).to_bytes()
        for replica in appliers:
            if replica != executor:
                self.apply(replica, record)
        return record

    def apply(self, replica: int, record: bytes) -> None:
        self.appliers[replica].apply(self.namespaces[replica], SyncUpdate.from_bytes(record))

    def close(self) -> None:
        for applier in self.appliers:
            applier.close()


def restored(store: LargeObjectStore, kernel: str) -> dict:
    namespace = new_namespace()
    assert restore_namespace(store, read_checkpoint(store, kernel), namespace,
                             state=SyncState()) == []
    return {k: v for k, v in namespace.items() if not k.startswith("__")}


def test_a_late_checkpoint_of_an_older_cell_does_not_replace_the_newer_one(
        store: LargeObjectStore) -> None:
    """Replica 0 runs cell 2 and is frozen writing its checkpoint; replica 1 takes over, runs
    cell 3 and checkpoints it; replica 0 resumes and finishes its write of cell 2: refused."""
    kernel = f"k-{uuid.uuid4().hex[:8]}"
    group = Group(store, kernel)
    logs = [CheckpointLog(store, kernel), CheckpointLog(store, kernel)]
    try:
        group.run(0, "a = 1")
        assert logs[0].write(group.states[0], 1) is None
        group.run(0, "b = 2")
        missed = group.run(1, "c = 3", appliers=(1,))  # replica 0 is frozen: not applied
        assert logs[1].write(group.states[1], 3) is None
        assert logs[0].write(group.states[0], 2) == (0, 3)  # the late write, refused
        assert logs[0].refused_writes == 1
        assert restored(store, kernel) == {"a": 1, "b": 2, "c": 3}
        assert read_checkpoint(store, kernel).execution_count == 3
        # the refused replica catches up and executes again: its checkpoint is complete
        group.apply(0, missed)
        group.run(1, "d = 4")
        group.run(0, "e = 5")
        assert logs[0].write(group.states[0], 5) is None
        assert restored(store, kernel) == {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}
    finally:
        group.close()


def test_a_restarted_kernel_writes_from_cell_one_and_the_old_incarnation_is_fenced_out(
        store: LargeObjectStore) -> None:
    kernel = f"k-{uuid.uuid4().hex[:8]}"
    old, new = Group(store, kernel), Group(store, kernel)
    try:
        old.run(0, "x = 'old'")
        old_log = CheckpointLog(store, kernel, epoch=0)
        assert old_log.write(old.states[0], 50) is None
        new.run(0, "y = 'new'")
        assert CheckpointLog(store, kernel, epoch=1).write(new.states[0], 1) is None
        old.run(0, "z = 'late'")
        assert old_log.write(old.states[0], 51) == (1, 1)
        assert restored(store, kernel) == {"y": "new"}
        assert read_checkpoint(store, kernel).epoch == 1
    finally:
        old.close()
        new.close()


def test_state_sync_counts_a_refused_checkpoint_and_does_not_report_it_written(
        store_url: str) -> None:
    kernel = f"k-{uuid.uuid4().hex[:8]}"
    log = logging.getLogger("test-fence")
    newer = StateSync(store_url, HMAC_KEY, kernel, 1 << 20, log)
    late = StateSync(store_url, HMAC_KEY, kernel, 1 << 20, log)
    try:
        assert newer.checkpoint_now(7) == 7
        assert late.checkpoint_now(5) == 0  # the store's is newer: nothing written
        written: list[int] = []
        late._checkpoints.write = lambda state, count: (0, 7)  # refused at the store
        late.checkpoint_in_background(6, written.append)
        with late._checkpoint_ended:
            assert late._checkpoint_ended.wait_for(lambda: not late._checkpoint_running, 10)
        assert written == [] and late.checkpoints_refused == 1
        assert late.newer_checkpoint == (0, 7)
        assert read_checkpoint(newer.store, kernel).execution_count == 7
    finally:
        newer.close()
        late.close()


def test_a_restarted_kernel_does_not_restore_the_old_incarnations_checkpoint(
        store_url: str) -> None:
    """A group of the restarted kernel rebuilt from the store before it wrote a checkpoint
    must start empty, not from the checkpoint of the kernel before its restart."""
    kernel = f"k-{uuid.uuid4().hex[:8]}"
    log = logging.getLogger("test-fence")
    old = StateSync(store_url, HMAC_KEY, kernel, 1 << 20, log, epoch=0)
    new = StateSync(store_url, HMAC_KEY, kernel, 1 << 20, log, epoch=1)
    try:
        assert old.checkpoint_now(9) == 9
        namespace = new_namespace()
        assert new.restore_checkpoint(namespace) == (0, [])
        assert new.checkpoint_now(1) == 1
        assert old.checkpoint_now(10) == 0
        assert read_checkpoint(new.store, kernel).epoch == 1
        assert store_fence(new.store, kernel) == (1, 1)
    finally:
        old.close()
        new.close()


def store_fence(store: LargeObjectStore, kernel: str) -> tuple[int, int] | None:
    return store.fence_of(checkpoint_key(kernel))


def test_a_replica_whose_checkpoint_write_lags_does_not_replace_the_next_executors(
        tmp_path) -> None:  # noqa: ANN001
    """Real replicas: replica 1 runs cell 1 and its checkpoint write stalls (as when its host
    was frozen mid-write); replica 2 runs cell 2 and writes its checkpoint; replica 1's write
    lands afterwards and is refused: the store keeps cell 2. On the code before, cell 1's
    checkpoint replaced it and a wake or a rebuild lost cell 2."""
    from harness import ReplicaGroup

    from notebookos.kernel.state_sync import WRITE_DELAY_VAR

    store_url = f"file://{tmp_path}/store"
    group = ReplicaGroup(tmp_path / "group", store_url=store_url)
    group.replica_env[1] = {WRITE_DELAY_VAR: "3"}
    try:
        group.start()
        assert group.execute("x = 1", target=1).executor() == 1
        assert group.execute("x = 2", target=2).executor() == 2
        store = open_store(store_url, group.key.encode())
        time.sleep(4)  # replica 1's stalled write has landed (or been refused) by now
        checkpoint = read_checkpoint(store, group.kernel_id)
        assert checkpoint.execution_count == 2
        namespace = {}
        restore_namespace(store, checkpoint, namespace)
        assert namespace["x"] == 2
        assert group.status()[1]["checkpoints_refused"] >= 1
    finally:
        group.stop()
