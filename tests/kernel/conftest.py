"""Fixtures of the state-sync tests: a file store and a codec pair on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from codec_pair import HMAC_KEY, Pair
from harness import ReplicaGroup

from notebookos.store import LargeObjectStore, open_store
from notebookos.testing.optional import require_torch


@pytest.fixture
def torch_installed() -> None:
    """Skip where torch is missing; fail instead under NOTEBOOKOS_REQUIRE_SERVICES=1."""
    require_torch()


@pytest.fixture
def file_store(tmp_path: Path) -> Iterator[LargeObjectStore]:
    store = open_store(f"file://{tmp_path / 'objects'}", HMAC_KEY)
    yield store
    store.close()


@pytest.fixture
def pair(file_store: LargeObjectStore) -> Iterator[Pair]:
    p = Pair(file_store)
    yield p
    p.close()


@pytest.fixture
def group(tmp_path: Path) -> Iterator[ReplicaGroup]:
    """Three real replica processes with a file store, stopped after the test (a module may
    define its own ``group``)."""
    replicas = ReplicaGroup(tmp_path, store_url=f"file://{tmp_path}/store")
    try:
        replicas.start()
        yield replicas
    finally:
        replicas.stop()
