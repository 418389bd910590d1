"""The large-object store interface.

A store keeps byte values under string keys. Every value is stored together with an HMAC-SHA256
over its bytes, computed with the caller's key (see ``integrity``); ``get`` checks it before
returning anything, so a tampered or foreign value is refused before a single byte reaches
``pickle``.

Values over ``CHUNK_SIZE`` are moved in chunks; ``put`` accepts either ``bytes`` or an iterable of
``bytes`` chunks and ``get_stream`` yields verified chunks. Each backend makes a write atomic: no
partial value is ever readable under a key (see docs/store.md).
"""

from __future__ import annotations

import abc
import hmac
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from notebookos.store.integrity import (
    BLOCK_SIZE,
    FORMAT,
    BackgroundMac,
    ValueMac,
    block_hash,
    check_format,
    check_hmac_key,
)

CHUNK_SIZE = 64 * 1024 * 1024  # values larger than this are streamed in chunks
MAX_KEY_LENGTH = 512

Value = bytes | bytearray | memoryview | Iterable[bytes]
Buffer = Any  # an object with a writable buffer: bytearray, a numpy array (collections.abc.Buffer, 3.12)


def allocated(allocate: Callable[[int], Buffer], length: int) -> tuple[Buffer, memoryview]:
    """``allocate(length)``'s buffer and a byte view of it; a buffer of another size is refused."""
    buffer = allocate(length)
    view = memoryview(buffer).cast("B")
    if len(view) != length:
        raise ValueError(f"allocate({length}) returned {len(view)} bytes")
    return buffer, view


class StoreError(Exception):
    """A store operation failed. The message names the backend and the key."""

    def __init__(self, backend: str, key: str, reason: str) -> None:
        super().__init__(f"{backend} store, key {key!r}: {reason}")
        self.backend = backend
        self.key = key
        self.reason = reason


class KeyNotFound(StoreError, KeyError):
    """No value is stored under the key."""

    def __init__(self, backend: str, key: str) -> None:
        StoreError.__init__(self, backend, key, "no value is stored under this key")

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return StoreError.__str__(self)


Fence = tuple[int, int]  # (epoch, count): a value's place in its writers' order (put_fenced)
MAX_FENCE_PART = 2**53 - 1  # Redis compares fences in Lua, whose numbers are doubles


def check_fence(fence: Fence) -> Fence:
    """``fence`` as a pair of ints in 0..2**53-1, else ``ValueError`` saying why."""
    if (not isinstance(fence, tuple) or len(fence) != 2
            or not all(isinstance(part, int) and not isinstance(part, bool) for part in fence)
            or not all(0 <= part <= MAX_FENCE_PART for part in fence)):
        raise ValueError(f"a fence is a pair of ints in 0..{MAX_FENCE_PART}, not {fence!r}")
    return fence


class IntegrityError(StoreError):
    """The stored value's HMAC does not match its bytes (tampered, truncated or foreign key)."""


def validate_key(key: str) -> str:
    """Return ``key`` if it is a valid store key, else raise ``ValueError`` saying why.

    Keys look like ``kernel-id/objects/<digest>``: printable ASCII, ``/``-separated segments, no
    empty, ``.`` or ``..`` segment, no leading or trailing ``/``.
    """
    if not isinstance(key, str):
        raise TypeError(f"store key must be a str, not {type(key).__name__}")
    if not key:
        raise ValueError("store key must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"store key is {len(key)} characters long; at most {MAX_KEY_LENGTH}")
    if not key.isascii() or not key.isprintable() or any(c.isspace() or c == "\\" for c in key):
        raise ValueError(f"store key {key!r} must be printable ASCII without spaces or backslashes")
    if key.startswith("/"):
        raise ValueError(f"store key {key!r} must not start with '/'")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise ValueError(
                f"store key {key!r} has an empty, '.' or '..' segment; use names like "
                "'kernel-id/objects/<digest>'"
            )
    return key


def iter_value(value: Value, piece_size: int) -> Iterator[bytes | memoryview]:
    """The value as a stream of pieces; a bytes-like value is sliced without copying."""
    if isinstance(value, str):
        raise TypeError("store values are bytes; encode the str first")
    if isinstance(value, bytes | bytearray | memoryview):
        view = memoryview(value)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        for offset in range(0, len(view), piece_size):
            yield view[offset : offset + piece_size]
        return
    try:
        pieces = iter(value)
    except TypeError:
        raise TypeError(
            f"store value must be bytes-like or an iterable of bytes, not {type(value).__name__}"
        ) from None
    for piece in pieces:
        if not isinstance(piece, bytes | bytearray | memoryview):
            raise TypeError(f"store value chunks must be bytes-like, not {type(piece).__name__}")
        if len(piece):
            yield piece


class LargeObjectStore(abc.ABC):
    """put / get / delete / exists over bytes, HMAC-checked, chunked for big values."""

    backend: str = "abstract"

    @abc.abstractmethod
    def put(self, key: str, value: Value) -> None:
        """Store ``value`` under ``key`` atomically: readers see the old value or the whole new one."""

    @abc.abstractmethod
    def put_fenced(self, key: str, value: Value, fence: Fence) -> Fence | None:
        """Store ``value`` under ``key`` with ``fence`` unless the value stored there has a
        higher fence (pairs compare in order: epoch first); an equal one is replaced. One atomic
        compare-and-set: a writer that was frozen (SIGSTOP) mid-write cannot land its older value
        over a newer one written meanwhile (issue 34). Returns None when written, else the
        stored fence that refused it (nothing was written then). A value stored by ``put`` has
        fence (0, 0)."""

    @abc.abstractmethod
    def fence_of(self, key: str) -> Fence | None:
        """The fence of the value stored under ``key`` ((0, 0) for one stored by ``put``); None
        when there is none."""

    @abc.abstractmethod
    def get_stream(self, key: str) -> Iterator[bytes]:
        """Yield the value's bytes in chunks. The HMAC is verified before the first chunk is yielded."""

    def get(self, key: str) -> bytes:
        """Return the whole value, HMAC-verified."""
        return b"".join(self.get_stream(key))

    def get_into(self, key: str, allocate: Callable[[int], Buffer]) -> Buffer:
        """The whole value, HMAC-verified, in a buffer ``allocate(length)`` returns (writable,
        C-contiguous, ``length`` bytes): the caller owns it, e.g. a tensor's own storage. A
        backend that can read into it directly does (``S3Store``); the others copy once."""
        value = self.get(key)
        buffer, view = allocated(allocate, len(value))
        view[:] = value
        return buffer

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the value; deleting a missing key is not an error."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether a complete value is stored under ``key``."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Safe to call twice."""

    def __enter__(self) -> LargeObjectStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AuthenticatedStore(LargeObjectStore):
    """Shared plumbing of the backends: the HMAC key, key checks and verified streaming.

    ``write_format``: the value format (``integrity``) puts write; reads take each value's own.
    """

    write_format: int = FORMAT

    def __init__(self, hmac_key: bytes) -> None:
        self._hmac_key = check_hmac_key(hmac_key)

    def _new_mac(self, key: str, fmt: int, keep_block_digests: bool = False) -> ValueMac:
        return ValueMac(self._hmac_key, key, fmt, keep_block_digests)

    def _writer_mac(self, key: str, value: Value) -> ValueMac | BackgroundMac:
        """The MAC for a put: hashed on a worker thread, overlapping the writes, for big values."""
        mac = self._new_mac(key, self.write_format)
        if isinstance(value, bytes | bytearray | memoryview) and len(value) < 2 * BLOCK_SIZE:
            return mac
        return BackgroundMac(mac)

    def _error(self, key: str, reason: str) -> StoreError:
        return StoreError(self.backend, key, reason)

    @staticmethod
    def _magic(stem: bytes, fmt: int) -> bytes:
        """The 8-byte magic of a value of format ``fmt``: a backend's 7-byte stem and the
        format's digit (``NBOSOBJ2``, ``NBOSTRL1``)."""
        return stem + str(fmt).encode()

    def _format_of_magic(self, key: str, magic: bytes, stem: bytes, what: str) -> int:
        """The format a stored value's magic names (``_magic``); a foreign or newer one is
        refused, saying which (``what``: where the magic is, e.g. "file", "object")."""
        if magic[:7] != stem:
            raise self._integrity_error(key, f"not a NotebookOS store {what} (bad magic)")
        try:
            return check_format(int(magic[7:]))
        except ValueError:
            raise self._integrity_error(
                key, f"stored in a value format this NotebookOS does not read (magic {magic!r}; "
                "written by a newer version?)"
            ) from None

    def _integrity_error(self, key: str, reason: str) -> IntegrityError:
        return IntegrityError(self.backend, key, reason)

    def _check_mac(self, key: str, mac: ValueMac | BackgroundMac, expected: bytes) -> None:
        if not hmac.compare_digest(mac.digest(), expected):
            raise self._integrity_error(
                key,
                "HMAC mismatch: the value was tampered with, truncated, or written with another "
                "HMAC key; refusing to return it",
            )

    def _verified_stream(
        self, key: str, fmt: int, expected_mac: bytes, read_blocks: Callable[[], Iterator[bytes]]
    ) -> Iterator[bytes]:
        """Two passes over a value too big to hold: verify it all, then yield re-checked blocks.

        ``read_blocks`` must yield the value in ``BLOCK_SIZE`` pieces (the last may be shorter)
        and may be called twice. The first pass checks the MAC and keeps each block's digest;
        the second pass yields a block only after its digest matches the one the first pass saw,
        both hashed as format ``fmt`` hashes blocks,
        so a value changed between the passes is refused too. Memory stays at one block.
        This call does the first pass before returning.
        """
        mac = self._new_mac(key, fmt, keep_block_digests=True)
        for block in read_blocks():
            mac.update(block)
        self._check_mac(key, mac, expected_mac)
        digests = mac.block_digests or []
        return self._recheck_blocks(key, block_hash(fmt), digests, read_blocks)

    def _recheck_blocks(
        self, key: str, hasher: Callable[..., Any], digests: list[bytes],
        read_blocks: Callable[[], Iterator[bytes]],
    ) -> Iterator[bytes]:
        index = 0
        for block in read_blocks():
            if len(block) > BLOCK_SIZE:
                raise self._error(key, "internal error: stream piece larger than a block")
            if index >= len(digests) or hasher(block).digest() != digests[index]:
                raise self._integrity_error(
                    key, f"block {index} changed between verification and reading"
                )
            index += 1
            yield block
        if index != len(digests):
            raise self._integrity_error(key, "value shrank between verification and reading")
