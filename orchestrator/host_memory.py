"""Two settings of the host process's allocator, so its memory follows the work and does not only grow.

glibc's malloc serves a block over its mmap threshold (128 KiB at first) with its own mapping and
unmaps it when freed, but each such free raises the threshold to the freed size (up to 32 MiB). From
then on the host's large transient buffers (a 1 MiB write_file's request line, built in the caller's
thread; the model's response holding it) come from the calling thread's arena, and an arena keeps
what was freed. With a thread per box and up to 8 arenas per core, RSS climbed by a few MiB every
time a new thread wrote a large file, long after the data was gone: bench/soak.py measured 4 boxes
going from 43 to 78 MiB in heap that was free but held, while the memory in use stayed at 7 MiB.
Fixing the threshold (mallopt M_MMAP_THRESHOLD) turns the raising off: blocks over 256 KiB always
get their own mapping and go back to the system when freed; the same soak stayed within 47 MiB.

The smaller blocks (outputs, JSON lines, 4 KiB chunks) are spread by glibc over one arena per
thread, up to 16 on 2 cores; each arena fragments on its own: 8 boxes (25 threads) grew the heap
from 10.5 to 13.7 MiB in 2600 calls, with 7.5 MiB of it in use before and after. Two arenas
(M_ARENA_MAX) are plenty for a process whose threads take turns under the GIL: the same mix grew it
from 8.1 to 10.4 MiB over 8900 calls.

Set once per process, before its threads start (an arena is given to a thread at its first
allocation). Elsewhere than glibc (musl, macOS) this does nothing.
"""
from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
M_ARENA_MAX = -8
LARGE_BLOCK_BYTES = 256 * 1024
ARENAS = 2


def tune_allocator() -> bool:
    """Blocks over 256 KiB get their own mapping, returned to the system when freed; at most two
    arenas. Whether the allocator took both settings."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    taken = bool(mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES)) and bool(mallopt(M_ARENA_MAX, ARENAS))
    if not taken:
        log.debug("malloc did not take M_MMAP_THRESHOLD and M_ARENA_MAX")
    return taken
