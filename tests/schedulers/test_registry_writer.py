"""The registry's writes leave the scheduler's lock (issue 32): one writer applies them, the
newest version of a record replacing one not yet written, a failing store is tried again, and
``flush`` (called before every gRPC answer) waits for what was taken before it."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from notebookos.global_scheduler.registry_store import FileRegistryStore, RegistryStore
from notebookos.global_scheduler.registry_writer import RegistryWriter

pytestmark = pytest.mark.timeout(60)


class SlowStore(RegistryStore):
    """A store whose writes take ``delay_s`` (Redis across a slow link, a disk compacting) and
    fail while ``failing`` is set."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.failing = threading.Event()
        self.writes: list[tuple[str, str, dict | None]] = []
        self.hosts: dict[str, dict] = {}
        self.kernels: dict[str, dict] = {}

    def _write(self, table: str, record_id: str, doc: dict | None) -> None:
        time.sleep(self.delay_s)
        if self.failing.is_set():
            raise ConnectionError("the store is down")
        self.writes.append((table, record_id, doc))
        records = self.kernels if table == "kernels" else self.hosts
        if doc is None:
            records.pop(record_id, None)
        else:
            records[record_id] = doc

    def load(self) -> tuple[dict, dict]:
        return dict(self.hosts), dict(self.kernels)

    def put_host(self, host_id: str, doc: dict) -> None:
        self._write("hosts", host_id, doc)

    def delete_host(self, host_id: str) -> None:
        self._write("hosts", host_id, None)

    def put_kernel(self, kernel_id: str, doc: dict) -> None:
        self._write("kernels", kernel_id, doc)

    def delete_kernel(self, kernel_id: str) -> None:
        self._write("kernels", kernel_id, None)


def test_a_write_returns_at_once_and_flush_waits_until_the_store_has_it() -> None:
    store = SlowStore(delay_s=0.3)
    writer = RegistryWriter(store)
    started = time.monotonic()
    writer.put_kernel("k1", {"n": 1})
    writer.put_host("h1", {"address": "a"})
    assert time.monotonic() - started < 0.1  # the caller (under the scheduler's lock) goes on
    assert writer.flush()
    assert store.kernels == {"k1": {"n": 1}} and store.hosts == {"h1": {"address": "a"}}
    assert writer.pending == 0
    writer.delete_kernel("k1")
    assert writer.load() == ({"h1": {"address": "a"}}, {})  # load sees every change before it
    writer.close()


def test_flush_async_is_awaited_on_the_loop_holding_no_thread() -> None:
    """A coroutine handler's answer awaits ``flush_async``: the loop goes on meanwhile (a
    ticker keeps ticking), no thread is made for the wait, and it returns once the store has
    what was taken before it; a store that stays down makes it give up at its timeout."""
    store = SlowStore(delay_s=0.3)
    writer = RegistryWriter(store)

    async def main() -> tuple[bool, int, int, float]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick = asyncio.ensure_future(ticker())
        writer.put_kernel("k1", {"n": 1})
        threads = threading.active_count()  # the writer's thread is started by the put
        started = time.monotonic()
        written = await writer.flush_async()
        took = time.monotonic() - started
        tick.cancel()
        return written, ticks, threading.active_count() - threads, took

    written, ticks, more_threads, took = asyncio.run(main())
    assert written and store.kernels == {"k1": {"n": 1}}
    assert 0.25 < took < 2.0 and ticks >= 10 and more_threads == 0
    assert asyncio.run(writer.flush_async())  # nothing pending: at once

    store.failing.set()
    writer.put_kernel("k2", {"n": 2})
    assert not asyncio.run(writer.flush_async(timeout_s=0.5))
    store.failing.clear()
    assert asyncio.run(writer.flush_async()) and store.kernels["k2"] == {"n": 2}
    writer.close()


def test_the_newest_version_of_a_record_replaces_one_not_yet_written() -> None:
    store = SlowStore(delay_s=0.2)
    writer = RegistryWriter(store)
    for n in range(50):
        writer.put_kernel("k1", {"n": n})
    writer.put_kernel("k2", {"n": 0})
    assert writer.flush()
    assert store.kernels["k1"] == {"n": 49} and store.kernels["k2"] == {"n": 0}
    assert len(store.writes) <= 3, store.writes  # the first, then the newest of the rest, k2
    writer.close()


def test_a_failing_store_is_tried_again_and_flush_says_when_it_gave_up() -> None:
    store = SlowStore()
    store.failing.set()
    writer = RegistryWriter(store)
    writer.put_kernel("k1", {"n": 1})
    writer.put_kernel("k2", {"n": 1})
    assert not writer.flush(timeout_s=0.5)
    writer.put_kernel("k1", {"n": 2})  # changed while the store was down: the newest is kept
    store.failing.clear()
    assert writer.flush(timeout_s=10)
    assert store.kernels == {"k1": {"n": 2}, "k2": {"n": 1}}
    writer.close()


def test_close_writes_what_is_pending_and_later_changes_go_straight_to_the_store(
        tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    writer = RegistryWriter(FileRegistryStore(path))
    for n in range(300):  # past the journal's compaction
        writer.put_kernel(f"k{n}", {"n": n})
    writer.close()
    writer.delete_kernel("k0")
    _, kernels = FileRegistryStore(path).load()
    assert len(kernels) == 299 and kernels["k299"] == {"n": 299}
