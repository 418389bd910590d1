"""Redis backend: values cut into chunks, published by a manifest written last.

Layout (``P`` is the prefix, ``notebookos:store`` unless the URL says ``?prefix=``):

- ``P:m:<key>``: the manifest, a hash with fields ``v`` (the value's format, see ``integrity``:
  2 since BLAKE3, 1 before; the layout is the same), ``length``, ``chunk_size``, ``chunks``,
  ``gen`` (a random id of this write) and ``mac`` (hex HMAC).
- ``P:c:<gen>:<i>``: chunk ``i`` of write ``gen`` (``chunk_size`` bytes, the last may be shorter).

A put writes its chunks under a fresh ``gen`` with a TTL (``pending_ttl``), then one Lua script
checks that every chunk is there, removes their TTL, replaces the manifest and unlinks the chunks of
the previous value: all or nothing, since Redis runs a script atomically. A ``put_fenced`` keeps its
fence in the manifest (fields ``fe``, ``fc``; absent: (0, 0)) and the same script first compares it
with the stored one: a higher stored fence leaves the manifest alone and unlinks the new chunks. Readers start from the
manifest, so they only ever follow a complete value; if a writer dies mid-put its chunks expire on
their own. Chunks are never modified once written, only deleted. Values of any size work (a single
Redis string is limited to 512 MB; chunks are 8 MiB by default). Multi-key scripts need a single
Redis node, not Redis Cluster.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import redis

from notebookos.store.base import (
    CHUNK_SIZE,
    AuthenticatedStore,
    Fence,
    KeyNotFound,
    Value,
    check_fence,
    iter_value,
    validate_key,
)
from notebookos.store.integrity import BLOCK_SIZE, BackgroundMac, blocks_of, check_format

DEFAULT_CHUNK_SIZE = BLOCK_SIZE
MAX_CHUNK_SIZE = 512 * 1024 * 1024
DEFAULT_PREFIX = "notebookos:store"
PIPELINE_CHUNKS = 4

_PUBLISH = """
local chunk_base = ARGV[1]
local gen = ARGV[2]
local n = tonumber(ARGV[3])
for i = 0, n - 1 do
  if redis.call('EXISTS', chunk_base .. gen .. ':' .. i) == 0 then
    return redis.error_reply('chunk ' .. i .. ' of the new value is missing (expired?)')
  end
end
if ARGV[4] == '1' then
  local stored_e = tonumber(redis.call('HGET', KEYS[1], 'fe') or '0')
  local stored_c = tonumber(redis.call('HGET', KEYS[1], 'fc') or '0')
  local e, c = tonumber(ARGV[5]), tonumber(ARGV[6])
  if redis.call('EXISTS', KEYS[1]) == 1
      and (stored_e > e or (stored_e == e and stored_c > c)) then
    for i = 0, n - 1 do
      redis.call('UNLINK', chunk_base .. gen .. ':' .. i)
    end
    return {stored_e, stored_c}
  end
end
for i = 0, n - 1 do
  redis.call('PERSIST', chunk_base .. gen .. ':' .. i)
end
local old_gen = redis.call('HGET', KEYS[1], 'gen')
local old_n = tonumber(redis.call('HGET', KEYS[1], 'chunks') or '0')
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 7))
if old_gen and old_gen ~= gen then
  for i = 0, old_n - 1 do
    redis.call('UNLINK', chunk_base .. old_gen .. ':' .. i)
  end
end
return 1
"""

_DELETE = """
local chunk_base = ARGV[1]
local gen = redis.call('HGET', KEYS[1], 'gen')
local n = tonumber(redis.call('HGET', KEYS[1], 'chunks') or '0')
redis.call('DEL', KEYS[1])
if gen then
  for i = 0, n - 1 do
    redis.call('UNLINK', chunk_base .. gen .. ':' .. i)
  end
end
return 1
"""


class RedisStore(AuthenticatedStore):
    backend = "redis"

    def __init__(
        self,
        url: str,
        hmac_key: bytes,
        prefix: str = DEFAULT_PREFIX,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        pending_ttl: int = 6 * 3600,
        socket_timeout: float = 120.0,
    ) -> None:
        super().__init__(hmac_key)
        if not 0 < chunk_size <= MAX_CHUNK_SIZE:
            raise ValueError(f"Redis chunk_size must be between 1 and {MAX_CHUNK_SIZE} bytes")
        if not prefix or any(c.isspace() for c in prefix):
            raise ValueError(f"Redis key prefix {prefix!r} must be non-empty without spaces")
        self.url = url
        self.prefix = prefix
        self.chunk_size = chunk_size
        self.pending_ttl = pending_ttl
        self._client = redis.Redis.from_url(
            url, socket_connect_timeout=5.0, socket_timeout=socket_timeout
        )
        self._publish = self._client.register_script(_PUBLISH)
        self._delete = self._client.register_script(_DELETE)
        self._chunk_base = f"{prefix}:c:"

    # -- layout ---------------------------------------------------------------------------
    def manifest_key(self, key: str) -> str:
        return f"{self.prefix}:m:{validate_key(key)}"

    def chunk_key(self, gen: str, index: int) -> str:
        return f"{self._chunk_base}{gen}:{index}"

    # -- writes ---------------------------------------------------------------------------
    def put(self, key: str, value: Value) -> None:
        self._put(key, value, None)

    def put_fenced(self, key: str, value: Value, fence: Fence) -> Fence | None:
        return self._put(key, value, check_fence(fence))

    def fence_of(self, key: str) -> Fence | None:
        manifest_key = self.manifest_key(key)
        try:
            with self._client.pipeline(transaction=True) as batch:
                batch.exists(manifest_key)
                batch.hmget(manifest_key, ["fe", "fc"])
                present, (epoch, count) = batch.execute()
        except redis.RedisError as exc:
            raise self._error(key, f"read from {self._where()} failed: {exc!r}") from exc
        if not present:
            return None
        return int(epoch or 0), int(count or 0)

    def _put(self, key: str, value: Value, fence: Fence | None) -> Fence | None:
        manifest_key = self.manifest_key(key)
        pieces = iter_value(value, self.chunk_size)
        if not isinstance(value, bytes | bytearray | memoryview):
            pieces = blocks_of(pieces, self.chunk_size)
        gen = uuid.uuid4().hex
        mac = self._writer_mac(key, value)
        count = 0
        try:
            batch = self._client.pipeline(transaction=False)
            for piece in pieces:
                mac.update(piece)
                batch.set(self.chunk_key(gen, count), piece, ex=self.pending_ttl)
                count += 1
                if count % PIPELINE_CHUNKS == 0:  # a few chunks per round trip
                    batch.execute()
            fields = {
                "v": mac.format,
                "length": mac.length,
                "chunk_size": self.chunk_size,
                "chunks": count,
                "gen": gen,
                "mac": mac.digest().hex(),
            }
            if fence is not None:
                fields["fe"], fields["fc"] = fence
            args: list[object] = [self._chunk_base, gen, count,
                                  "0" if fence is None else "1", *(fence or (0, 0))]
            for name, field in fields.items():
                args += [name, field]
            # The publish rides in the same round trip as the last chunks; the script checks
            # that every chunk arrived, so a chunk lost on the way fails the whole put.
            batch.execute_command("EVALSHA", self._publish.sha, 1, manifest_key, *args)
            try:
                published = batch.execute()[-1]
            except redis.exceptions.NoScriptError:  # first use on this server: load, run
                published = self._publish(keys=[manifest_key], args=args)
        except TypeError:
            mac.close()
            self._discard(gen, count + 1)
            raise
        except Exception as exc:
            mac.close()
            cleaned = self._discard(gen, count + 1)
            leftover = (
                "" if cleaned else (f"; its partial chunks expire within {self.pending_ttl} s")
            )
            raise self._error(
                key, f"write to {self._where()} failed, nothing was stored{leftover}: {exc!r}"
            ) from exc
        if isinstance(published, list):  # refused: the stored fence is higher
            return int(published[0]), int(published[1])
        return None

    def _discard(self, gen: str, count: int) -> bool:
        """Best effort: drop the chunks of a failed write. False when the server is unreachable."""
        if count == 0:
            return True
        try:
            self._client.unlink(*(self.chunk_key(gen, i) for i in range(count)))
            return True
        except redis.RedisError:
            return False

    def delete(self, key: str) -> None:
        manifest_key = self.manifest_key(key)
        try:
            self._delete(keys=[manifest_key], args=[self._chunk_base])
        except redis.RedisError as exc:
            raise self._error(key, f"delete on {self._where()} failed: {exc!r}") from exc

    # -- reads ----------------------------------------------------------------------------
    def exists(self, key: str) -> bool:
        manifest_key = self.manifest_key(key)
        try:
            return bool(self._client.exists(manifest_key))
        except redis.RedisError as exc:
            raise self._error(key, f"exists on {self._where()} failed: {exc!r}") from exc

    def _manifest(self, key: str) -> dict[str, str]:
        try:
            raw = self._client.hgetall(self.manifest_key(key))
        except redis.RedisError as exc:
            raise self._error(key, f"read from {self._where()} failed: {exc!r}") from exc
        if not raw:
            raise KeyNotFound(self.backend, key)
        manifest = {k.decode(): v.decode() for k, v in raw.items()}
        try:
            check_format(int(manifest.get("v", "")))
        except ValueError as exc:
            raise self._integrity_error(
                key, f"manifest has an unknown format version {manifest.get('v')!r}: {exc}"
            ) from None
        try:
            int(manifest["length"]), int(manifest["chunks"]), int(manifest["chunk_size"])
            bytes.fromhex(manifest["mac"]), manifest["gen"]
        except (KeyError, ValueError) as exc:
            raise self._integrity_error(key, f"malformed manifest: {exc!r}") from None
        return manifest

    def _chunks(self, key: str, manifest: dict[str, str]) -> Iterator[bytes]:
        for index in range(int(manifest["chunks"])):
            try:
                chunk = self._client.get(self.chunk_key(manifest["gen"], index))
            except redis.RedisError as exc:
                raise self._error(key, f"read from {self._where()} failed: {exc!r}") from exc
            if chunk is None:
                raise _ChunkGone(index)
            yield chunk

    def _replaced(self, key: str, manifest: dict[str, str]) -> bool:
        try:
            return self._manifest(key)["gen"] != manifest["gen"]
        except KeyNotFound:
            return True

    def get(self, key: str) -> bytes:
        for _attempt in range(3):
            manifest = self._manifest(key)
            # Several chunks: hash each on a worker thread while the next one is fetched.
            mac = self._new_mac(key, int(manifest["v"]))
            if int(manifest["chunks"]) >= 2:
                mac = BackgroundMac(mac)
            chunks: list[bytes] = []
            try:
                for chunk in self._chunks(key, manifest):
                    mac.update(chunk)
                    chunks.append(chunk)
            except BaseException as exc:
                mac.close()
                if not isinstance(exc, _ChunkGone):
                    raise
                gone = exc
                if self._replaced(key, manifest):
                    continue  # overwritten or deleted while we read: start from the new manifest
                raise self._integrity_error(key, f"chunk {gone.index} is missing") from None
            if mac.length != int(manifest["length"]):
                raise self._integrity_error(
                    key, f"chunks hold {mac.length} bytes, manifest says {manifest['length']}"
                )
            self._check_mac(key, mac, bytes.fromhex(manifest["mac"]))
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        raise self._error(key, "value kept changing while being read (3 attempts)")

    def get_stream(self, key: str) -> Iterator[bytes]:
        manifest = self._manifest(key)
        if int(manifest["length"]) <= CHUNK_SIZE:
            return iter((self.get(key),))

        def read_blocks() -> Iterator[bytes]:
            try:
                chunks = self._chunks(key, manifest)
                if int(manifest["chunk_size"]) == BLOCK_SIZE:
                    yield from chunks
                else:
                    yield from (bytes(b) for b in blocks_of(chunks, BLOCK_SIZE))
            except _ChunkGone as gone:
                raise self._error(
                    key,
                    f"chunk {gone.index} vanished: the value was overwritten or deleted "
                    "while it was being streamed",
                ) from None

        return self._verified_stream(
            key, int(manifest["v"]), bytes.fromhex(manifest["mac"]), read_blocks
        )

    def _where(self) -> str:
        pool = self._client.connection_pool.connection_kwargs
        return f"redis at {pool.get('host', '?')}:{pool.get('port', '?')}"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._client.close()


class _ChunkGone(Exception):
    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index
