"""Host-owned files (a session's record, a transcript, a lock, a pin, a report, the sweep journal)
opened without following a link.

These are not the box's: they live in the user's state directory (never mounted in a box) or at
a path the user named. But a name there can still be a link (planted on a shared state
directory, or a path given on the command line that is one), and a write through it would land
elsewhere. The flags that refuse it are spelled here, beside the rules for box data, so no module
elsewhere opens a file with O_NOFOLLOW/O_DIRECTORY of its own (tests/architecture/test_boxfs_guard.py).
Errors are the kernel's OSError (ELOOP for a link to a file, ENOTDIR for one where a directory was
wanted), for the caller to type.
"""

from __future__ import annotations

import os
from pathlib import Path

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def open_private(path: Path | str | bytes, flags: int, mode: int = 0o600, *, at: int | None = None) -> int:
    """os.open(path, flags) with no link followed at the last component (relative to the directory
    descriptor `at` when given)."""
    return os.open(path, flags | _NOFOLLOW, mode, dir_fd=at)


def create_private(path: Path | str | bytes, mode: int = 0o600) -> int:
    """A write descriptor of a new file at `path`: never an existing entry, never through a link."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode)


def open_private_dir(path: Path | str | bytes, *, follow: bool = False) -> int:
    """A read descriptor of the directory `path`; its last component a link is refused (ENOTDIR)
    unless `follow` (a directory we only fsync, whose name is ours)."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
