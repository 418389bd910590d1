"""The large-object store: HMAC-checked byte values under string keys, three backends by URL.

    from notebookos.store import open_store
    store = open_store("file:///var/lib/notebookos/objects", hmac_key)
    store.put("kernel-id/objects/<digest>", data)   # bytes or an iterable of byte chunks
    data = store.get("kernel-id/objects/<digest>")

URLs (see docs/store.md): ``file:///path[?fsync=1]``, ``redis://host:port/db[?prefix=...]``
(also ``rediss://``), ``s3://bucket/prefix[?endpoint_url=...&access_key=...&secret_key=...
&region=...]``.
"""

from __future__ import annotations

from notebookos.store.base import (
    CHUNK_SIZE,
    Fence,
    IntegrityError,
    KeyNotFound,
    LargeObjectStore,
    StoreError,
    validate_key,
)
from notebookos.store.url import SCHEMES, open_store

__all__ = [
    "CHUNK_SIZE",
    "Fence",
    "SCHEMES",
    "IntegrityError",
    "KeyNotFound",
    "LargeObjectStore",
    "StoreError",
    "open_store",
    "validate_key",
]
