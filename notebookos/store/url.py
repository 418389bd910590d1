"""``open_store(url, hmac_key)``: pick and configure a backend from a URL."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from notebookos.store.base import LargeObjectStore

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


def open_store(url: str, hmac_key: bytes) -> LargeObjectStore:
    """Open the store a URL names; every value is authenticated with ``hmac_key``."""
    if not isinstance(url, str):
        raise TypeError(f"store URL must be a str, not {type(url).__name__}")
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
        from notebookos.store.redis_store import RedisStore

        connection_url = parts._replace(query="", fragment="").geturl()
        options = {}
        if "prefix" in query:
            options["prefix"] = query["prefix"]
        if "chunk_size" in query:
            options["chunk_size"] = _size(url, "chunk_size", query["chunk_size"])
        return RedisStore(connection_url, hmac_key, **options)

    bucket = parts.netloc
    if not bucket or "@" in bucket or ":" in bucket:
        raise _bad(url, "an S3 URL is s3://bucket/prefix; put credentials in the query")
    from notebookos.store.s3_store import S3Store

    s3_options: dict[str, object] = {
        name: query[name]
        for name in ("endpoint_url", "access_key", "secret_key", "region")
        if name in query
    }
    if "part_size" in query:
        s3_options["part_size"] = _size(url, "part_size", query["part_size"])
    if "threads" in query:
        s3_options["threads"] = _size(url, "threads", query["threads"])
    return S3Store(bucket, parts.path.strip("/"), hmac_key, **s3_options)  # type: ignore[arg-type]
