"""The large-object store against its real backends: a directory, a live Redis, a live S3 server."""

from __future__ import annotations

import hashlib
import os
import signal
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from notebookos.store import (
    CHUNK_SIZE,
    IntegrityError,
    KeyNotFound,
    LargeObjectStore,
    StoreError,
    open_store,
    validate_key,
)
from notebookos.store.integrity import BLOCK_SIZE, FORMAT, FORMAT_SHA256

HMAC_KEY = b"test-kernel-hmac-key"
BACKENDS = ["file", "redis", "s3"]


@pytest.fixture
def redis_store_url(redis_url: str) -> Iterator[str]:
    prefix = f"nbos-test-{uuid.uuid4().hex[:8]}"
    yield f"{redis_url}?prefix={prefix}"
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def _url(backend: str, request: pytest.FixtureRequest, tmp_path) -> str:
    if backend == "file":
        return f"file://{tmp_path}/store"
    if backend == "redis":
        return request.getfixturevalue("redis_store_url")
    return request.getfixturevalue("s3_store_url")


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path) -> Iterator[LargeObjectStore]:
    opened = open_store(_url(request.param, request, tmp_path), HMAC_KEY)
    yield opened
    opened.close()


def payload(size: int, seed: int = 0) -> bytes:
    """Deterministic, non-repeating bytes (so misplaced chunks cannot compare equal)."""
    return hashlib.shake_256(f"{seed}:{size}".encode()).digest(size) if size else b""


SIZES = [0, 1, 1000, BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1, 3 * BLOCK_SIZE + 7]


@pytest.mark.parametrize("size", SIZES)
def test_round_trip_bytes(store: LargeObjectStore, size: int) -> None:
    data = payload(size)
    key = f"kernel-{size}/objects/{hashlib.sha256(data).hexdigest()}"
    assert not store.exists(key)
    store.put(key, data)
    assert store.exists(key)
    assert store.get(key) == data
    assert b"".join(store.get_stream(key)) == data


@pytest.mark.parametrize("size", [0, 1000, 3 * BLOCK_SIZE + 7])
def test_get_into_fills_the_callers_buffer_and_still_checks_the_mac(
        store: LargeObjectStore, size: int) -> None:
    data = payload(size, seed=3)
    key = f"into-{size}/objects/x"
    store.put(key, data)
    asked: list[int] = []

    def allocate(length: int) -> bytearray:
        asked.append(length)
        return bytearray(length)

    buffer = store.get_into(key, allocate)
    assert asked == [size] and isinstance(buffer, bytearray) and buffer == data
    if size:
        flip_byte(store, key, offset=size // 2)
        with pytest.raises(IntegrityError):
            store.get_into(key, bytearray)


def test_file_get_into_reads_straight_into_the_buffer(tmp_path, monkeypatch) -> None:
    """A wake's restore fetches each replica's large objects with ``get_into``: the file store
    reads the file into the caller's buffer (one copy, hashing beside the reads), not into
    bytes that are then copied (``get``, the default)."""
    from notebookos.store.file_store import FileStore

    store = open_store(f"file://{tmp_path}/store", HMAC_KEY)
    data = payload(3 * BLOCK_SIZE + 7, seed=5)
    store.put("wake/objects/x", data)
    monkeypatch.setattr(FileStore, "get", lambda self, key: pytest.fail("get_into went via get"))
    assert store.get_into("wake/objects/x", bytearray) == data


def test_get_into_refuses_a_buffer_of_the_wrong_size(store: LargeObjectStore) -> None:
    store.put("short/x", b"12345")
    with pytest.raises(ValueError, match="allocate"):
        store.get_into("short/x", lambda n: bytearray(n + 1))


def test_round_trip_bigger_than_chunk_size_streams(store: LargeObjectStore) -> None:
    data = payload(CHUNK_SIZE + BLOCK_SIZE + 3)
    pieces = [data[i : i + 5_000_001] for i in range(0, len(data), 5_000_001)]
    store.put("k/objects/big", iter(pieces))  # a generator of odd-sized chunks
    assert store.get("k/objects/big") == data
    chunks = list(store.get_stream("k/objects/big"))
    assert len(chunks) > 1 and all(len(c) <= CHUNK_SIZE for c in chunks)
    assert b"".join(chunks) == data


def test_iterable_and_buffer_inputs(store: LargeObjectStore) -> None:
    store.put("k/a", [b"ab", b"", bytearray(b"cd"), memoryview(b"ef")])
    assert store.get("k/a") == b"abcdef"
    store.put("k/b", bytearray(b"xyz"))
    assert store.get("k/b") == b"xyz"
    with pytest.raises(TypeError):
        store.put("k/c", "text is not bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.put("k/c", [b"ok", 5])  # type: ignore[list-item]
    assert not store.exists("k/c")


def test_overwrite_and_delete(store: LargeObjectStore) -> None:
    store.put("k/x", payload(2 * BLOCK_SIZE + 1, seed=1))
    store.put("k/x", b"short")
    assert store.get("k/x") == b"short"
    store.delete("k/x")
    assert not store.exists("k/x")
    store.delete("k/x")  # deleting a missing key is fine
    with pytest.raises(KeyNotFound):
        store.get("k/x")


def test_missing_key_names_backend_and_key(store: LargeObjectStore) -> None:
    with pytest.raises(KeyNotFound) as caught:
        store.get("nobody/objects/missing")
    assert caught.value.backend == store.backend
    assert store.backend in str(caught.value) and "nobody/objects/missing" in str(caught.value)
    with pytest.raises(KeyError):  # KeyNotFound is also a KeyError
        store.get_stream("nobody/objects/missing")
    assert not store.exists("nobody/objects/missing")


def test_wrong_hmac_key_is_refused(store: LargeObjectStore, request, tmp_path) -> None:
    store.put("k/v", b"secret state")
    backend = request.node.callspec.params["store"]
    other = open_store(_url(backend, request, tmp_path), b"another kernel's key")
    try:
        with pytest.raises(IntegrityError, match="HMAC"):
            other.get("k/v")
    finally:
        other.close()


def test_value_cannot_move_to_another_key(store: LargeObjectStore, tmp_path) -> None:
    """The MAC binds the key: a value copied under another key does not verify."""
    store.put("k/one", b"value one")
    tamper_copy(store, "k/one", "k/two")
    with pytest.raises(IntegrityError):
        store.get("k/two")


@pytest.mark.parametrize("size", [100, CHUNK_SIZE + BLOCK_SIZE])
def test_tampered_value_is_refused_before_any_byte(store: LargeObjectStore, size: int) -> None:
    store.put("k/t", payload(size, seed=2))
    flip_byte(store, "k/t", offset=size - 50)
    with pytest.raises(IntegrityError) as caught:
        store.get("k/t")
    assert store.backend in str(caught.value) and "k/t" in str(caught.value)
    with pytest.raises(IntegrityError):
        store.get_stream("k/t")  # refused before the first chunk is handed out


def test_truncated_value_is_refused(store: LargeObjectStore) -> None:
    store.put("k/t", payload(3 * BLOCK_SIZE, seed=3))
    truncate(store, "k/t")
    with pytest.raises(IntegrityError):
        store.get("k/t")


@pytest.mark.parametrize(
    "key", ["", "/abs", "a/../b", "..", "a//b", "a/./b", "sp ace", "tab\tkey", "é", "a/", "a\\b"]
)
def test_bad_keys_are_rejected(store: LargeObjectStore, key: str) -> None:
    with pytest.raises(ValueError, match="key"):
        store.put(key, b"x")
    with pytest.raises(ValueError, match="key"):
        store.get(key)


def test_validate_key_accepts_object_keys() -> None:
    key = f"kernel-1234/objects/{'ab' * 32}"
    assert validate_key(key) == key
    with pytest.raises(TypeError):
        validate_key(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at most"):
        validate_key("a" * 1000)


@pytest.mark.parametrize(
    "url, fragment",
    [
        ("ftp://host/x", "unknown scheme"),
        ("file://relative/path", "three slashes"),
        ("file:///tmp/x?fsync=maybe", "not a boolean"),
        ("file:///tmp/x?colour=blue", "unknown option"),
        ("redis:///0", "needs a host"),
        ("redis://127.0.0.1:6379/0?chunk_size=lots", "not a size"),
        ("s3:///prefix", "s3://bucket/prefix"),
        ("s3://bucket/p?part_size=1MiB", "part_size"),
        ("s3://bucket/p?access_key=a", "both access_key and secret_key"),
    ],
)
def test_bad_urls_say_what_is_allowed(url: str, fragment: str) -> None:
    with pytest.raises(ValueError) as caught:
        open_store(url, HMAC_KEY)
    assert fragment in str(caught.value)
    assert url in str(caught.value) or "part_size" in fragment or "access_key" in fragment


def test_hmac_key_is_required(tmp_path) -> None:
    with pytest.raises(ValueError, match="hmac_key"):
        open_store(f"file://{tmp_path}", b"")
    with pytest.raises(TypeError, match="hmac_key"):
        open_store(f"file://{tmp_path}", "str key")  # type: ignore[arg-type]


def test_file_layout_and_fsync_option(tmp_path) -> None:
    store = open_store(f"file://{tmp_path}?fsync=1", HMAC_KEY)
    store.put("a", b"1")
    store.put("a/b", b"2")  # 'a' as a value and as a directory do not collide
    assert (store.get("a"), store.get("a/b")) == (b"1", b"2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.d", "a.v"]


def test_s3_credentials_in_url(s3_server) -> None:
    bucket = s3_server.new_bucket()
    store = open_store(s3_server.store_url(bucket, credentials=True), HMAC_KEY)
    store.put("k/v", b"value")
    assert store.get("k/v") == b"value"
    wrong = s3_server.store_url(bucket, credentials=True).replace("notebookos-secret", "wrong")
    with pytest.raises(StoreError, match="s3 store, key 'k/v'"):
        open_store(wrong, HMAC_KEY).get("k/v")


def test_redis_overwrite_leaves_no_old_chunks(redis_store_url: str) -> None:
    store = open_store(redis_store_url, HMAC_KEY)
    store.put("k/v", payload(3 * BLOCK_SIZE, seed=4))
    store.put("k/v", payload(2 * BLOCK_SIZE, seed=5))
    client = store._client  # type: ignore[attr-defined]
    chunks = list(client.scan_iter(f"{store.prefix}:c:*"))  # type: ignore[attr-defined]
    assert len(chunks) == 2
    assert all(client.ttl(c) == -1 for c in chunks)  # published chunks do not expire
    store.delete("k/v")
    assert not list(client.scan_iter(f"{store.prefix}:*"))  # type: ignore[attr-defined]


# -- fenced writes (issue 34) ---------------------------------------------------------------------
# A checkpoint writer frozen by SIGSTOP mid-write finished after it resumed, over the newer
# checkpoint written meanwhile. ``put_fenced`` refuses a value whose (epoch, count) fence is lower
# than the stored one's, atomically on every backend.


@pytest.mark.parametrize("size", [1000, 2 * BLOCK_SIZE + 5])  # one piece; chunks or multipart
def test_a_late_write_with_a_lower_fence_does_not_replace_a_newer_value(
        store: LargeObjectStore, size: int) -> None:
    assert store.fence_of("k/head") is None
    assert store.put_fenced("k/head", payload(size, seed=1), (0, 5)) is None
    assert store.put_fenced("k/head", payload(size, seed=2), (0, 3)) == (0, 5)
    assert store.get("k/head") == payload(size, seed=1)
    assert store.fence_of("k/head") == (0, 5)
    # an equal fence replaces (a silent cell changes state without a new execution count)
    assert store.put_fenced("k/head", payload(size, seed=3), (0, 5)) is None
    assert store.get("k/head") == payload(size, seed=3)


def test_a_new_epoch_writes_from_count_one_and_fences_the_old_one_out(
        store: LargeObjectStore) -> None:
    """A restarted kernel (epoch 1) counts from 1 again; the old incarnation's late write of
    its cell 50 must not land after the restart."""
    assert store.put_fenced("k/head", b"old incarnation", (0, 50)) is None
    assert store.put_fenced("k/head", b"restarted", (1, 1)) is None
    assert store.put_fenced("k/head", b"late write of the old one", (0, 51)) == (1, 1)
    assert store.get("k/head") == b"restarted"
    assert store.fence_of("k/head") == (1, 1)


def test_a_plain_put_has_the_lowest_fence(store: LargeObjectStore) -> None:
    store.put("k/plain", b"unfenced")
    assert store.fence_of("k/plain") == (0, 0)
    assert store.put_fenced("k/plain", b"fenced", (0, 1)) is None
    assert store.get("k/plain") == b"fenced"


def test_a_writer_frozen_mid_write_cannot_land_over_a_newer_value(
        store: LargeObjectStore) -> None:
    """The fault campaign's loss, at the store: the older write is under way (its value
    still streaming in, as in a replica stopped by SIGSTOP) while a newer one completes."""
    import threading

    release, started = threading.Event(), threading.Event()

    def slow_value() -> Iterator[bytes]:
        yield payload(1000, seed=7)
        started.set()
        assert release.wait(30)
        yield payload(1000, seed=8)

    outcome: list[object] = []
    late = threading.Thread(target=lambda: outcome.append(
        store.put_fenced("k/head", slow_value(), (2, 7))))
    late.start()
    assert started.wait(30)
    assert store.put_fenced("k/head", b"newer", (2, 9)) is None
    release.set()
    late.join(30)
    assert outcome == [(2, 9)]
    assert store.get("k/head") == b"newer"


def test_racing_fenced_writers_leave_the_highest_fence(store: LargeObjectStore) -> None:
    from concurrent.futures import ThreadPoolExecutor

    fences = [(epoch, count) for epoch in range(2) for count in range(6)]
    for _round in range(3):
        store.delete("k/race")
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda f: store.put_fenced("k/race", repr(f).encode(), f),
                          reversed(fences) if _round % 2 else fences))
        assert store.fence_of("k/race") == max(fences)
        assert store.get("k/race") == repr(max(fences)).encode()


def test_fences_are_pairs_of_small_ints(store: LargeObjectStore) -> None:
    for bad in [(1,), (0, -1), (0, 2**53), (0, 1.0), [0, 1]]:
        with pytest.raises(ValueError, match="fence"):
            store.put_fenced("k/bad", b"x", bad)  # type: ignore[arg-type]


def test_s3_server_honours_conditional_puts(s3_server) -> None:
    """What the S3 fence rests on: the server refuses a put whose If-Match or If-None-Match
    no longer holds (SeaweedFS 4.48 does; one that ignored them would fence only loosely)."""
    import botocore.exceptions

    client = s3_server.client()
    bucket = s3_server.new_bucket()
    etag = client.put_object(Bucket=bucket, Key="k", Body=b"one")["ETag"]
    client.put_object(Bucket=bucket, Key="k", Body=b"two", IfMatch=etag)
    for condition in ({"IfMatch": etag}, {"IfNoneMatch": "*"}):
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            client.put_object(Bucket=bucket, Key="k", Body=b"stale", **condition)
        assert refused.value.response["Error"]["Code"] in ("PreconditionFailed", "412")
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"two"


# -- value formats --------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [1000, 3 * BLOCK_SIZE + 7, CHUNK_SIZE + BLOCK_SIZE + 3])
def test_values_of_the_earlier_sha256_format_still_read(
        store: LargeObjectStore, request, tmp_path, size: int) -> None:
    """Values put before the switch to BLAKE3 (format 1) read back through every read path."""
    data = payload(size, seed=5)
    writer = open_store(_url(request.node.callspec.params["store"], request, tmp_path), HMAC_KEY)
    try:
        writer.write_format = FORMAT_SHA256  # type: ignore[attr-defined]
        writer.put("old/objects/v", data)
    finally:
        writer.close()
    assert stored_format(store, "old/objects/v") == FORMAT_SHA256
    assert store.get("old/objects/v") == data
    assert bytes(store.get_into("old/objects/v", bytearray)) == data
    assert b"".join(store.get_stream("old/objects/v")) == data
    flip_byte(store, "old/objects/v", offset=size // 2)
    with pytest.raises(IntegrityError, match="HMAC"):
        store.get("old/objects/v")


def test_new_values_are_written_in_the_current_format(store: LargeObjectStore) -> None:
    store.put("new/objects/v", payload(3 * BLOCK_SIZE + 7, seed=6))
    assert stored_format(store, "new/objects/v") == FORMAT == 2


def test_a_value_relabelled_as_the_other_format_is_refused(store: LargeObjectStore) -> None:
    """Each format's MAC has its own domain: changing the label alone never verifies."""
    store.put("k/objects/v", payload(3 * BLOCK_SIZE, seed=7))
    set_stored_format(store, "k/objects/v", FORMAT_SHA256)
    with pytest.raises(IntegrityError, match="HMAC"):
        store.get("k/objects/v")


def test_a_value_of_a_newer_format_is_refused_saying_so(store: LargeObjectStore) -> None:
    store.put("k/objects/v", b"from the future")
    set_stored_format(store, "k/objects/v", 9)
    with pytest.raises(IntegrityError, match="newer version|unknown format"):
        store.get("k/objects/v")


def stored_format(store: LargeObjectStore, key: str) -> int:
    """The format a backend recorded for ``key``, read from its own representation."""
    if store.backend == "file":
        magic = store.path_of(key).read_bytes()[:8]  # type: ignore[attr-defined]
        assert magic[:7] == b"NBOSOBJ", magic
        return int(magic[7:8])
    if store.backend == "redis":
        manifest = store._client.hgetall(store.manifest_key(key))  # type: ignore[attr-defined]
        return int(manifest[b"v"])
    s3 = store._client  # type: ignore[attr-defined]
    body = s3.get_object(Bucket=store.bucket, Key=store.object_key(key))["Body"].read()  # type: ignore[attr-defined]
    magic = body[-64:-56]
    assert magic[:7] == b"NBOSTRL", magic
    return int(magic[7:8])


def set_stored_format(store: LargeObjectStore, key: str, fmt: int) -> None:
    if store.backend == "file":
        with open(store.path_of(key), "r+b") as f:  # type: ignore[attr-defined]
            f.seek(7)
            f.write(str(fmt).encode())
    elif store.backend == "redis":
        store._client.hset(store.manifest_key(key), "v", fmt)  # type: ignore[attr-defined]
    else:
        s3 = store._client  # type: ignore[attr-defined]
        object_key = store.object_key(key)  # type: ignore[attr-defined]
        body = bytearray(s3.get_object(Bucket=store.bucket, Key=object_key)["Body"].read())  # type: ignore[attr-defined]
        body[-57:-56] = str(fmt).encode()
        s3.put_object(Bucket=store.bucket, Key=object_key, Body=bytes(body))  # type: ignore[attr-defined]


# -- tampering with each backend's representation ------------------------------------------------
def flip_byte(store: LargeObjectStore, key: str, offset: int) -> None:
    if store.backend == "file":
        path = store.path_of(key)  # type: ignore[attr-defined]
        with open(path, "r+b") as f:
            f.seek(64 + offset)
            byte = f.read(1)
            f.seek(64 + offset)
            f.write(bytes([byte[0] ^ 1]))
    elif store.backend == "redis":
        client = store._client  # type: ignore[attr-defined]
        manifest = client.hgetall(store.manifest_key(key))  # type: ignore[attr-defined]
        size = int(manifest[b"chunk_size"])
        chunk_key = store.chunk_key(manifest[b"gen"].decode(), offset // size)  # type: ignore[attr-defined]
        chunk = bytearray(client.get(chunk_key))
        chunk[offset % size] ^= 1
        client.set(chunk_key, bytes(chunk))
    else:
        s3 = store._client  # type: ignore[attr-defined]
        object_key = store.object_key(key)  # type: ignore[attr-defined]
        body = bytearray(s3.get_object(Bucket=store.bucket, Key=object_key)["Body"].read())  # type: ignore[attr-defined]
        body[offset] ^= 1
        s3.put_object(Bucket=store.bucket, Key=object_key, Body=bytes(body))  # type: ignore[attr-defined]


def truncate(store: LargeObjectStore, key: str) -> None:
    if store.backend == "file":
        path = store.path_of(key)  # type: ignore[attr-defined]
        os.truncate(path, path.stat().st_size - 1000)
    elif store.backend == "redis":
        client = store._client  # type: ignore[attr-defined]
        manifest = client.hgetall(store.manifest_key(key))  # type: ignore[attr-defined]
        last = int(manifest[b"chunks"]) - 1
        client.delete(store.chunk_key(manifest[b"gen"].decode(), last))  # type: ignore[attr-defined]
    else:
        s3 = store._client  # type: ignore[attr-defined]
        object_key = store.object_key(key)  # type: ignore[attr-defined]
        body = s3.get_object(Bucket=store.bucket, Key=object_key)["Body"].read()  # type: ignore[attr-defined]
        s3.put_object(Bucket=store.bucket, Key=object_key, Body=body[:-1000] + body[-64:])  # type: ignore[attr-defined]


def tamper_copy(store: LargeObjectStore, source: str, target: str) -> None:
    if store.backend == "file":
        target_path = store.path_of(target)  # type: ignore[attr-defined]
        target_path.write_bytes(store.path_of(source).read_bytes())  # type: ignore[attr-defined]
    elif store.backend == "redis":
        client = store._client  # type: ignore[attr-defined]
        manifest = client.hgetall(store.manifest_key(source))  # type: ignore[attr-defined]
        client.hset(store.manifest_key(target), mapping=manifest)  # type: ignore[attr-defined]
    else:
        s3 = store._client  # type: ignore[attr-defined]
        body = s3.get_object(Bucket=store.bucket, Key=store.object_key(source))["Body"].read()  # type: ignore[attr-defined]
        s3.put_object(Bucket=store.bucket, Key=store.object_key(target), Body=body)  # type: ignore[attr-defined]


# -- the largest values --------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_round_trip_one_gib(store: LargeObjectStore) -> None:
    size = 1 << 30
    block = payload(BLOCK_SIZE, seed=9)
    expected = hashlib.sha256()

    def source() -> Iterator[bytes]:  # 1 GiB without holding it twice: 128 distinct blocks
        for i in range(size // BLOCK_SIZE):
            piece = i.to_bytes(8, "big") + block[8:]
            expected.update(piece)
            yield piece

    store.put("k/objects/gib", source())
    streamed = hashlib.sha256()
    total = 0
    for chunk in store.get_stream("k/objects/gib"):
        streamed.update(chunk)
        total += len(chunk)
    assert total == size and streamed.digest() == expected.digest()
    value = store.get("k/objects/gib")
    assert len(value) == size and hashlib.sha256(value).digest() == expected.digest()
    del value
    store.delete("k/objects/gib")
    assert not store.exists("k/objects/gib")


def test_hashing_works_in_a_forked_child(tmp_path) -> None:
    """The MAC's thread pool does not survive fork(); a child must get a fresh one, not hang."""
    store = open_store(f"file://{tmp_path}", HMAC_KEY)
    data = payload(4 * BLOCK_SIZE, seed=7)
    store.put("k/v", data)
    assert store.get("k/v") == data  # starts the hashing threads in the parent
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        ok = open_store(f"file://{tmp_path}", HMAC_KEY).get("k/v") == data
        os._exit(0 if ok else 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("store.get hung in a forked child")


@pytest.mark.parametrize("backend", ["redis", "s3"])
def test_a_lazy_store_makes_its_client_on_first_use(backend, request, tmp_path) -> None:
    from notebookos.store.url import LazyStore

    store = open_store(_url(backend, request, tmp_path), HMAC_KEY, lazy=True)
    try:
        assert isinstance(store, LazyStore) and not store.opened
        assert store.backend == backend
        store.put("lazy/v", b"value")
        assert store.opened and store.get("lazy/v") == b"value"
        assert store.exists("lazy/v")
        store.delete("lazy/v")
        with pytest.raises(KeyError, match=f"{backend} store, key 'lazy/v'"):
            store.get("lazy/v")
    finally:
        store.close()


def test_a_lazy_store_checks_its_url_and_key_at_once(tmp_path) -> None:
    with pytest.raises(ValueError, match="s3://bucket/prefix"):
        open_store("s3:///prefix", HMAC_KEY, lazy=True)
    with pytest.raises(ValueError, match="chunk_size"):
        open_store("redis://127.0.0.1:6379/0?chunk_size=lots", HMAC_KEY, lazy=True)
    with pytest.raises(ValueError, match="hmac_key"):
        open_store("s3://bucket/p", b"", lazy=True)
    assert open_store(f"file://{tmp_path}/s", HMAC_KEY, lazy=True).backend == "file"


def test_a_lazy_store_leaves_its_client_library_unimported(tmp_path) -> None:
    import subprocess
    import sys

    code = ("import sys; from notebookos.store import open_store;"
            "a = open_store('s3://bucket/p?endpoint_url=http://127.0.0.1:1', b'k', lazy=True);"
            "b = open_store('redis://127.0.0.1:1/0', b'k', lazy=True);"
            "print(sorted(m for m in ('boto3', 'botocore', 'redis') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout
    assert out.strip() == "[]", out


def test_the_lazy_store_forwards_every_operation_of_the_interface() -> None:
    """A LazyStore (what a replica opens) inheriting an operation would run the interface's
    generic version instead of the backend's own (get_into did: a copy of every large object)."""
    from notebookos.store.base import LargeObjectStore
    from notebookos.store.url import LazyStore

    public = {name for name, value in vars(LargeObjectStore).items()
              if callable(value) and not name.startswith("_")}
    assert public - set(vars(LazyStore)) == set()
