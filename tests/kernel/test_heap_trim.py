"""An idle replica gives its free C heap back (kernel/heap_trim.py, issue 36).

A cell that frees many objects too large for pymalloc leaves holes in glibc's heap, between pages
in use, which glibc's automatic trim (the heap's top only) never returns.
"""

from __future__ import annotations

import ctypes

import pytest
from harness import ReplicaGroup

from notebookos.kernel import heap_trim

needs_glibc = pytest.mark.skipif(not heap_trim.available(), reason="no malloc_trim (not glibc)")


@needs_glibc
def test_free_pages_between_used_ones_are_given_back():
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, count = 64 * 1024, 256  # under glibc's mmap threshold: on the heap
    chunks = [libc.malloc(size) for _ in range(count)]
    for chunk in chunks:
        ctypes.memset(chunk, 1, size)  # resident
    kept = chunks[7::8]  # one chunk in eight stays: the freed ones are holes, not the heap's top
    for i, chunk in enumerate(chunks):
        if i % 8 != 7:
            libc.free(chunk)
    try:
        released = heap_trim.release_free_heap()
        assert released >= count * size // 2, released  # 14 MB freed; half of it at least back
    finally:
        for chunk in kept:
            libc.free(chunk)


def test_idle_replicas_trim_their_heap_as_the_group_rests(group: ReplicaGroup):
    """A cell that frees 24 MB of objects too large for pymalloc (glibc's heap), with a few kept
    above them: the executor gives the holes back once the group rests after the cell. (What a
    replica frees while starting varies with whether its modules were compiled, 1.5-6 MB: not
    what is checked.)"""
    if not heap_trim.available():
        pytest.skip("no malloc_trim (not glibc)")
    result = group.execute("x = [bytes(600) for _ in range(40000)]\n"
                           "keep = [bytes(600) for _ in range(10)]\ndel x", target=1)
    assert result.executor_reply()["content"]["status"] == "ok", result.summary()
    status = group.wait_status(
        lambda s: all(r.get("raft_resting") and r.get("heap_trims", 0) >= 1 for r in s.values())
        and max(r["heap_released_bytes"] for r in s.values()) > 12_000_000, timeout=30)
    # a trimmed replica runs the next cell as before, and the group rests (and trims) again
    result = group.execute("print(len(keep))", target=2)
    assert result.stdout() == "10\n", result.summary()
    group.wait_status(lambda s: all(r.get("raft_resting") and r["heap_trims"] > status[rid]["heap_trims"]
                                    for rid, r in s.items()), timeout=30)
