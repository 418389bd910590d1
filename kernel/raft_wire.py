"""pysyncobj's wire encoding without zlib for the small messages a cell sends.

pysyncobj's connection sends every message as ``zlib.compress(pickle.dumps(message), 3)`` and
reads it back with ``zlib.decompress``. A cell's Raft messages are small (an AppendEntries with
one LEAD or Completion record is ~300 bytes pickled, its answer ~90, and zlib makes neither
smaller), but each compression sets up a deflate state of ~256 KiB and each decompression an
inflate state: on the 2-core VM that was a quarter of the Raft CPU of a trivial cell, three
replicas together (issue 36; ``docs/performance.md``).

``install()`` hands pysyncobj's connection module a codec in place of ``zlib``: a pickle under
``RAW_UP_TO`` bytes goes on the wire as it is; a larger one (a Completion carrying a big state
update, a snapshot's part) is compressed as before. The reader tells the two apart by the first
byte: pysyncobj pickles with protocol 2, whose output starts with 0x80 (PROTO), and a zlib stream
starts with its CMF byte, whose low nibble is the method (8, deflate): never 0x80. So a reader
takes both; a replica with the code before this (which always compresses) reads only zlib, and a
kernel's replicas are one NotebookOS version (as for the cipher, ``raft_crypto.py``).

What arrives is authenticated first (``raft_crypto.py``): the codec sees only bytes a member of
the group sealed.
"""

from __future__ import annotations

import zlib

RAW_UP_TO = 16 * 1024  # pickles this large or larger are compressed, as pysyncobj does
_PROTO = b"\x80"  # the first byte of a pickle of protocol >= 2 (pysyncobj's is 2)


class WireCodec:
    """The two functions pysyncobj's ``tcp_connection`` calls on ``zlib``."""

    @staticmethod
    def compress(data: bytes, level: int = -1) -> bytes:
        if len(data) < RAW_UP_TO and data[:1] == _PROTO:
            return data
        return zlib.compress(data, level)

    @staticmethod
    def decompress(data: bytes) -> bytes:
        if data[:1] == _PROTO:
            return data
        return zlib.decompress(data)


def install() -> bool:
    """Give pysyncobj's connections ``WireCodec`` (idempotent). False, and pysyncobj's own
    encoding kept, where its connection module does not call ``zlib`` by that name."""
    try:
        from pysyncobj import tcp_connection
    except ImportError:
        return False
    current = getattr(tcp_connection, "zlib", None)
    if current is WireCodec:
        return True
    if current is not zlib:
        return False
    tcp_connection.zlib = WireCodec
    return True
