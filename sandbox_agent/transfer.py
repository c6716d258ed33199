"""Bytes in and out of the workspace for the program's own API (Sandbox.read_bytes, write_bytes,
upload, download): not tools of a model (table.OPS, never table.TOOLS). A file moves in pieces of at
most limits.BYTES_CHUNK, one request each, so a file of up to limits.BYTES_MAX_FILE needs no message
larger than a few MiB and neither side holds more than a piece of it at a time.

Stateless between requests (an agent replaced mid-way loses nothing it needs):
- `bytes_read`: one piece of a regular file (no link followed, checked where it really is), with
  the file's identity (inode, size, mtime) so the host notices a file changed between pieces.
- `bytes_write`: one piece into a temporary name beside the target (`.NAME.oa-part-TOKEN`, made
  with O_EXCL and no link followed at the first piece); the last piece checks the size, syncs and
  renames it over the target: a reader sees the old file or the whole new one, never a part.
- `bytes_abort`: the temporary name of a write that will not finish, removed.
"""

from __future__ import annotations

import os
import stat
from binascii import a2b_base64, b2a_base64

from . import limits
from .paths import check_fd, resolve
from .tools import ToolError, _arg, _open_regular, _os_error, _path_arg, _refuse_trailing_slash
from .writing import make_parent

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start 10-25 ms
if TYPE_CHECKING:
    from typing import Any


def _token(args: dict[str, Any]) -> str:
    token = _arg(args, "token", str, required=True)
    if not (8 <= len(token) <= 32) or not all(c in "0123456789abcdef" for c in token):
        raise ToolError("invalid_arguments", "token must be 8-32 lowercase hex digits")
    return token


def _offset(args: dict[str, Any]) -> int:
    offset = _arg(args, "offset", int, 0)
    if offset < 0 or offset > limits.BYTES_MAX_FILE:
        raise ToolError("invalid_arguments", f"offset must be 0..{limits.BYTES_MAX_FILE}")
    return offset


def bytes_read(args: dict[str, Any]) -> dict[str, Any]:
    rel = _path_arg(args)
    offset = _offset(args)
    length = _arg(args, "length", int, limits.BYTES_CHUNK)
    if not 0 < length <= limits.BYTES_CHUNK:
        raise ToolError("invalid_arguments", f"length must be 1..{limits.BYTES_CHUNK}")
    real = resolve(rel)
    _refuse_trailing_slash(rel, real)
    fd = _open_regular(rel, real, limits.BYTES_MAX_FILE)
    try:
        st = os.fstat(fd)
        try:
            data = os.pread(fd, length, offset)
        except OSError as err:
            raise _os_error(err, rel) from None
    finally:
        os.close(fd)
    return {
        "output": "",
        "meta": {
            "data": b2a_base64(data, newline=False).decode("ascii"),
            "size": st.st_size,
            "identity": f"{st.st_dev}:{st.st_ino}:{st.st_mtime_ns}",
        },
    }


def _part_name(name: str, token: str) -> str:
    return f".{name[:180]}.oa-part-{token}"


def _parent_fd(rel: str, real: str, create: bool) -> int:
    parent = os.path.dirname(real)
    if create:
        make_parent(rel, real)
    try:
        dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise _os_error(err, rel) from None
    try:
        check_fd(dfd, mutation=True)
    except BaseException:
        os.close(dfd)
        raise
    return dfd


def _target_mode(rel: str, name: str, dfd: int) -> int | None:
    """The mode the new file keeps (the old file's), after the checks a plain write makes."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise _os_error(err, rel) from None
    if stat.S_ISDIR(st.st_mode):
        raise ToolError("is_directory", f"{rel} is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise ToolError("not_regular_file", f"{rel} is not a regular file; it is not replaced")
    if not os.access(name, os.W_OK, dir_fd=dfd, follow_symlinks=False):
        raise ToolError(
            "permission_denied", f"{rel} is read-only (mode {stat.S_IMODE(st.st_mode):04o}); it is not replaced"
        )
    return stat.S_IMODE(st.st_mode)


def bytes_write(args: dict[str, Any]) -> dict[str, Any]:
    rel = _path_arg(args)
    token = _token(args)
    offset = _offset(args)
    size = _arg(args, "size", int, required=True)
    last = _arg(args, "last", bool, False)
    text = _arg(args, "data", str, "")
    if not 0 <= size <= limits.BYTES_MAX_FILE:
        raise ToolError("file_too_large", f"{rel}: {size} bytes; the limit is {limits.BYTES_MAX_FILE}")
    try:
        data = a2b_base64(text)
    except ValueError:
        raise ToolError("invalid_arguments", "data is not base64") from None
    if len(data) > limits.BYTES_CHUNK or offset + len(data) > size:
        raise ToolError("invalid_arguments", f"a piece of at most {limits.BYTES_CHUNK} bytes inside the declared size")
    real = resolve(rel, mutation=True)
    _refuse_trailing_slash(rel, real, creating=True)
    name = os.path.basename(real)
    part = _part_name(name, token)
    dfd = _parent_fd(rel, real, create=offset == 0)
    try:
        mode = _target_mode(rel, name, dfd)
        flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(
                part,
                flags | (os.O_CREAT | os.O_EXCL if offset == 0 else 0),
                0o644 if mode is None else mode,
                dir_fd=dfd,
            )
        except OSError as err:
            raise _os_error(err, rel) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size != offset:  # pieces in order, each once
                raise ToolError(
                    "stale_content", f"{rel}: the transfer's pieces came out of order (at {st.st_size}, not {offset})"
                )
            view = memoryview(data)
            while view:
                view = view[os.pwrite(fd, view, offset + len(data) - len(view)) :]
            if last:
                if offset + len(data) != size:
                    raise ToolError(
                        "invalid_arguments", f"{rel}: the last piece ends at {offset + len(data)}, not {size}"
                    )
                if mode is not None:
                    os.fchmod(fd, mode)
                os.fsync(fd)
        except OSError as err:
            raise _os_error(err, rel) from None
        finally:
            os.close(fd)
        if last:
            try:
                os.replace(part, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except OSError as err:
                raise _os_error(err, rel) from None
    except BaseException:
        _unlink(part, dfd)
        raise
    finally:
        os.close(dfd)
    return {
        "output": f"wrote {size} bytes to {rel}" if last else "",
        "meta": {"bytes": offset + len(data), "created": mode is None},
    }


def _unlink(part: str, dfd: int) -> None:
    try:
        os.unlink(part, dir_fd=dfd)
    except OSError:
        pass


def bytes_abort(args: dict[str, Any]) -> dict[str, Any]:
    rel = _path_arg(args)
    token = _token(args)
    real = resolve(rel, mutation=True)
    try:
        dfd = _parent_fd(rel, real, create=False)
    except ToolError:
        return {"output": ""}
    try:
        _unlink(_part_name(os.path.basename(real), token), dfd)
    finally:
        os.close(dfd)
    return {"output": ""}
