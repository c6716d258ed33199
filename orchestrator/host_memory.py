"""One setting of the host process's allocator, so its memory follows the work and does not only grow.

glibc's malloc serves a block over its mmap threshold (128 KiB at first) with its own mapping and
unmaps it when freed, but each such free raises the threshold to the freed size (up to 32 MiB). From
then on the host's large transient buffers (a 1 MiB write_file's request line, built in the caller's
thread; the model's response holding it) come from the calling thread's arena, and an arena keeps
what was freed. With a thread per box and up to 8 arenas per core, RSS climbed by a few MiB every
time a new thread wrote a large file, long after the data was gone: bench/soak.py measured 4 boxes
going from 43 to 78 MiB in heap that was free but held, while the memory in use stayed at 7 MiB.

Fixing the threshold (mallopt M_MMAP_THRESHOLD) turns the raising off: blocks over 256 KiB always
get their own mapping and go back to the system when freed; the same soak stayed within 47 MiB.
Elsewhere than glibc (musl, macOS) this does nothing.
"""
from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
LARGE_BLOCK_BYTES = 256 * 1024


def release_large_blocks() -> bool:
    """Blocks over 256 KiB get their own mapping, returned to the system when freed. Once per
    process, before the work starts; whether the allocator took the setting."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    taken = bool(mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES))
    if not taken:
        log.debug("malloc did not take M_MMAP_THRESHOLD")
    return taken
