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

What stays is the arenas' free space below their top: a peak of concurrent calls leaves it behind,
in pages that stay resident although nothing uses them (the soak: 8 boxes held a few MiB that way
for its whole half hour). malloc_trim hands such pages back: after the last call running in the
process ends (at most every second), and every TRIM_EVERY_S while calls overlap, so its cost (a
walk of two arenas, about a millisecond) is noise.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable, cast

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
M_ARENA_MAX = -8
LARGE_BLOCK_BYTES = 256 * 1024
ARENAS = 2
TRIM_EVERY_S = 30.0  # while calls keep running
IDLE_TRIM_EVERY_S = 1.0  # once none is running


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


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return cast("Callable[[int], int]", trim)


_trim = _malloc_trim()
_trim_lock = threading.Lock()  # one trim at a time; a busy lock means one is under way
_trimmed_at = time.monotonic()
_in_flight_lock = threading.Lock()  # apart from _trim_lock: a call starting never waits for a trim
_in_flight = 0  # tool calls running in this process, on any sandbox


def release_free_memory(idle: bool = False) -> bool:
    """Hand malloc's free pages back to the system, at most once per TRIM_EVERY_S, or IDLE_TRIM_EVERY_S
    when no call is running any more (`idle`), and never on two threads at once. Whether it trimmed."""
    global _trimmed_at
    every = IDLE_TRIM_EVERY_S if idle else TRIM_EVERY_S
    if _trim is None or time.monotonic() - _trimmed_at < every or not _trim_lock.acquire(blocking=False):
        return False
    try:
        _trimmed_at = time.monotonic()
        _trim(0)
        return True
    finally:
        _trim_lock.release()


@contextmanager
def tool_call() -> Iterator[None]:
    """Around each tool call: when the last call running in the process ends, the process is idle
    (a session waiting for its model, a server between prompts) and gives its free pages back then;
    while calls overlap, every TRIM_EVERY_S."""
    global _in_flight
    with _in_flight_lock:
        _in_flight += 1
    try:
        yield
    finally:
        with _in_flight_lock:
            _in_flight -= 1
            idle = _in_flight == 0
        release_free_memory(idle)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def malloc_stats() -> tuple[int, int] | None:
    """(bytes in use, bytes free but held) by malloc over all arenas; None without glibc's mallinfo2."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return int(info.uordblks + info.hblkhd), int(info.fordblks)
