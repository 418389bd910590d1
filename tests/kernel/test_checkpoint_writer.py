"""The replica's checkpoint writer (``kernel/state_sync.StateSync``) on a real file store:
coalesced writes, the deferred checkpoint of a cell that changed nothing, and what ends up in
the store."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from notebookos.kernel.state_sync import StateSync
from notebookos.kernel.sync_codec import read_checkpoint
from notebookos.store import open_store

KEY = b"k" * 32


def _sync(tmp_path: Path) -> StateSync:
    return StateSync(f"file://{tmp_path}/store", KEY, "kern", 1 << 20, logging.getLogger("t"))


def _wait(predicate, timeout: float = 10) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_burst_of_cells_is_coalesced_and_the_last_count_is_stored(tmp_path):
    sync = _sync(tmp_path)
    written: list[int] = []
    lock = threading.Lock()

    def done(count: int) -> None:
        with lock:
            written.append(count)

    for count in range(1, 51):
        sync.checkpoint_in_background(count, done)
    _wait(lambda: written and written[-1] == 50)
    assert written == sorted(written) and len(written) < 50, written  # fewer writes than cells
    store = open_store(f"file://{tmp_path}/store", KEY)
    assert read_checkpoint(store, "kern").execution_count == 50
    sync.close()


def test_a_cell_that_changed_nothing_is_checkpointed_later_unless_another_cell_covers_it(tmp_path):
    sync = _sync(tmp_path)
    written: list[int] = []
    sync.checkpoint_later(3, written.append, delay_s=0.3)
    time.sleep(0.1)
    assert written == []  # not yet
    _wait(lambda: written == [3])
    # a state-changing cell writes at once and covers a pending deferred one
    sync.checkpoint_later(4, written.append, delay_s=5)
    sync.checkpoint_in_background(5, written.append)
    _wait(lambda: written[-1] == 5)
    assert 4 not in written
    sync.close()  # cancels the timer
    time.sleep(0.1)
    assert written == [3, 5]


def test_a_cell_that_keeps_the_count_is_pending_until_a_checkpoint_holds_it(tmp_path):
    """A silent cell leaves execution_count alone: a checkpoint of the same count is written
    again, and ``checkpoint_pending`` says when it is (per-cell containers wait for that)."""
    sync = _sync(tmp_path)
    written: list[int] = []
    assert not sync.checkpoint_pending()
    sync.checkpoint_in_background(2, written.append)
    _wait(lambda: written == [2])
    sync.mark_changed()  # a silent cell starts: count still 2
    assert sync.checkpoint_pending()
    sync.checkpoint_in_background(2, written.append)
    _wait(lambda: written == [2, 2])
    _wait(lambda: not sync.checkpoint_pending())
    sync.checkpoint_in_background(2, written.append)  # nothing new: no write
    time.sleep(0.3)
    assert written == [2, 2]
    sync.close()


def test_a_shorter_delay_brings_a_pending_deferred_checkpoint_forward(tmp_path):
    """A state-changing cell checkpoints a moment after its commit (CHECKPOINT_AFTER_CHANGE_S),
    even when a cell that changed nothing left a later timer pending; cells in quick
    succession share one write."""
    sync = _sync(tmp_path)
    written: list[int] = []
    sync.checkpoint_later(1, written.append, delay_s=30)
    for count in (2, 3, 4):
        sync.checkpoint_later(count, written.append, delay_s=0.2)
    _wait(lambda: written == [4], timeout=5)
    time.sleep(0.3)
    assert written == [4]  # one write for the three, and the 30 s timer is gone
    sync.close()
