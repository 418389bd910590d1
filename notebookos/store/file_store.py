"""The embedded default backend: one file per value under a root directory.

Layout: key ``a/b/c`` lives in ``<root>/a.d/b.d/c.v``. Directory segments end in ``.d`` and value
files in ``.v`` so that keys ``a`` and ``a/b`` never collide; temporary files end in ``.tmp``.
A value file is a 64-byte header (magic, length, MAC) followed by the value's bytes.

A put writes a temporary file in the same directory and renames it over the target with
``os.replace``, so a reader opens the old file or the complete new one, never a partial one.
With ``fsync=True`` the file (and its directory) are flushed to disk before the rename, which makes
the new value survive a power loss as well as a crashed process.

A ``put_fenced`` writes its fence into the header's last 16 bytes (zero: fence (0, 0)) and renames
its temporary file only while it holds an exclusive ``flock`` on ``<name>.v.lock``, after reading
the stored header's fence: compare and rename are one step for every fenced writer. The lock is
held for a 64-byte read and a rename, and the kernel drops it when its holder dies; a holder frozen
inside that window (SIGSTOP) makes the others wait, at most ``LOCK_TIMEOUT_S``, then fail.
``flock`` needs a local file system (or one that forwards it, as NFSv4 does).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

from notebookos.store.base import (
    CHUNK_SIZE,
    AuthenticatedStore,
    Buffer,
    Fence,
    KeyNotFound,
    Value,
    allocated,
    check_fence,
    iter_value,
    validate_key,
)
from notebookos.store.integrity import BLOCK_SIZE, MAC_SIZE, block_digest_later

MAGIC_STEM = b"NBOSOBJ"  # + the value's format digit: the header names the format
HEADER = struct.Struct(f">8sQ{MAC_SIZE}s16x")  # magic, length, mac, reserved: 64 bytes
FENCE = struct.Struct(">QQ")  # a put_fenced's fence, in the header's reserved bytes
FENCE_OFFSET = HEADER.size - FENCE.size
LOCK_TIMEOUT_S = 30.0
WRITE_PIECE = BLOCK_SIZE  # small enough that the MAC thread reads it while still in cache


class FileStore(AuthenticatedStore):
    backend = "file"

    def __init__(self, root: str | os.PathLike[str], hmac_key: bytes, fsync: bool = False) -> None:
        super().__init__(hmac_key)
        self.root = Path(root)
        self.fsync = fsync
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(
                f"file store root {str(self.root)!r} cannot be created: {exc}"
            ) from exc

    def path_of(self, key: str) -> Path:
        *dirs, name = validate_key(key).split("/")
        return self.root.joinpath(*(d + ".d" for d in dirs), name + ".v")

    def put(self, key: str, value: Value) -> None:
        path = self.path_of(key)
        tmp = self._write_temporary(key, path, value, (0, 0))
        self._publish(key, path, tmp)

    def put_fenced(self, key: str, value: Value, fence: Fence) -> Fence | None:
        fence = check_fence(fence)
        path = self.path_of(key)
        tmp = self._write_temporary(key, path, value, fence)
        try:
            with self._locked(key, path):
                stored = self._stored_fence(path)
                if stored is not None and stored > fence:
                    _unlink_quietly(tmp)
                    return stored
                self._publish(key, path, tmp)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        return None

    def fence_of(self, key: str) -> Fence | None:
        return self._stored_fence(self.path_of(key))

    @staticmethod
    def _stored_fence(path: Path) -> Fence | None:
        try:
            with open(path, "rb", buffering=0) as handle:
                header = handle.read(HEADER.size)
        except FileNotFoundError:
            return None
        if len(header) < HEADER.size:
            return (0, 0)  # truncated: any fenced value may replace it
        epoch, count = FENCE.unpack_from(header, FENCE_OFFSET)
        return epoch, count

    @contextlib.contextmanager
    def _locked(self, key: str, path: Path) -> Iterator[None]:
        fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + LOCK_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise self._error(
                            key, f"another writer held the value's lock for {LOCK_TIMEOUT_S:g} s "
                            "(frozen?); nothing was stored") from None
                    time.sleep(0.005)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _publish(self, key: str, path: Path, tmp: Path) -> None:
        try:
            os.replace(tmp, path)
            if self.fsync:
                _fsync_dir(path.parent)
        except BaseException as exc:
            _unlink_quietly(tmp)
            if isinstance(exc, Exception):
                raise self._error(key, f"write failed, nothing was stored: {exc!r}") from exc
            raise

    def _write_temporary(self, key: str, path: Path, value: Value, fence: Fence) -> Path:
        """The value in a temporary file beside ``path``, header and all, flushed if asked."""
        tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")
        mac = self._writer_mac(key, value)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb", buffering=0) as out:
                out.write(bytes(HEADER.size))
                for piece in iter_value(value, WRITE_PIECE):
                    mac.update(piece)
                    _write_all(out, piece)
                out.seek(0)
                header = bytearray(HEADER.pack(self._magic(MAGIC_STEM, mac.format), mac.length,
                                               mac.digest()))
                FENCE.pack_into(header, FENCE_OFFSET, *fence)
                _write_all(out, header)
                if self.fsync:
                    os.fsync(out.fileno())
        except TypeError:
            mac.close()
            _unlink_quietly(tmp)
            raise
        except BaseException as exc:
            mac.close()
            _unlink_quietly(tmp)
            if isinstance(exc, Exception):
                raise self._error(key, f"write failed, nothing was stored: {exc!r}") from exc
            raise
        return tmp

    def _open(self, key: str) -> tuple[io.FileIO, int, int, bytes]:
        """The open file past its header, the value's format, length and MAC."""
        path = self.path_of(key)
        try:
            handle = open(path, "rb", buffering=0)  # noqa: SIM115 - returned to the caller
        except FileNotFoundError:
            raise KeyNotFound(self.backend, key) from None
        except OSError as exc:
            raise self._error(key, f"cannot open {str(path)!r}: {exc}") from exc
        try:
            header = handle.read(HEADER.size)
            if len(header) < HEADER.size:
                raise self._integrity_error(key, "file is shorter than its header (truncated)")
            magic, length, mac = HEADER.unpack(header)
            fmt = self._format_of_magic(key, magic, MAGIC_STEM, "file")
            size = os.fstat(handle.fileno()).st_size - HEADER.size
            if size != length:
                raise self._integrity_error(
                    key, f"file holds {size} value bytes but its header says {length} (truncated?)"
                )
        except BaseException:
            handle.close()
            raise
        return handle, fmt, length, mac

    def get(self, key: str) -> bytes:
        handle, fmt, length, expected = self._open(key)
        with handle:
            data = handle.read(length)
        if len(data) != length:
            raise self._integrity_error(key, "file shrank while reading")
        mac = self._new_mac(key, fmt)
        mac.update(data)
        self._check_mac(key, mac, expected)
        return data

    def get_into(self, key: str, allocate: Callable[[int], Buffer]) -> Buffer:
        """Read the file straight into the caller's buffer, each ``BLOCK_SIZE`` block hashed on
        the hash threads as soon as it has landed: hashing overlaps the reading and the value is
        copied once, from the page cache (the default ``get_into`` read it into bytes, hashed
        it, then copied it: a wake's 100 MiB array twice in every replica)."""
        handle, fmt, length, expected = self._open(key)
        with handle:
            buffer, view = allocated(allocate, length)
            digests = _read_hashing_blocks(handle, view, fmt)
        if digests is None:
            raise self._integrity_error(key, "file shrank while reading")
        mac = self._new_mac(key, fmt)
        mac.add_block_digests(digests, length)
        self._check_mac(key, mac, expected)
        return buffer

    def get_stream(self, key: str) -> Iterator[bytes]:
        handle, fmt, length, expected = self._open(key)
        if length <= CHUNK_SIZE:
            handle.close()
            return iter((self.get(key),))

        def read_blocks() -> Iterator[bytes]:
            handle.seek(HEADER.size)
            remaining = length
            while remaining:
                block = handle.read(min(BLOCK_SIZE, remaining))
                if not block:
                    raise self._integrity_error(key, "file shrank while reading")
                remaining -= len(block)
                yield block

        try:
            blocks = self._verified_stream(key, fmt, expected, read_blocks)
        except BaseException:
            handle.close()
            raise
        return _closing(blocks, handle)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path_of(key).unlink()

    def exists(self, key: str) -> bool:
        return self.path_of(key).is_file()


def _read_hashing_blocks(handle: io.FileIO, view: memoryview, fmt: int) -> list[bytes] | None:
    """Fill ``view`` from ``handle``; the digest of each of its blocks (format ``fmt``), each
    hashed on the hash threads once read, or None when the file ended early."""
    pending: list[Future[bytes]] = []
    try:
        for start in range(0, len(view), BLOCK_SIZE):
            block = view[start:start + BLOCK_SIZE]
            if not _read_exactly(handle, block):
                return None
            pending.append(block_digest_later(block, fmt))
    finally:
        digests = [future.result() for future in pending]  # no hashing left over the buffer
    return digests


def _read_exactly(handle: io.FileIO, view: memoryview) -> bool:
    """Fill ``view`` from ``handle``; False when the file ends first."""
    position = 0
    while position < len(view):
        got = handle.readinto(view[position:])
        if not got:
            return False
        position += got
    return True


def _closing(blocks: Iterator[bytes], handle: io.FileIO) -> Iterator[bytes]:
    try:
        yield from blocks
    finally:
        handle.close()


def _write_all(out: io.FileIO, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = out.write(view)
        view = view[written:]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
