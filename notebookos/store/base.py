"""The large-object store interface.

A store keeps byte values under string keys. Every value is stored together with an HMAC-SHA256
over its bytes, computed with the caller's key; ``get`` checks it before returning anything, so a
tampered or foreign value is refused before a single byte reaches ``pickle``.

Values over ``CHUNK_SIZE`` are moved in chunks; ``put`` accepts either ``bytes`` or an iterable of
``bytes`` chunks and ``get_stream`` yields verified chunks... see each backend for how a write is
made atomic (no partial value is ever readable under a key).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator

CHUNK_SIZE = 64 * 1024 * 1024  # values larger than this are streamed in chunks of this size


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


class IntegrityError(StoreError):
    """The stored value's HMAC does not match its bytes (tampered, truncated or foreign key)."""


class LargeObjectStore(abc.ABC):
    """put / get / delete / exists over bytes, HMAC-checked, chunked for big values."""

    backend: str = "abstract"

    @abc.abstractmethod
    def put(self, key: str, value: bytes | bytearray | memoryview | Iterable[bytes]) -> None:
        """Store ``value`` under ``key`` atomically: readers see the old value or the whole new one."""

    @abc.abstractmethod
    def get_stream(self, key: str) -> Iterator[bytes]:
        """Yield the value's bytes in chunks. The HMAC is verified before the first chunk is yielded."""

    def get(self, key: str) -> bytes:
        """Return the whole value, HMAC-verified."""
        return b"".join(self.get_stream(key))

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the value; deleting a missing key is not an error."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether a complete value is stored under ``key``."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Safe to call twice."""
