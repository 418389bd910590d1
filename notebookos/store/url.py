"""``open_store(url, hmac_key)``: pick and configure a backend from a URL."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

from notebookos.store.base import Buffer, Fence, LargeObjectStore, Value
from notebookos.store.integrity import check_hmac_key

SCHEMES = ("file", "redis", "rediss", "s3")
_ALLOWED = (
    "file:///absolute/path[?fsync=1], redis://host:port/db[?prefix=...&chunk_size=...] "
    "(or rediss://), s3://bucket/prefix[?endpoint_url=...&access_key=...&secret_key=..."
    "&region=...&part_size=...&threads=...]"
)
_OPTIONS = {
    "file": {"fsync"},
    "redis": {"prefix", "chunk_size"},
    "rediss": {"prefix", "chunk_size"},
    "s3": {"endpoint_url", "access_key", "secret_key", "region", "part_size", "threads"},
}


def _bad(url: str, why: str) -> ValueError:
    return ValueError(f"bad store URL {url!r}: {why}. Allowed: {_ALLOWED}")


def _flag(url: str, name: str, raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise _bad(url, f"{name}={raw!r} is not a boolean (use 1 or 0)")


def _size(url: str, name: str, raw: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = raw.strip().lower().removesuffix("ib").removesuffix("b")
    factor = 1
    if text and text[-1] in units:
        factor, text = units[text[-1]], text[:-1]
    try:
        value = int(text) * factor
    except ValueError:
        raise _bad(url, f"{name}={raw!r} is not a size (e.g. 8388608 or 8MiB)") from None
    if value <= 0:
        raise _bad(url, f"{name} must be positive")
    return value


class LazyStore(LargeObjectStore):
    """A network store whose client library is imported and its client made on first use.

    boto3 or redis cost a process tens of MB and a few hundred ms to import; a kernel replica
    opens its store at start, and a standby may never touch it (issue 18). The URL was checked
    when this was made; only errors of making the client itself come at first use."""

    def __init__(self, opener: Callable[[], LargeObjectStore], backend: str) -> None:
        self.backend = backend  # the backend's name, as its store class says it
        self._opener = opener
        self._store: LargeObjectStore | None = None
        self._lock = threading.Lock()

    @property
    def opened(self) -> bool:
        return self._store is not None

    def real(self) -> LargeObjectStore:
        """The real store (made now if it was not yet)."""
        store = self._store
        if store is None:
            with self._lock:
                if self._store is None:
                    self._store = self._opener()
                store = self._store
        return store

    def put(self, key: str, value: Value) -> None:
        self.real().put(key, value)

    def put_fenced(self, key: str, value: Value, fence: Fence) -> Fence | None:
        return self.real().put_fenced(key, value, fence)

    def fence_of(self, key: str) -> Fence | None:
        return self.real().fence_of(key)

    def get_stream(self, key: str) -> Iterator[bytes]:
        return self.real().get_stream(key)

    def get(self, key: str) -> bytes:
        return self.real().get(key)

    def get_into(self, key: str, allocate: Callable[[int], Buffer]) -> Buffer:
        return self.real().get_into(key, allocate)

    def delete(self, key: str) -> None:
        self.real().delete(key)

    def exists(self, key: str) -> bool:
        return self.real().exists(key)

    def close(self) -> None:
        with self._lock:
            store = self._store
        if store is not None:
            store.close()

    def __getattr__(self, name: str) -> Any:  # a backend's own extras
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.real(), name)


def open_store(url: str, hmac_key: bytes, lazy: bool = False) -> LargeObjectStore:
    """Open the store a URL names; every value is authenticated with ``hmac_key``.

    ``lazy``: a Redis or S3 store's client (and its library) is made on first use
    (``LazyStore``); the URL is checked now either way. A file store is always made now."""
    if not isinstance(url, str):
        raise TypeError(f"store URL must be a str, not {type(url).__name__}")
    if lazy:
        check_hmac_key(hmac_key)  # what the backend would refuse, refused now
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise _bad(url, f"unknown scheme {parts.scheme!r}")
    query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
    unknown = set(query) - _OPTIONS[scheme]
    if unknown:
        raise _bad(url, f"unknown option(s) {', '.join(sorted(unknown))} for {scheme}://")

    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise _bad(url, "file URLs name a local path: file:///path (three slashes)")
        if not parts.path.startswith("/"):
            raise _bad(url, "file URLs need an absolute path")
        from notebookos.store.file_store import FileStore

        fsync = _flag(url, "fsync", query["fsync"]) if "fsync" in query else False
        return FileStore(parts.path, hmac_key, fsync=fsync)

    if scheme in ("redis", "rediss"):
        if not parts.hostname:
            raise _bad(url, "a Redis URL needs a host: redis://host:port/db")
        connection_url = parts._replace(query="", fragment="").geturl()
        options = {}
        if "prefix" in query:
            options["prefix"] = query["prefix"]
        if "chunk_size" in query:
            options["chunk_size"] = _size(url, "chunk_size", query["chunk_size"])

        def redis_store() -> LargeObjectStore:
            from notebookos.store.redis_store import RedisStore

            return RedisStore(connection_url, hmac_key, **options)

        return LazyStore(redis_store, "redis") if lazy else redis_store()

    bucket = parts.netloc
    if not bucket or "@" in bucket or ":" in bucket:
        raise _bad(url, "an S3 URL is s3://bucket/prefix; put credentials in the query")
    s3_options: dict[str, object] = {
        name: query[name]
        for name in ("endpoint_url", "access_key", "secret_key", "region")
        if name in query
    }
    if "part_size" in query:
        s3_options["part_size"] = _size(url, "part_size", query["part_size"])
    if "threads" in query:
        s3_options["threads"] = _size(url, "threads", query["threads"])

    def s3_store() -> LargeObjectStore:
        from notebookos.store.s3_store import S3Store

        return S3Store(bucket, parts.path.strip("/"), hmac_key,
                       **s3_options)  # type: ignore[arg-type]

    return LazyStore(s3_store, "s3") if lazy else s3_store()
