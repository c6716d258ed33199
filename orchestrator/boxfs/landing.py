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
from typing import Callable, Iterable

from ..errors import ErrorType, OpenAgentsError
from .budget import HostBudget
from .copy import temp_name
from .tree import BoxDir


def land_file(
    dest: Path, fill: Callable[[Callable[[bytes], None]], None], budget: HostBudget, mode: int = 0o644
) -> int:
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
                        view = view[os.write(fd, view) :]
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


def land_tree(dest: Path, members: Iterable[tuple[str, bytes | None, int]], budget: HostBudget) -> tuple[int, int]:
    """Make the directory `dest` (created if missing; its own path the caller's) hold `members`:
    (relative name, the file's bytes or None for a directory, mode). Every directory below `dest` is
    made and entered without following a link (a link or a file where a directory goes is refused,
    typed); every file is written atomically (a fresh name renamed over what was there, never
    followed). A name that is absolute, holds `..` or an empty part is refused. (files, bytes) written."""
    try:
        os.makedirs(dest, exist_ok=True)
    except OSError as err:
        raise OpenAgentsError(ErrorType.IO_ERROR, f"{dest}: {err.strerror or err}") from None
    files = written = 0
    with BoxDir.open(dest, budget) as root:
        for name, data, mode in members:
            parts = name.split("/")
            if (
                not name
                or name.startswith("/")
                or any(p in ("", ".", "..") for p in parts)
                or len(parts) > budget.max_depth
            ):
                raise OpenAgentsError(ErrorType.PATH_INVALID, f"a name in the tree is refused: {name[:200]!r}")
            budget.charge_entries()
            here = root.dup()
            try:
                for part in parts[:-1] if data is not None else parts:
                    if here.lstat_or_none(part) is None:
                        here.mkdir(part, 0o755)
                    nxt = _enter(here, part, name)
                    here.close()
                    here = nxt
                if data is not None:
                    there = here.lstat_or_none(parts[-1])
                    if there is not None and stat.S_ISDIR(there.st_mode):
                        raise OpenAgentsError(ErrorType.IS_DIRECTORY, f"{dest}/{name} is a directory")
                    here.write_atomic(parts[-1], data, mode=mode & 0o755)
                    files, written = files + 1, written + len(data)
            finally:
                here.close()
    return files, written


def _enter(here: BoxDir, part: str, name: str) -> BoxDir:
    try:
        return here.sub(part)
    except OSError:
        raise OpenAgentsError(
            ErrorType.NOT_A_DIRECTORY, f"{name[:200]}: {part[:100]} is not a directory (a link is never followed)"
        ) from None
