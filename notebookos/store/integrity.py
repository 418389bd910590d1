"""Value authentication: an HMAC-SHA256 over a value's bytes, bound to its key and length.

Format v1. The value is cut into ``BLOCK_SIZE`` blocks; each block is hashed with SHA-256 and the
MAC is ``HMAC-SHA256(hmac_key, DOMAIN || key || 0x00 || d_0 || d_1 || ... || u64be(length))``
where ``d_i`` is the SHA-256 of block ``i``. This is an HMAC over the bytes (SHA-256 is collision
resistant, so the digests stand for the bytes) that lets a streaming reader re-check each block on a
second pass with the digests it kept from the first, without a third hash pass. The key and the
length are inside the MAC, so a value cannot be moved to another key, truncated or extended.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

BLOCK_SIZE = 8 * 1024 * 1024
MAC_SIZE = 32
HASH_THREADS = 4
DOMAIN = b"notebookos-store-v1\x00"


def check_hmac_key(hmac_key: bytes) -> bytes:
    if not isinstance(hmac_key, bytes | bytearray):
        raise TypeError(f"hmac_key must be bytes, not {type(hmac_key).__name__}")
    if not hmac_key:
        raise ValueError("hmac_key must not be empty: every stored value is authenticated with it")
    return bytes(hmac_key)


class ValueMac:
    """Incremental MAC of one value; ``update`` with the bytes in order, then ``digest``."""

    def __init__(self, hmac_key: bytes, key: str, keep_block_digests: bool = False) -> None:
        self._mac = hmac.new(hmac_key, DOMAIN + key.encode() + b"\x00", hashlib.sha256)
        self._block = hashlib.sha256()
        self._in_block = 0
        self._final: bytes | None = None
        self.length = 0
        self.block_digests: list[bytes] | None = [] if keep_block_digests else None

    def update(self, data: bytes | bytearray | memoryview) -> None:
        if self._final is not None:
            raise RuntimeError("ValueMac.update after digest")
        if self._in_block < 0:
            raise RuntimeError("ValueMac.update after a short block")
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        self.length += len(view)
        if self._in_block == 0 and len(view) >= 2 * BLOCK_SIZE:
            whole = len(view) - len(view) % BLOCK_SIZE
            for digest in block_digests(view[:whole]):
                self._add_digest(digest)
            view = view[whole:]
        while view:
            take = min(len(view), BLOCK_SIZE - self._in_block)
            if take == len(view):
                self._block.update(view)
            else:
                self._block.update(view[:take])
            self._in_block += take
            view = view[take:]
            if self._in_block == BLOCK_SIZE:
                self._end_block()

    def add_block_digests(self, digests: list[bytes], nbytes: int) -> None:
        """Feed blocks hashed elsewhere (``block_digests``), e.g. in parallel worker threads.

        Only at a block boundary; every block but the value's last must be full.
        """
        if self._in_block:
            raise RuntimeError("add_block_digests needs the stream to be at a block boundary")
        for digest in digests:
            self._add_digest(digest)
        self.length += nbytes
        if nbytes % BLOCK_SIZE:
            self._in_block = -1  # a short block ends the value: no more data may follow

    def _end_block(self) -> None:
        self._add_digest(self._block.digest())
        self._block = hashlib.sha256()
        self._in_block = 0

    def _add_digest(self, digest: bytes) -> None:
        self._mac.update(digest)
        if self.block_digests is not None:
            self.block_digests.append(digest)

    def digest(self) -> bytes:
        if self._final is None:
            if self._in_block > 0:
                self._end_block()
            self._mac.update(self.length.to_bytes(8, "big"))
            self._final = self._mac.digest()
        return self._final

    def close(self) -> None:
        """Nothing to release (the same interface as ``BackgroundMac``)."""

    def matches(self, expected: bytes) -> bool:
        return hmac.compare_digest(self.digest(), expected)


_hash_pool: ThreadPoolExecutor | None = None
_hash_pool_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _hash_pool
    with _hash_pool_lock:
        if _hash_pool is None:
            workers = max(1, min(HASH_THREADS, os.cpu_count() or 1))
            _hash_pool = ThreadPoolExecutor(workers, thread_name_prefix="nbos-hash")
        return _hash_pool


def _forget_pool_after_fork() -> None:
    global _hash_pool, _hash_pool_lock
    _hash_pool = None  # its threads did not survive the fork
    _hash_pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_after_fork)


def block_digests(data: bytes | bytearray | memoryview) -> list[bytes]:
    """SHA-256 of each ``BLOCK_SIZE`` block of ``data`` (a block-aligned piece of a value).

    Several blocks are hashed in parallel threads (hashlib releases the GIL).
    """
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    offsets = range(0, len(view), BLOCK_SIZE)

    def digest(offset: int) -> bytes:
        return hashlib.sha256(view[offset : offset + BLOCK_SIZE]).digest()

    if len(offsets) < 2 or threading.current_thread().name.startswith("nbos-hash"):
        return [digest(offset) for offset in offsets]
    return list(_pool().map(digest, offsets))


def block_digest_later(block: bytes | bytearray | memoryview) -> Future[bytes]:
    """The SHA-256 of one block, hashed on the shared hash threads (for a reader that hashes
    each block as it lands, overlapping its I/O; the block must not change until done)."""
    return _pool().submit(lambda: hashlib.sha256(block).digest())


def blocks_of(
    chunks: Iterable[bytes | memoryview], size: int = BLOCK_SIZE
) -> Iterator[bytes | memoryview]:
    """Re-cut a stream into pieces of exactly ``size`` bytes (the last may be shorter).

    Pieces that already have the right length pass through without a copy.
    """
    pending = bytearray()
    for chunk in chunks:
        if not pending and len(chunk) == size:
            yield chunk
            continue
        pending += chunk
        while len(pending) >= size:
            yield bytes(pending[:size])
            del pending[:size]
    if pending:
        yield bytes(pending)


class BackgroundMac:
    """A ``ValueMac`` fed from a worker thread, so hashing overlaps the caller's I/O.

    ``update`` queues the piece (it must not be mutated until ``digest``) and returns; at most
    ``max_pending`` pieces wait, which bounds memory for streamed inputs. ``digest`` waits for all.
    """

    def __init__(self, mac: ValueMac, max_pending: int = 4) -> None:
        self._mac = mac
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="nbos-mac")
        self._pending: deque[Future] = deque()
        self._max_pending = max_pending
        self.length = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self.length += len(data)
        self._pending.append(self._worker.submit(self._mac.update, data))
        while len(self._pending) > self._max_pending:
            self._pending.popleft().result()

    def digest(self) -> bytes:
        while self._pending:
            self._pending.popleft().result()
        self._worker.shutdown(wait=False)
        return self._mac.digest()

    def close(self) -> None:
        """Drop queued work (after a failed write)."""
        for future in self._pending:
            future.cancel()
        self._pending.clear()
        self._worker.shutdown(wait=False, cancel_futures=True)
