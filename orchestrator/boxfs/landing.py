"""Bytes from the box landing in a host file (the API's `download`): the data came over the agent's
channel, not from the box's files, but its destination may be where the box writes (a bind-mounted
workspace): so the file is made here, as everything else is that touches such a tree. The parent
directory is the caller's path (opened normally); the file is a fresh temporary name beside the
destination (O_EXCL, never through a link), bounded by a HostBudget, fsync'd, then renamed over the
destination: an entry already there (a link the box planted included) is replaced, never followed,
and a reader sees the old file or the whole new one."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Callable

from ..errors import ErrorType, OpenAgentsError
from .budget import HostBudget
from .copy import temp_name
from .tree import BoxDir


def land_file(dest: Path, fill: Callable[[Callable[[bytes], None]], None], budget: HostBudget, mode: int = 0o644) -> int:
    """Make `dest` a regular file of what `fill(write)` writes (each piece charged to `budget`);
    the bytes written. A failure (of `fill` too) leaves `dest` as it was and no temporary file."""
    if not dest.name or dest.name in (".", ".."):
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"{dest}: not a file name")
    with BoxDir.open(dest.parent if str(dest.parent) else Path("."), budget) as parent:
        there = parent.lstat_or_none(dest.name)
        if there is not None and stat.S_ISDIR(there.st_mode):
            raise OpenAgentsError(ErrorType.IS_DIRECTORY, f"{dest} is a directory")
        tmp = temp_name()
        fd = parent.create(tmp, mode & 0o777)
        written = 0
        try:
            try:
                def write(piece: bytes) -> None:
                    nonlocal written
                    budget.charge_bytes(len(piece))
                    view = memoryview(piece)
                    while view:
                        view = view[os.write(fd, view):]
                    written += len(piece)

                fill(write)
                os.fchmod(fd, mode & 0o777)
                os.fsync(fd)
            finally:
                os.close(fd)
            parent.rename(tmp, dest.name)
        except BaseException:
            try:
                parent.unlink(tmp)
            except OSError:
                pass
            raise
    return written
