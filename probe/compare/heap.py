"""Give the process's free heap back to the system between the compare's stages.

The diagnosis of a big pair makes and drops large temporaries (arrays over 100k calls,
lists over 700k rows); glibc's allocator keeps the freed pages in the process, so the
report's own allocations were counted on top of them: the 100k-entry yardstick's peak
went from ~590 to 624 MB with the diagnosis done over columns, back to 590-602 with the
heap trimmed between the two (bench/compare.py prints the peak). Nothing is freed that
is in use; where the C library has no ``malloc_trim`` (musl, macOS, Windows) this does
nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.lru_cache(maxsize=None)
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none or cannot be loaded."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or None), "malloc_trim", None)
    except OSError:
        return None


def give_back_free_heap() -> None:
    """Return the free pages at the heap's top and inside it to the system (~10 ms after the
    100k-entry pair's diagnosis)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
