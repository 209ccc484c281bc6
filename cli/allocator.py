"""The command's process keeps the memory it frees for reuse (glibc's allocator).

By default glibc serves a block of more than 128 KiB (up to 32 MiB, as its dynamic threshold rises) from pages it
maps for it and hands them back to the kernel when the block is freed, and it trims the heap's free top beyond twice
that: the next such block is mapped, and page-faulted in, afresh. A search over millions of rows allocates and frees
hundreds of arrays of that size: DeepSeek-V3 on 2,048 H800 (bench/search_speed.py) took about 50,000 page faults and
0.2 s of system time in a 1.3 s command, about a third of them where the enumeration's and the distinct keys' arrays
follow one another. A command runs once and exits, so its process keeps freed memory in its heap for the next array
instead (peak memory is unchanged: what is kept is reused, not added). The library (``paraplan.plan``) leaves the
process it runs in as it is.
"""

from __future__ import annotations

import ctypes
import sys

# mallopt parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
# Blocks up to this size come from the heap, and the heap keeps up to this much free memory at its top.
KEPT_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Have glibc keep freed memory in the heap (module docstring); whether it took the settings (False off glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no C library with mallopt in this process
        return False
    # One arena: the search's pricing threads reuse the heap the enumeration freed instead of each faulting in an
    # arena of its own (numpy allocates per array, not per element, so they seldom wait for its lock).
    return bool(mallopt(M_MMAP_THRESHOLD, KEPT_BYTES)) & bool(mallopt(M_TRIM_THRESHOLD, KEPT_BYTES)) \
        & bool(mallopt(M_ARENA_MAX, 1))
