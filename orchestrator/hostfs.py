"""The one way host code reads a file of the workspace.

The box writes the workspace, so anything in it may be planted: a symlink to a host secret (or a
symlinked parent directory), a FIFO that blocks the reader forever, a device, a directory where a
file was expected, a sparse file of terabytes, a file that keeps growing while it is read. The
host must never follow, block on, or slurp what it finds there. So the path is walked one
component at a time from a descriptor of the workspace root, every component opened with
O_NOFOLLOW relative to its parent (`dir_fd`), so no symlink is followed anywhere and no component
can be swapped between a check and its use; the leaf is opened O_NONBLOCK and must be a regular
file; its size is checked with fstat and the read itself is bounded.

Errors name the path and the reason, never the file's content: the content is the box's, and an
error ends up on the terminal, in the transcript and in editors.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .errors import ErrorType, OpenAgentsError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CHUNK = 64 * 1024


def _refuse(rel: str, reason: str) -> OpenAgentsError:
    return OpenAgentsError(ErrorType.UNSAFE_WORKSPACE_FILE, f"workspace file {rel!r} refused: {reason}")


def _components(rel: str) -> list[str]:
    """A plain relative path: no NUL, not absolute, no '.', '..' or empty components."""
    parts = rel.split("/")
    if not rel or "\0" in rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise OpenAgentsError(ErrorType.PATH_INVALID, f"not a plain workspace-relative path: {rel!r}")
    return parts


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _open_parent(workspace: Path, rel: str, parts: list[str]) -> int | None:
    """A descriptor of the leaf's parent directory, reached without following any symlink.

    None when a parent does not exist (or is a plain file, so nothing can be below it). The
    workspace root itself is the user's trusted path and is opened normally.
    """
    try:
        fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise OpenAgentsError(ErrorType.IO_ERROR, f"cannot open the workspace {str(workspace)!r}: {err.strerror}") from None
    try:
        for i, name in enumerate(parts[:-1]):
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                return None
            except OSError as err:
                if err.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise _refuse(rel, f"cannot open {'/'.join(parts[:i + 1])!r}: {err.strerror}") from None
                try:
                    mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
                except OSError:
                    return None  # gone since the open failed
                if stat.S_ISLNK(mode):
                    raise _refuse(rel, f"{'/'.join(parts[:i + 1])!r} is a symlink, which the host never follows") from None
                return None  # a plain file where a directory would be: nothing below it
            os.close(fd)
            fd = child
        child, fd = fd, -1
        return child
    finally:
        if fd >= 0:
            os.close(fd)


def lstat_workspace(workspace: Path, rel: str) -> os.stat_result | None:
    """What is at `rel` (the entry itself, a symlink is not followed), or None if nothing is.

    A symlinked parent directory raises UNSAFE_WORKSPACE_FILE: the host cannot say what is
    "there" without following it, and silently ignoring a planted link would hide the attack.
    """
    parts = _components(rel)
    parent = _open_parent(Path(workspace), rel, parts)
    if parent is None:
        return None
    try:
        return os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None
    finally:
        os.close(parent)


def read_workspace_file(workspace: Path, rel: str, cap: int) -> bytes:
    """The bytes of the regular file WORKSPACE/rel, at most `cap` of them, or a typed refusal.

    Refused (UNSAFE_WORKSPACE_FILE) when any component is a symlink, the leaf is not a regular
    file (FIFO, socket, device, directory: refused at once, never blocking), or it is larger than
    `cap` (by fstat, so a sparse 100 GB file is never read, and again while reading, since the
    box may still be appending). FILE_NOT_FOUND when nothing is there.
    """
    parts = _components(rel)
    parent = _open_parent(Path(workspace), rel, parts)
    if parent is None:
        raise OpenAgentsError(ErrorType.FILE_NOT_FOUND, f"workspace file {rel!r} does not exist")
    try:
        try:
            # lstat first, so a device or FIFO is refused without even being opened.
            mode = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False).st_mode
        except FileNotFoundError:
            raise OpenAgentsError(ErrorType.FILE_NOT_FOUND, f"workspace file {rel!r} does not exist") from None
        if not stat.S_ISREG(mode):
            raise _refuse(rel, f"it is {_kind(mode)}, not a regular file")
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=parent)
        except OSError as err:  # swapped since the lstat: ELOOP (now a symlink), ENXIO (a socket), ...
            raise _refuse(rel, f"cannot open it safely: {err.strerror}") from None
    finally:
        os.close(parent)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refuse(rel, f"it is {_kind(info.st_mode)}, not a regular file")
        if info.st_size > cap:
            raise _refuse(rel, f"it is {info.st_size} bytes, over the {cap}-byte cap")
        chunks: list[bytes] = []
        total = 0
        while total <= cap:
            chunk = os.read(fd, min(_CHUNK, cap + 1 - total))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            total += len(chunk)
        raise _refuse(rel, f"it grew past the {cap}-byte cap while being read")
    finally:
        os.close(fd)
