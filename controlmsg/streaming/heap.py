"""Giving the C heap's free memory back to the operating system, for long-running tasks whose memory has a
transient peak (a restarted window task's restore and catch-up) and then a much smaller steady state.

glibc's ``malloc`` keeps what is freed in its arenas (the main heap, and more arenas for other threads
such as librdkafka's), and by itself only returns memory at the top of a heap. What a peak left free in the middle of
an arena stays in the process's RSS until ``malloc_trim`` hands those pages back. Elsewhere (another libc,
another system) :func:`release_free_heap` does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from typing import Any, Final

__all__ = ["release_free_heap", "rss_bytes"]


def _malloc_trim() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM: Final = _malloc_trim()
_PAGE: Final = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def release_free_heap() -> bool:
    """Return the C heap's free pages to the system (glibc ``malloc_trim(0)``, every arena). Blocks for the
    walk over the arenas (short: no system call per free chunk but one ``madvise`` per free run of pages);
    never raises. Returns whether there was a ``malloc_trim`` to call."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


def rss_bytes() -> int | None:
    """The process's resident set size in bytes (``None`` where ``/proc/self/statm`` does not exist)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None
