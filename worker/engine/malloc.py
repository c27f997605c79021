"""The engine process keeps the memory it frees, so a step never waits on page faults.

CTranslate2 on a CPU allocates each step's buffers afresh, and they grow with the sequences.
glibc serves a block over its mmap threshold with a fresh mapping and unmaps it on free; the
threshold rises only to the largest block freed so far, so while sequences keep growing every
step's new largest buffers are fresh mappings whose pages fault in one by one. Measured on the
bench model, CTranslate2 alone in a fresh process, ``generate_batch`` of 16 x 256 tokens: the
first call took 13.5 s (4.5 M minor faults, 12.7 s of system time), the next ones 5.6-7.0 s; with
a fixed threshold and no trimming, the first took 5.7 s (48 k faults) and so did the next. So the
first long burst after a start ran at about half the engine's speed.

A fixed threshold (blocks below it come from the heap) and a high trim threshold (freed heap
stays in the process) make the engine's resident memory stay at its peak, as a GPU caching
allocator does; ``engine_keep_freed_memory = false`` gives glibc's defaults back.

Kept for ever, that peak stayed after every flood (an audit saw the engine at several times its
idle size, hours later). So once no batch has run for ``engine_trim_after_idle_seconds``
(``trickle.heap.IdleTrim``) the engine hands the free heap back with ``malloc_trim``: every
arena's free pages, not only the top of the main heap. Busy, it keeps its pages; the first
burst after an idle spell faults them in again, which is the cost the threshold above saves
while it runs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

# glibc's mallopt(3) parameters.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest (HEAP_MAX / 2 on 64-bit): big weights still map
TRIM_THRESHOLD_BYTES = 1 << 30  # free heap top kept up to this before it goes back to the OS


def keep_freed_memory() -> bool:
    """Fix glibc's mmap threshold and raise its trim threshold for this process; False where
    the C library is not glibc (nothing to change there)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    fixed: bool = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    kept: bool = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    if not (fixed and kept):
        log.warning("mallopt refused the engine's heap settings; glibc's defaults stay")
    return fixed and kept
