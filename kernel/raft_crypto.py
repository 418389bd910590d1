"""Encryption and authentication of Raft traffic between a kernel's replicas (issue 36).

pysyncobj unpickles what it receives, so every Raft message must be authenticated (docs/security.md
also promises it is confidential). Each message is sealed with ChaCha20-Poly1305 (RFC 8439, an
AEAD) under a 256-bit key derived from the kernel's HMAC key (``raft_key``), with a random 96-bit
nonce per message; a token is::

    version (1 byte, 0x01) | timestamp (8 bytes, big-endian) | nonce (12) | ciphertext | tag (16)

and the version, timestamp and nonce are the AEAD's associated data, so none of them can be
changed without the tag failing. ``RaftCipher`` has the three methods of ``cryptography``'s
Fernet that pysyncobj's transport calls (``encrypt_at_time``, ``extract_timestamp``,
``decrypt``): pysyncobj still refuses a timestamp older than the last one on a connection, and
still exchanges per-connection random keys inside sealed messages.

The primitive comes from libsodium, a maintained library, through ``ctypes``: pyzmq's wheels ship
it (``pyzmq.libs``) and it is already mapped into every replica by libzmq, so it costs about
0.2 MB of a replica's memory, where ``cryptography`` (Fernet, the scheme before) cost 9 MB of
each replica's RSS (its Rust extension). Where no libsodium is found, the same AEAD (same tokens,
so replicas of either kind talk to each other) comes from ``cryptography``'s ``ChaCha20Poly1305``.

``keep_pysyncobj_off_cryptography`` stands in for ``pysyncobj.encryptor``: that module imports
``cryptography`` whenever it is installed, only to derive a Fernet from a ``password`` that
NotebookOS never sets (its SyncObj is handed a ``RaftCipher``). The stand-in says there is no
crypto, so a ``password`` set by mistake fails loudly instead of being silently used.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import struct
import sys
import threading
import types
from typing import Any

VERSION = b"\x01"
NONCE_BYTES = 12
TAG_BYTES = 16
KEY_BYTES = 32
_HEADER = struct.Struct(">cQ12s")  # version, timestamp, nonce
_KEY_LABEL = b"notebookos-raft-chacha20poly1305\0"


class InvalidToken(Exception):  # noqa: N818 - Fernet's name, which pysyncobj's callers expect
    """A token that is malformed, of another version, or whose tag does not verify."""


def raft_key(kernel_key: bytes | str) -> bytes:
    """The 256-bit key of Raft traffic, derived from the kernel key (never the key itself)."""
    if isinstance(kernel_key, str):
        kernel_key = kernel_key.encode()
    return hashlib.sha256(_KEY_LABEL + kernel_key).digest()


# ---- the AEAD --------------------------------------------------------------------------------

def _libsodium_paths() -> list[str]:
    paths = []
    zmq = sys.modules.get("zmq")
    if zmq is None:
        try:
            import zmq
        except ImportError:
            zmq = None
    if zmq is not None and getattr(zmq, "__file__", None):
        libs = os.path.join(os.path.dirname(os.path.dirname(zmq.__file__)), "pyzmq.libs")
        paths += sorted(glob.glob(os.path.join(libs, "libsodium*.so*")))
    paths += ["libsodium.so.26", "libsodium.so.23", "libsodium.so"]
    return paths


class _Sodium:
    """libsodium's IETF ChaCha20-Poly1305."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        ull, buf, p_ull = ctypes.c_ulonglong, ctypes.c_char_p, ctypes.POINTER(ctypes.c_ulonglong)
        self._enc = lib.crypto_aead_chacha20poly1305_ietf_encrypt
        self._enc.argtypes = [ctypes.c_void_p, p_ull, buf, ull, buf, ull, ctypes.c_void_p, buf,
                              buf]
        self._enc.restype = ctypes.c_int
        self._dec = lib.crypto_aead_chacha20poly1305_ietf_decrypt
        self._dec.argtypes = [ctypes.c_void_p, p_ull, ctypes.c_void_p, buf, ull, buf, ull, buf,
                              buf]
        self._dec.restype = ctypes.c_int

    def seal(self, key: bytes, nonce: bytes, data: bytes, ad: bytes) -> bytes:
        out = ctypes.create_string_buffer(len(data) + TAG_BYTES)
        out_len = ctypes.c_ulonglong(0)
        if self._enc(out, ctypes.byref(out_len), data, len(data), ad, len(ad), None, nonce,
                     key) != 0:
            raise RuntimeError("libsodium refused to encrypt")
        return out.raw[:out_len.value]

    def open(self, key: bytes, nonce: bytes, sealed: bytes, ad: bytes) -> bytes:
        if len(sealed) < TAG_BYTES:
            raise InvalidToken("token too short")
        out = ctypes.create_string_buffer(max(len(sealed) - TAG_BYTES, 1))
        out_len = ctypes.c_ulonglong(0)
        if self._dec(out, ctypes.byref(out_len), None, sealed, len(sealed), ad, len(ad), nonce,
                     key) != 0:
            raise InvalidToken("the tag does not verify")
        return out.raw[:out_len.value]


class _Cryptography:
    """The same AEAD from ``cryptography`` (where libsodium is not found)."""

    def __init__(self) -> None:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

        self._aead, self._invalid = ChaCha20Poly1305, InvalidTag
        self._by_key: dict[bytes, Any] = {}

    def _for(self, key: bytes) -> Any:  # noqa: ANN401
        aead = self._by_key.get(key)
        if aead is None:
            aead = self._by_key[key] = self._aead(key)
        return aead

    def seal(self, key: bytes, nonce: bytes, data: bytes, ad: bytes) -> bytes:
        return self._for(key).encrypt(nonce, data, ad)

    def open(self, key: bytes, nonce: bytes, sealed: bytes, ad: bytes) -> bytes:
        try:
            return self._for(key).decrypt(nonce, sealed, ad)
        except self._invalid:
            raise InvalidToken("the tag does not verify") from None


class _Nonces:
    """Random 96-bit nonces from the operating system, drawn ``BLOCK`` at a time instead of a
    ``getrandom`` system call for each message sent (issue 36: one of the per-message system
    calls of the Raft tick threads). Each nonce is handed out once (under a lock); a forked
    child drops what its parent had drawn, so parent and child never use the same one."""

    BLOCK = 64

    def __init__(self) -> None:
        self._forget()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._pool = b""
        self._at = 0

    def next(self) -> bytes:
        with self._lock:
            at = self._at
            if at >= len(self._pool):
                self._pool, at = os.urandom(NONCE_BYTES * self.BLOCK), 0
            self._at = at + NONCE_BYTES
            return self._pool[at:at + NONCE_BYTES]


_NONCES = _Nonces()
_backend: _Sodium | _Cryptography | None = None
_backend_lock = threading.Lock()


def load_libsodium() -> _Sodium | None:
    for path in _libsodium_paths():
        try:
            lib = ctypes.CDLL(path)
            if lib.sodium_init() < 0:
                continue
            return _Sodium(lib)
        except (OSError, AttributeError):
            continue
    return None


def aead_backend() -> _Sodium | _Cryptography:
    """libsodium where found, else ``cryptography`` (loaded once, on first use)."""
    global _backend
    with _backend_lock:
        if _backend is None:
            force = os.environ.get("NOTEBOOKOS_RAFT_AEAD", "")  # "cryptography": tests
            _backend = (load_libsodium() if force != "cryptography" else None) or _Cryptography()
        return _backend


class RaftCipher:
    """The AEAD with the methods of Fernet that pysyncobj's transport calls."""

    def __init__(self, key: bytes, backend: _Sodium | _Cryptography | None = None) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError("a Raft key is 32 bytes (raft_key)")
        self._key = key
        self._backend = backend or aead_backend()
        # extract_timestamp verifies the token; the decrypt that follows it gets the result
        self._opened = threading.local()

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        header = _HEADER.pack(VERSION, current_time, _NONCES.next())
        return header + self._backend.seal(self._key, header[-NONCE_BYTES:], data, header)

    def encrypt(self, data: bytes) -> bytes:
        import time

        return self.encrypt_at_time(data, int(time.time()))

    def _open(self, token: bytes, keep: bool) -> tuple[int, bytes]:
        last = getattr(self._opened, "last", None)
        self._opened.last = None
        if last is not None and last[0] == token:  # the same bytes: the same plaintext
            if keep:
                self._opened.last = last
            return last[1], last[2]
        if not isinstance(token, bytes | bytearray) or len(token) < _HEADER.size + TAG_BYTES:
            raise InvalidToken("token too short")
        token = bytes(token)
        version, timestamp, nonce = _HEADER.unpack_from(token)
        if version != VERSION:
            raise InvalidToken("unknown token version")
        data = self._backend.open(self._key, nonce, token[_HEADER.size:], token[:_HEADER.size])
        if keep:
            self._opened.last = (token, timestamp, data)
        return timestamp, data

    def extract_timestamp(self, token: bytes) -> int:
        """The token's timestamp, once its tag is verified (as Fernet's does)."""
        return self._open(token, keep=True)[0]

    def decrypt(self, token: bytes, ttl: int | None = None) -> bytes:
        if ttl is not None:
            raise ValueError("RaftCipher has no ttl")
        return self._open(token, keep=False)[1]


# ---- pysyncobj without cryptography ------------------------------------------------------------

def _no_password_encryptor(password: Any) -> None:  # noqa: ANN401
    raise RuntimeError("NotebookOS hands pysyncobj a RaftCipher: SyncObjConf.password is unused")


def keep_pysyncobj_off_cryptography() -> None:
    """Stand in for ``pysyncobj.encryptor`` before pysyncobj is imported (see the module
    docstring); nothing happens if pysyncobj's own was imported already."""
    if "pysyncobj.encryptor" in sys.modules:
        return
    stub = types.ModuleType("pysyncobj.encryptor", "NotebookOS: no password-derived Fernet")
    stub.HAS_CRYPTO = False
    stub.getEncryptor = _no_password_encryptor
    sys.modules["pysyncobj.encryptor"] = stub
