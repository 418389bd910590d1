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
from collections.abc import Iterable, Iterator

BLOCK_SIZE = 8 * 1024 * 1024
MAC_SIZE = 32
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
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        self.length += len(view)
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

    def _end_block(self) -> None:
        digest = self._block.digest()
        self._mac.update(digest)
        if self.block_digests is not None:
            self.block_digests.append(digest)
        self._block = hashlib.sha256()
        self._in_block = 0

    def digest(self) -> bytes:
        if self._final is None:
            if self._in_block:
                self._end_block()
            self._mac.update(self.length.to_bytes(8, "big"))
            self._final = self._mac.digest()
        return self._final

    def matches(self, expected: bytes) -> bool:
        return hmac.compare_digest(self.digest(), expected)


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
