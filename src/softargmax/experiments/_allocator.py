"""Keeping freed memory in the process: glibc's ``malloc`` tuned for a CPU training loop.

A training step on the CPU allocates and frees the same large buffers every step (activations, logits, their
gradients: a few MiB each).  glibc's ``malloc`` serves blocks above its mmap threshold with ``mmap`` and returns
them with ``munmap``, and gives the top of its heap back to the system above its trim threshold, so the next step
touches fresh pages: the small language model of ``softargmax reproduce lm`` took about 2,900 page faults a step (11
MiB), 5 ms of its 65 ms on one thread (2026-12-04, AMD EPYC, torch 2.13).  :func:`keep_freed_memory` raises both
thresholds, as ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` would, so freed blocks are reused: 2 to 40 page
faults a step.  Numbers are unchanged; only the time moves.  (PyTorch's CPU tuning guide suggests jemalloc or
TCMalloc for the same reason: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

#: ``mallopt`` parameters (``<malloc.h>``)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: blocks up to this size come from the heap: 32 MiB, glibc's largest threshold on 64-bit systems
MMAP_THRESHOLD = 32 << 20
#: the free memory at the top of the heap kept before any is returned to the system
TRIM_THRESHOLD = 1 << 30


@functools.lru_cache(maxsize=None)
def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds in this process (once); ``False`` where the C library is not glibc
    (nothing changed: macOS, Windows, musl).

    Example:
        >>> keep_freed_memory() in (True, False)
        True
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        # glibc's own function: another C library has no mallopt of these parameters
        if not hasattr(libc, "gnu_get_libc_version"):
            return False
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
