"""Which cells the executor encodes on its loop and which on a worker thread
(``kernel/state_sync.StateSync.encode_cell``): a few plain scalars inline (the thread's round
trip cost more than the pickling, issue 36), anything else on the thread; the update is the
same either way."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

import pytest

from notebookos.kernel.state_sync import StateSync
from notebookos.kernel.sync_codec import SyncUpdate


class _Shell:
    def __init__(self, namespace: dict) -> None:
        self.user_ns = namespace

    def transform_cell(self, code: str) -> str:
        return code


@pytest.mark.parametrize(("code", "namespace", "inline"), [
    ("1 + 1", {}, True),
    ("n = 1; x = 2.5; s = 'abc'; del gone", {"n": 1, "x": 2.5, "s": "abc"}, True),
    ("big = 'x' * 10_000", {"big": "x" * 10_000}, False),
    ("rows = [1, 2]", {"rows": [1, 2]}, False),
    ("a=b=c=d=e=f=g=h=i=1", dict.fromkeys("abcdefghi", 1), False),  # more than LIGHT_NAMES
])
def test_a_few_scalars_are_encoded_inline_and_the_rest_on_a_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str, namespace: dict,
        inline: bool) -> None:
    sync = StateSync(f"file://{tmp_path}/store", b"k" * 32, "kern", 1 << 20,
                     logging.getLogger("t"))
    threads: list[bool] = []
    encode = sync._encoder.encode

    def watched(ns, effects):  # noqa: ANN001, ANN202
        threads.append(threading.current_thread() is threading.main_thread())
        return encode(ns, effects)

    monkeypatch.setattr(sync._encoder, "encode", watched)
    update, warnings = asyncio.run(sync.encode_cell(_Shell(namespace), code))
    assert threads == [inline]
    assert not warnings
    names = set(namespace) - {"gone"}
    if names:
        assert update is not None
        assert {e.name for e in SyncUpdate.from_bytes(update).entries} >= names
    sync.close()
