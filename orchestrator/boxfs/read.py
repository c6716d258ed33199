"""Opening and reading box-written entries: one component at a time, no link followed, regular
files only, bounded.

A path is walked from a descriptor of the workspace root, every component opened with
O_NOFOLLOW relative to its parent (`dir_fd`), so no symlink is followed anywhere and no component
can be swapped between a check and its use; a leaf is opened O_NONBLOCK (a FIFO cannot block
us) and must be a regular file by fstat; its size is checked before reading and the read itself
is bounded, since the box may still be appending. Errors name the path (escaped) and the reason,
never the content.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ..errors import ErrorType, OpenAgentsError
from .names import show

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
CHUNK = 1 << 20

Name = bytes | str


def kind_words(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def refuse(rel: Name, reason: str) -> OpenAgentsError:
    return OpenAgentsError(ErrorType.UNSAFE_WORKSPACE_FILE, f"workspace file '{show(rel)}' refused: {reason}")


def components(rel: Name) -> list[bytes]:
    """A plain relative path as byte components: no NUL, not absolute, no '.', '..' or empty ones."""
    raw = rel if isinstance(rel, bytes) else os.fsencode(rel)
    parts = raw.split(b"/")
    if not raw or b"\0" in raw or raw.startswith(b"/") or any(p in (b"", b".", b"..") for p in parts):
        raise OpenAgentsError(ErrorType.PATH_INVALID, f"not a plain workspace-relative path: '{show(raw)}'")
    return parts


def open_dir(root: Path | str | bytes) -> int:
    """A descriptor of a trusted root (the user's workspace path, a state directory): opened normally."""
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise OpenAgentsError(
            ErrorType.IO_ERROR, f"cannot open the directory '{show(os.fsencode(root))}': {err.strerror}"
        ) from None


def open_parent(root_fd: int, rel: Name) -> tuple[int, bytes] | None:
    """(a new descriptor of rel's parent, rel's last component), reached without following any
    link; None when a parent does not exist or is not a directory. A symlinked parent raises
    UNSAFE_WORKSPACE_FILE: saying what is "there" would mean following it."""
    parts = components(rel)
    fd = os.dup(root_fd)
    try:
        for i, name in enumerate(parts[:-1]):
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                return None
            except OSError as err:
                if err.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise refuse(rel, f"cannot open '{show(b'/'.join(parts[: i + 1]))}': {err.strerror}") from None
                try:
                    mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
                except OSError:
                    return None
                if stat.S_ISLNK(mode):
                    raise refuse(
                        rel, f"'{show(b'/'.join(parts[: i + 1]))}' is a symlink, which the host never follows"
                    ) from None
                return None
            os.close(fd)
            fd = child
        child, fd = fd, -1
        return child, parts[-1]
    finally:
        if fd >= 0:
            os.close(fd)


def lstat_at(dir_fd: int, name: Name) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None


def open_regular(dir_fd: int, name: Name, rel: Name | None = None) -> tuple[int, os.stat_result]:
    """A read descriptor of the regular file dir_fd/name and its fstat. A FIFO, socket or device is
    refused by lstat before any open (a device's open can have effects), and again by fstat after
    it (the entry may have been swapped in between)."""
    shown = name if rel is None else rel
    st = lstat_at(dir_fd, name)
    if st is None:
        raise OpenAgentsError(ErrorType.FILE_NOT_FOUND, f"workspace file '{show(shown)}' does not exist")
    if not stat.S_ISREG(st.st_mode):
        raise refuse(shown, f"it is {kind_words(st.st_mode)}, not a regular file")
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError as err:  # swapped since the lstat: ELOOP (now a symlink), ENXIO (a socket), ...
        raise refuse(shown, f"cannot open it safely: {err.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise refuse(shown, f"it is {kind_words(st.st_mode)}, not a regular file")
    return fd, st


def read_fd(fd: int, cap: int, shown: Name) -> bytes:
    """At most `cap` bytes of an open regular file, refusing one that is (or grows) larger."""
    size = os.fstat(fd).st_size
    if size > cap:
        raise refuse(shown, f"it is {size} bytes, over the {cap}-byte cap")
    chunks: list[bytes] = []
    total = 0
    while total <= cap:
        chunk = os.read(fd, min(CHUNK, cap + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
    raise refuse(shown, f"it grew past the {cap}-byte cap while being read")


def read_at(dir_fd: int, name: Name, cap: int, rel: Name | None = None) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file dir_fd/name (at most `cap`) and the fstat of what was read."""
    fd, st = open_regular(dir_fd, name, rel)
    try:
        return read_fd(fd, cap, name if rel is None else rel), st
    finally:
        os.close(fd)
