"""Give the C heap's free pages back to the system when a replica goes idle.

Memory a cell allocated and freed stays in glibc's heap: free chunks in the middle of it, which
glibc's automatic trim (the top of the heap only) cannot return. ``malloc_trim(0)`` returns every
free page, middle ones included (``madvise(MADV_DONTNEED)``). Measured (docs/performance.md, issue
36): after a cell that frees 25 MB, an idle notebook of three replicas holds 100.6 MB PSS instead
of 125.8 MB (a plain ipykernel keeps its 64 MB). Right after a start it changes little: a replica
whose modules are compiled has about 1.5 MB of free heap then. Freed pages come back zeroed on
their next use, at the cost of a page fault each.

The replica calls ``release_free_heap`` when its Raft group comes to rest (``raft_rest.py``), so an
idle notebook holds what it uses, not what starting it and its last cell freed. Where the C library
is not glibc (musl, macOS) there is no ``malloc_trim`` and nothing is done.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _find_malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols: its C library among them
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_malloc_trim = _find_malloc_trim()


def resident_bytes() -> int:
    """This process's resident set size (``/proc/self/statm``), 0 where there is none."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def available() -> bool:
    return _malloc_trim is not None


def release_free_heap() -> int:
    """``malloc_trim(0)``: the bytes of RSS it gave back (0 where not available or none)."""
    if _malloc_trim is None:
        return 0
    before = resident_bytes()
    _malloc_trim(0)
    return max(0, before - resident_bytes())
