"""What the file tools share: the typed error, argument checks, and opening a workspace file
without following a link. Each tool has its module (reading, listing, search, writing); ``shell``
lives in shell.py."""

from __future__ import annotations

import errno
import os
import stat

from .names import from_arg
from .paths import WORKSPACE, check_fd, local

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start 10-25 ms
if TYPE_CHECKING:
    from typing import Any, Literal, TypeVar, overload


class ToolError(Exception):
    """A typed failure; ``kind`` is a member of the host's ErrorType enum."""

    def __init__(self, kind: str, message: str, *, output: str = "", meta: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.output = output  # what was produced before the failure (a timed-out command's output)
        self.meta = meta or {}


if TYPE_CHECKING:  # the checker sees hashlib's, which has the same interface (CPython's private modules have no stubs)
    import hashlib

    _sha256 = hashlib.sha256
else:
    try:  # the builtin module: hashlib would load OpenSSL, 3 MiB of the agent's memory
        from _sha256 import sha256 as _sha256
    except ImportError:
        try:
            from _sha2 import sha256 as _sha256  # the same, renamed in 3.12
        except ImportError:
            from hashlib import sha256 as _sha256


READ_CHUNK = 1 << 20


def sha256(data: bytes) -> str:
    return _sha256(data).hexdigest()


def _os_error(err: OSError, rel: str) -> ToolError:
    if err.errno == errno.ENOENT:
        return ToolError("file_not_found", f"{rel}: no such file or directory")
    if err.errno in (errno.EACCES, errno.EPERM):
        return ToolError("permission_denied", f"{rel}: permission denied")
    if err.errno == errno.EISDIR:
        return ToolError("is_directory", f"{rel} is a directory")
    if err.errno == errno.ENOTDIR:
        return ToolError("not_a_directory", f"{rel}: a component is not a directory")
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return ToolError("no_space", f"{rel}: no space left on the workspace's device")
    if err.errno == errno.ELOOP:
        return ToolError("path_outside_workspace", f"{rel}: the path is a symlink; refused")
    if err.errno == errno.EROFS:
        return ToolError("permission_denied", f"{rel}: the file system there is read-only")
    if err.errno == errno.ENAMETOOLONG:
        return ToolError("path_invalid", f"{rel[:200]}: a name in the path is too long (at most 255 bytes each)")
    if err.errno == errno.EXDEV:
        return ToolError("permission_denied", f"{rel}: crosses a mount boundary")
    return ToolError("io_error", f"{rel}: {err.strerror}")


if TYPE_CHECKING:
    T = TypeVar("T")
else:

    def overload(fn: object) -> object:  # typing's, without importing typing: the last definition is the one called
        return fn


@overload
def _arg(args: dict[str, Any], name: str, kind: type[T], default: None = None, *, required: Literal[True]) -> T: ...
@overload
def _arg(args: dict[str, Any], name: str, kind: type[T], default: T) -> T: ...
@overload
def _arg(args: dict[str, Any], name: str, kind: type[T], default: None = None) -> T | None: ...


def _arg(args: dict[str, Any], name: str, kind: type[T], default: T | None = None, required: bool = False) -> T | None:
    if name not in args or args[name] is None:
        if required:
            raise ToolError("invalid_arguments", f"missing required argument {name!r}")
        return default
    value = args[name]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise ToolError("invalid_arguments", f"argument {name!r} must be of type {kind.__name__}")
    return value


def _path_arg(args: dict[str, Any], default: str | None = None) -> str:
    """The `path` argument as a name (an os.fsdecode string): a string, or {"bytes_b64": ...} for a
    name that is not UTF-8 (names.from_arg), as list_files' `names` and grep_files' `hits` give it."""
    if args.get("path") is None:
        if default is None:
            raise ToolError("invalid_arguments", "missing required argument 'path'")
        return default
    try:
        return from_arg(args["path"])
    except ValueError as err:
        raise ToolError("invalid_arguments", f"argument 'path' {err}") from None


def _open_regular(rel: str, real: str, cap: int | None = None) -> int:
    """Open without following a final symlink, re-check where the fd really is, refuse non-files.
    O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer that never comes."""
    try:
        fd = os.open(local(real), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as err:
        _refuse_special(rel, real)  # gVisor refuses to open a host FIFO (EACCES): say what it is
        raise _os_error(err, rel) from None
    try:
        check_fd(fd)
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ToolError("is_directory", f"{rel} is a directory; use list_files")
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(
                "not_regular_file",
                f"{rel} is a {_file_type(st.st_mode)}, not a regular file; only regular files are read",
            )
        if cap is not None and st.st_size > cap:
            raise ToolError("file_too_large", f"{rel} is {st.st_size} bytes; the limit is {cap}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refuse_special(rel: str, real: str) -> None:
    try:
        mode = os.lstat(local(real)).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
        raise ToolError(
            "not_regular_file", f"{rel} is a {_file_type(mode)}, not a regular file; only regular files are read"
        )


def _file_type(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "FIFO (named pipe)"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "special file"


def _read_bytes(rel: str, real: str, cap: int) -> bytes:
    fd = _open_regular(rel, real, cap)
    try:
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read()
    except OSError as err:
        raise _os_error(err, rel) from None
    finally:
        os.close(fd)


def _refuse_trailing_slash(rel: str, real: str, creating: bool = False) -> None:
    """'f.txt/' names a directory: POSIX refuses it (ENOTDIR for a file, EISDIR to create one), but the
    path check normalises the slash away, so a write to 'newdir/' would make a file called newdir."""
    if not rel.endswith("/") or os.path.isdir(real):
        return
    if os.path.lexists(real):
        raise ToolError("not_a_directory", f"{rel}: {rel.rstrip('/')} is not a directory (drop the trailing '/')")
    if creating:
        raise ToolError(
            "is_directory", f"{rel} ends with '/', so it names a directory; write_file writes a file: drop the '/'"
        )


def _rel(real: str) -> str:
    return os.path.relpath(real, WORKSPACE)


def _display(path: str) -> str:
    return _rel(path) if os.path.isabs(path) else os.path.normpath(path)
