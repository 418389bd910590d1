"""An executor and a standby namespace joined by the state-sync codec, as a replica uses it
(the fixtures ``file_store`` and ``pair`` are in this folder's conftest.py)."""

from __future__ import annotations

import textwrap
import uuid
from typing import Any

from notebookos.kernel.ast_effects import CellEffects, analyze_cell
from notebookos.kernel.sync_codec import StateApplier, StateEncoder, SyncState, SyncUpdate
from notebookos.store import LargeObjectStore

HMAC_KEY = b"test-kernel-key-0123456789abcdef"


def new_namespace() -> dict[str, Any]:
    # IPython's user namespace is the dict of a module named __main__.
    return {"__name__": "__main__", "__builtins__": __builtins__}


class Pair:
    """An executor and a standby namespace joined by the codec, as the replica uses it."""

    def __init__(self, store: LargeObjectStore, kernel_id: str | None = None,
                 threshold_bytes: int = 1 << 20) -> None:
        self.store = store
        self.kernel_id = kernel_id or f"k-{uuid.uuid4().hex[:8]}"
        self.executor_state = SyncState()
        self.encoder = StateEncoder(store, self.kernel_id, threshold_bytes,
                                    state=self.executor_state)
        self.standby_state = SyncState()
        self.applier = StateApplier(store, state=self.standby_state)
        self.executor = new_namespace()
        self.standby = new_namespace()

    def run(self, code: str) -> SyncUpdate:
        """Run a cell on the executor and replicate it; returns the decoded Raft record."""
        code = textwrap.dedent(code)
        exec(compile(code, "<cell>", "exec"), self.executor)
        return self.replicate(analyze_cell(code))

    def replicate(self, effects: CellEffects) -> SyncUpdate:
        record = self.encoder.encode(self.executor, effects).to_bytes()
        update = SyncUpdate.from_bytes(record)
        self.applier.prefetch(update)
        self.applier.apply(self.standby, update)
        return update

    def close(self) -> None:
        self.applier.close()
