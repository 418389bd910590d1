"""S3 backend (boto3): AWS S3, SeaweedFS, MinIO.

Layout: key ``k`` is the object ``<prefix>/k`` in the bucket. The object's body is the value
followed by a 64-byte trailer (magic ``NBOSTRL2``, or ``NBOSTRL1`` for a value of format 1, see
``integrity``; the value's length; its MAC). A trailer rather than object metadata lets a streamed
put of unknown length write its MAC at the end.

Atomicity: a value of at most ``part_size`` bytes is one ``put_object``; a larger one is a multipart
upload whose parts go up in parallel (``threads``) and which becomes visible only when
``complete_multipart_upload`` succeeds. Any failure aborts the upload, so nothing partial is ever
readable under the key. Reads fetch parts in parallel with ranged GETs pinned to the first
response's ETag (``If-Match``), so a value replaced mid-read is noticed instead of mixed.

Fences (``put_fenced``): the fence rides in the object's metadata (``x-amz-meta-nbos-fence``:
"epoch count"; absent: (0, 0)). The put reads the stored object's fence and ETag (HEAD), and
publishes only if the stored fence is not higher, conditionally: ``put_object`` (or
``complete_multipart_upload``) with ``If-Match`` that ETag, or ``If-None-Match: *`` where there was
no object. A write landing between the HEAD and the publish fails the condition (412) and the
compare is done again. AWS S3 honours both conditions (since 2024) and so does SeaweedFS (4.48;
tests/test_store.py checks it against the real server); a server that ignored them would leave a
window of one HEAD's round trip in which a newer value could still be replaced.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import struct
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import boto3
import botocore.exceptions
from botocore.config import Config

from notebookos.store.base import (
    CHUNK_SIZE,
    AuthenticatedStore,
    Buffer,
    Fence,
    KeyNotFound,
    StoreError,
    Value,
    allocated,
    check_fence,
    iter_value,
    validate_key,
)
from notebookos.store.integrity import (
    BLOCK_SIZE,
    MAC_SIZE,
    block_digest_later,
    block_digests,
    blocks_of,
)

MAGIC_STEM = b"NBOSTRL"  # + the value's format digit: the trailer names the format
TRAILER = struct.Struct(f">8sQ{MAC_SIZE}s16x")  # magic, length, mac, reserved: 64 bytes
DEFAULT_PART_SIZE = 2 * BLOCK_SIZE
_MISSING = {"NoSuchKey", "404", "NotFound"}
_CONDITION_FAILED = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
FENCE_META = "nbos-fence"
FENCE_ATTEMPTS = 20  # compare-and-publish rounds before a fenced put gives up (writers racing)


class _ViewReader(io.RawIOBase):
    """A read-only, seekable file over a memoryview, so boto3 can send a slice without a copy."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        size = min(len(buffer), len(self._view) - self._pos)
        buffer[:size] = self._view[self._pos : self._pos + size]
        self._pos += size
        return size

    def read(self, size: int = -1) -> bytes:
        end = (
            len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        )
        data = bytes(self._view[self._pos : end])
        self._pos = end
        return data

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, min(len(self._view), base + offset))
        return self._pos

    def tell(self) -> int:
        return self._pos

    def __len__(self) -> int:
        return len(self._view)


class S3Store(AuthenticatedStore):
    backend = "s3"

    def __init__(
        self,
        bucket: str,
        prefix: str,
        hmac_key: bytes,
        endpoint_url: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        region: str | None = None,
        part_size: int = DEFAULT_PART_SIZE,
        threads: int = 8,
    ) -> None:
        super().__init__(hmac_key)
        if part_size < 5 * 1024 * 1024 or part_size % BLOCK_SIZE:
            raise ValueError(
                f"S3 part_size must be a multiple of {BLOCK_SIZE} bytes (and at least 5 MiB)"
            )
        if not 1 <= threads <= 64:
            raise ValueError("S3 threads must be between 1 and 64")
        if (access_key is None) != (secret_key is None):
            raise ValueError("give both access_key and secret_key in the S3 URL, or neither")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.part_size = part_size
        self.threads = threads
        self.endpoint_url = endpoint_url
        s3_options: dict[str, Any] = {"payload_signing_enabled": False}
        if endpoint_url:
            s3_options["addressing_style"] = "path"
        config = Config(
            max_pool_connections=threads + 2,
            retries={"max_attempts": 3, "mode": "standard"},
            connect_timeout=5,
            read_timeout=120,
            s3=s3_options,
            # Our HMAC covers every byte end to end; S3's own checksums would hash it again.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        session = boto3.session.Session()
        self._client = session.client(
            "s3",
            endpoint_url=endpoint_url,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            region_name=region or session.region_name or "us-east-1",
            config=config,
        )
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="nbos-s3")

    def object_key(self, key: str) -> str:
        key = validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _where(self) -> str:
        return f"s3://{self.bucket}/{self.prefix} at {self.endpoint_url or 'AWS'}"

    def _failure(self, key: str, action: str, exc: BaseException) -> StoreError:
        code = _error_code(exc)
        if code == "NoSuchBucket":
            return self._error(
                key, f"{action}: bucket {self.bucket!r} does not exist ({self._where()})"
            )
        return self._error(key, f"{action} on {self._where()} failed: {exc!r}")

    # -- writes ---------------------------------------------------------------------------
    def put(self, key: str, value: Value) -> None:
        self._put(key, value, None)

    def put_fenced(self, key: str, value: Value, fence: Fence) -> Fence | None:
        return self._put(key, value, check_fence(fence))

    def fence_of(self, key: str) -> Fence | None:
        return self._stored_fence(key, self.object_key(key))[0]

    def _stored_fence(self, key: str, object_key: str) -> tuple[Fence | None, str | None]:
        """The stored object's fence and ETag; (None, None) when there is none."""
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=object_key)
        except Exception as exc:
            if _error_code(exc) in _MISSING:
                return None, None
            raise self._failure(key, "head", exc) from exc
        text = (head.get("Metadata") or {}).get(FENCE_META, "")
        try:
            epoch, count = (int(part) for part in text.split())
        except ValueError:
            epoch, count = 0, 0  # stored by put (or unreadable): the lowest fence
        return (epoch, count), head["ETag"]

    def _publish_fenced(self, key: str, object_key: str, fence: Fence,
                        publish: Callable[[dict[str, str]], Any]) -> Fence | None:
        """Call ``publish(condition)`` unless the stored fence is higher (then return it);
        ``condition`` makes the server refuse it if the object changed since it was compared."""
        for _attempt in range(FENCE_ATTEMPTS):
            stored, etag = self._stored_fence(key, object_key)
            if stored is not None and stored > fence:
                return stored
            try:
                publish({"IfMatch": etag} if etag else {"IfNoneMatch": "*"})
                return None
            except Exception as exc:
                if _error_code(exc) not in _CONDITION_FAILED:
                    raise
        raise self._error(key, f"the value kept changing during {FENCE_ATTEMPTS} fenced "
                          "publish attempts; nothing was stored")

    def _put(self, key: str, value: Value, fence: Fence | None) -> Fence | None:
        object_key = self.object_key(key)
        extra = {} if fence is None else {"Metadata": {FENCE_META: f"{fence[0]} {fence[1]}"}}
        parts = blocks_of(iter_value(value, self.part_size), self.part_size)
        mac = self._new_mac(key, self.write_format)
        try:
            first = next(parts, b"")
            second = next(parts, None)
        except TypeError:
            raise
        except Exception as exc:
            raise self._error(
                key, f"reading the value failed, nothing was stored: {exc!r}"
            ) from exc
        if second is None:  # small: one atomic put_object
            mac.update(first)
            body = bytes(first) + self._trailer(mac)

            def publish(condition: dict[str, str]) -> None:
                self._client.put_object(Bucket=self.bucket, Key=object_key, Body=body,
                                        **extra, **condition)
            try:
                if fence is None:
                    publish({})
                    return None
                return self._publish_fenced(key, object_key, fence, publish)
            except StoreError:
                raise
            except Exception as exc:
                raise self._failure(key, "put (nothing was stored)", exc) from exc
        return self._put_multipart(key, object_key, mac, _chain(first, second, parts), fence,
                                   extra)

    def _put_multipart(self, key: str, object_key: str, mac: Any, parts: Iterator[Any],
                       fence: Fence | None, extra: dict[str, Any]) -> Fence | None:
        try:
            upload_id = self._client.create_multipart_upload(
                Bucket=self.bucket, Key=object_key, **extra)["UploadId"]
        except Exception as exc:
            raise self._failure(key, "put (nothing was stored)", exc) from exc
        in_flight: deque[Future] = deque()
        done: list[dict[str, Any]] = []
        try:
            number = 0
            pending = next(parts, None)
            while pending is not None:
                following = next(parts, None)
                number += 1
                if following is None:
                    # The last part carries the trailer, whose MAC needs every earlier part's
                    # digests first: settle them, then send it.
                    while in_flight:
                        done.append(self._settle(in_flight.popleft(), mac))
                    mac.add_block_digests(block_digests(pending, mac.format), len(pending))
                    last = bytes(pending) + self._trailer(mac)
                    part, _, _ = self._upload_part(object_key, upload_id, number, last, None)
                    done.append(part)
                else:
                    in_flight.append(
                        self._pool.submit(
                            self._upload_part, object_key, upload_id, number, pending, mac.format
                        )
                    )
                    while len(in_flight) > self.threads:
                        done.append(self._settle(in_flight.popleft(), mac))
                pending = following
            def complete(condition: dict[str, str]) -> None:
                self._client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=object_key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": sorted(done, key=lambda part: part["PartNumber"])},
                    **condition,
                )
            if fence is None:
                complete({})
                return None
            refused = self._publish_fenced(key, object_key, fence, complete)
            if refused is not None:
                with contextlib.suppress(Exception):
                    self._client.abort_multipart_upload(
                        Bucket=self.bucket, Key=object_key, UploadId=upload_id)
            return refused
        except BaseException as exc:
            for future in in_flight:
                future.cancel()
            with contextlib.suppress(Exception):
                self._client.abort_multipart_upload(
                    Bucket=self.bucket, Key=object_key, UploadId=upload_id
                )
            if isinstance(exc, TypeError | KeyboardInterrupt):
                raise
            if isinstance(exc, Exception):
                raise self._failure(
                    key, "multipart put (aborted, nothing was stored)", exc
                ) from exc
            raise

    def _upload_part(
        self, object_key: str, upload_id: str, number: int, piece: Any, fmt: int | None
    ) -> tuple[dict[str, Any], list[bytes] | None, int]:
        """Send one part; hash its blocks first as format ``fmt`` does (None: not hashed)."""
        digests = block_digests(piece, fmt) if fmt is not None else None
        body = piece if isinstance(piece, bytes | bytearray) else _ViewReader(memoryview(piece))
        response = self._client.upload_part(
            Bucket=self.bucket, Key=object_key, UploadId=upload_id, PartNumber=number, Body=body
        )
        return {"PartNumber": number, "ETag": response["ETag"]}, digests, len(piece)

    @staticmethod
    def _settle(future: Future, mac: Any) -> dict[str, Any]:
        part, digests, size = future.result()
        if digests is not None:
            mac.add_block_digests(digests, size)
        return part

    # -- reads ----------------------------------------------------------------------------
    def exists(self, key: str) -> bool:
        object_key = self.object_key(key)
        try:
            self._client.head_object(Bucket=self.bucket, Key=object_key)
            return True
        except Exception as exc:
            if _error_code(exc) in _MISSING:
                return False
            raise self._failure(key, "exists", exc) from exc

    def delete(self, key: str) -> None:
        object_key = self.object_key(key)
        try:
            self._client.delete_object(Bucket=self.bucket, Key=object_key)
        except Exception as exc:
            if _error_code(exc) in _MISSING:
                return
            raise self._failure(key, "delete", exc) from exc

    def _ranged(self, key: str, object_key: str, start: int, end: int, etag: str | None) -> dict:
        extra = {"IfMatch": etag} if etag else {}
        try:
            return self._client.get_object(
                Bucket=self.bucket, Key=object_key, Range=f"bytes={start}-{end - 1}", **extra
            )
        except Exception as exc:
            code = _error_code(exc)
            if code in _MISSING:
                raise KeyNotFound(self.backend, key) from None
            if code in ("PreconditionFailed", "412"):
                raise _Replaced() from None
            raise self._failure(key, "get", exc) from exc

    def _read_range(self, key: str, object_key: str, start: int, end: int, etag: str) -> bytes:
        response = self._ranged(key, object_key, start, end, etag)
        try:
            data = response["Body"].read()
        except Exception as exc:
            raise self._failure(key, "get", exc) from exc
        if len(data) != end - start:
            raise self._integrity_error(key, f"short read: {len(data)} of {end - start} bytes")
        return data

    def get(self, key: str) -> bytes:
        """One plain GET: on a busy host one stream beat parallel ranges; hashing is parallel."""
        return self.get_into(key, bytearray)

    def get_into(self, key: str, allocate: Callable[[int], Buffer]) -> Buffer:
        """One plain GET read straight into the caller's buffer, each ``BLOCK_SIZE`` block
        hashed on the hash threads as soon as it has landed: hashing overlaps the download and
        the value is never copied (``_into_buffer``). Blocks are hashed as ``write_format``
        hashes them; a value of another format (the trailer says) is hashed again whole."""
        object_key = self.object_key(key)
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=object_key)
        except Exception as exc:
            if _error_code(exc) in _MISSING:
                raise KeyNotFound(self.backend, key) from None
            raise self._failure(key, "get", exc) from exc
        total = int(response["ContentLength"])
        if total < TRAILER.size:
            raise self._integrity_error(key, "object is shorter than its trailer (truncated)")
        body = response["Body"]
        length = total - TRAILER.size
        try:
            buffer, view = allocated(allocate, length)
        except BaseException:
            body.close()
            raise
        try:
            digests, trailer = _into_buffer(body, view, TRAILER.size, self.write_format)
        except Exception as exc:
            raise self._failure(key, "get", exc) from exc
        finally:
            body.close()
        if digests is None or len(trailer) != TRAILER.size:
            raise self._integrity_error(key, "object ended early (truncated)")
        fmt, stated, expected = self._unpack_trailer(key, trailer)
        if stated != length:
            raise self._integrity_error(
                key, f"object holds {length} value bytes, trailer says {stated}"
            )
        if fmt != self.write_format:  # an older value: its blocks were hashed another way
            digests = block_digests(view, fmt)
        mac = self._new_mac(key, fmt)
        mac.add_block_digests(digests, length)
        self._check_mac(key, mac, expected)
        return buffer

    def get_stream(self, key: str) -> Iterator[bytes]:
        object_key = self.object_key(key)
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=object_key)
        except Exception as exc:
            if _error_code(exc) in _MISSING:
                raise KeyNotFound(self.backend, key) from None
            raise self._failure(key, "get", exc) from exc
        total, etag = int(head["ContentLength"]), head["ETag"]
        if total - TRAILER.size <= CHUNK_SIZE:
            return iter((self.get(key),))
        try:
            trailer = self._read_range(key, object_key, total - TRAILER.size, total, etag)
        except _Replaced:
            return iter((self.get(key),))  # replaced since the HEAD: read the new value whole
        fmt, length, expected = self._unpack_trailer(key, trailer)
        if length != total - TRAILER.size:
            raise self._integrity_error(
                key, f"object holds {total - TRAILER.size} value bytes, trailer says {length}"
            )

        def read_blocks() -> Iterator[bytes]:
            try:
                yield from self._prefetch(
                    lambda start: self._read_range(
                        key, object_key, start, min(start + BLOCK_SIZE, length), etag
                    ),
                    range(0, length, BLOCK_SIZE),
                )
            except _Replaced:
                raise self._error(
                    key, "the value was overwritten while it was being streamed"
                ) from None

        return self._verified_stream(key, fmt, expected, read_blocks)

    def _trailer(self, mac: Any) -> bytes:
        return TRAILER.pack(self._magic(MAGIC_STEM, mac.format), mac.length, mac.digest())

    def _unpack_trailer(self, key: str, trailer: bytes) -> tuple[int, int, bytes]:
        """(format, value length, MAC) of a trailer; an unknown magic is refused."""
        magic, length, expected = TRAILER.unpack(trailer)
        return self._format_of_magic(key, magic, MAGIC_STEM, "object"), length, expected

    def _prefetch(self, fetch: Callable[[int], bytes], starts: range) -> Iterator[bytes]:
        window: deque[Future] = deque()
        pending = iter(starts)
        try:
            for start in pending:
                window.append(self._pool.submit(fetch, start))
                if len(window) >= self.threads:
                    yield window.popleft().result()
            while window:
                yield window.popleft().result()
        finally:
            for future in window:
                future.cancel()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(Exception):
            self._client.close()


class _Replaced(Exception):
    """The object's ETag changed between two ranged GETs of one read."""


def _chain(first: Any, second: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield second
    yield from rest


def _into_buffer(body: Any, view: memoryview, trailer_size: int, fmt: int
                 ) -> tuple[list[bytes] | None, bytes]:
    """Read ``len(view)`` bytes of a GET's body into ``view``, then the trailer: the digest of
    each block of ``view`` as format ``fmt`` hashes blocks (None when the body ended early) and
    the trailer's bytes.

    Straight from the HTTP response into the buffer when botocore's body wraps urllib3's
    response around an http.client one, neither chunked nor content-encoded (what S3 and
    SeaweedFS send for GetObject); else through ``body.read``, one block at a time.
    """
    raw = getattr(body, "_raw_stream", None)
    fp = getattr(raw, "_fp", None)
    direct = (isinstance(fp, http.client.HTTPResponse) and not fp.chunked
              and raw.headers.get("content-encoding", "identity") == "identity"
              and getattr(raw, "_fp_bytes_read", None) == 0)
    pending = []
    position = 0
    trailer = bytearray(trailer_size)
    whole = memoryview(trailer)
    while position < len(view) + trailer_size:
        if position >= len(view):  # the trailer, after the value
            got = fp.readinto(whole[position - len(view):]) if direct else \
                _read_into(body, whole[position - len(view):])
            if not got:
                break
            position += got
            continue
        start, end = position, min(position + BLOCK_SIZE, len(view))
        while position < end:
            got = fp.readinto(view[position:end]) if direct else \
                _read_into(body, view[position:end])
            if not got:
                return None, b""
            position += got
        pending.append(block_digest_later(view[start:end], fmt))
    if direct:
        raw._fp_bytes_read += position  # what urllib3 would have counted
    return [future.result() for future in pending], bytes(whole[:position - len(view)])


def _read_into(body: Any, view: memoryview) -> int:
    data = body.read(len(view))
    view[:len(data)] = data
    return len(data)


def _error_code(exc: BaseException) -> str:
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def _total_size(response: dict, received: int) -> int:
    content_range = response.get("ContentRange") or ""
    if "/" in content_range:
        total = content_range.rsplit("/", 1)[1]
        if total.isdigit():
            return int(total)
    return received  # no Content-Range: the server sent the whole object
