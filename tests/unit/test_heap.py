"""controlmsg.streaming.heap: the C heap's free pages go back to the system, which glibc does not do by
itself for free memory below a chunk still in use."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import pytest

from controlmsg.streaming.heap import release_free_heap, rss_bytes

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc")


@linux_only
def test_rss_is_measured() -> None:
    rss = rss_bytes()
    assert rss is not None and rss > 0


@linux_only
def test_free_heap_below_a_live_chunk_is_returned() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    # 64 MB in 64 kB blocks (under glibc's mmap threshold: they come from the heap), each touched; then all
    # freed but the last, which pins the heap's top so that free() alone cannot shrink it.
    block, count = 64 << 10, 1024
    blocks = [libc.malloc(block) for _ in range(count)]
    assert all(blocks)
    for b in blocks:
        ctypes.memset(b, 1, block)
    for b in blocks[:-1]:
        libc.free(b)
    before = rss_bytes()
    if not release_free_heap():
        pytest.skip("no malloc_trim (not glibc)")
    after = rss_bytes()
    libc.free(blocks[-1])
    assert before is not None and after is not None
    assert before - after > 32 << 20
