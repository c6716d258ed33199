"""The five file tools with the contract's bounds. ``shell`` lives in shell.py."""
from __future__ import annotations

import errno
import fnmatch
import os
import re
import stat
import threading

from . import limits
from .paths import WORKSPACE, PathRefused, check_fd, local, resolve

BOM = b"\xef\xbb\xbf"
DIFF_MAX_CHARS = 256 * 1024
# Writes and edits are read-modify-write: one at a time, so two concurrent edits never lose one.
_mutation_lock = threading.Lock()


class ToolError(Exception):
    """A typed failure; ``kind`` is a member of the host's ErrorType enum."""

    def __init__(self, kind: str, message: str, *, output: str = "", meta: dict | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.output = output  # what was produced before the failure (a timed-out command's output)
        self.meta = meta or {}


try:  # the builtin module: hashlib would load OpenSSL, 3 MiB of the agent's memory
    from _sha256 import sha256 as _sha256
except ImportError:
    try:
        from _sha2 import sha256 as _sha256
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
    if err.errno == errno.EXDEV:
        return ToolError("permission_denied", f"{rel}: crosses a mount boundary")
    return ToolError("io_error", f"{rel}: {err.strerror}")


def _arg(args: dict, name: str, kind: type, default=None, required: bool = False):
    if name not in args or args[name] is None:
        if required:
            raise ToolError("invalid_arguments", f"missing required argument {name!r}")
        return default
    value = args[name]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise ToolError("invalid_arguments", f"argument {name!r} must be of type {kind.__name__}")
    return value


def _open_regular(rel: str, real: str, cap: int | None = None) -> int:
    """Open without following a final symlink, re-check where the fd really is, refuse non-files.
    O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer that never comes."""
    try:
        fd = os.open(local(real), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as err:
        raise _os_error(err, rel) from None
    try:
        check_fd(fd)
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ToolError("is_directory", f"{rel} is a directory; use list_files")
        if not stat.S_ISREG(st.st_mode):
            raise ToolError("not_a_file", f"{rel} is a {_file_type(st.st_mode)}, not a regular file; only regular files are read")
        if cap is not None and st.st_size > cap:
            raise ToolError("file_too_large", f"{rel} is {st.st_size} bytes; the limit is {cap}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO (named pipe)"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device")):
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


def _rel(real: str) -> str:
    return os.path.relpath(real, WORKSPACE)


def read_file(args: dict) -> dict:
    """Streams the file: memory stays bounded by the 48 KiB cap whatever the file's size, while the
    sha256 still covers the whole file (the stale-content guard needs it)."""
    rel = _arg(args, "path", str, required=True)
    offset = _arg(args, "offset", int, 1)
    limit = _arg(args, "limit", int, limits.READ_DEFAULT_LIMIT_LINES)
    if offset < 1 or limit < 1:
        raise ToolError("invalid_arguments", "offset and limit must be at least 1")
    cap = limits.READ_CAP_BYTES
    fd = _open_regular(rel, resolve(rel))
    digest = _sha256()
    collected: list[bytes] = []
    size = line_no = 0
    end = offset - 1
    full = cut_line = False
    starts_line = first = True
    try:
        with os.fdopen(fd, "rb") as fh:
            while piece := fh.readline(READ_CHUNK):
                digest.update(piece)
                if first:
                    first = False
                    piece = piece[len(BOM):] if piece.startswith(BOM) else piece
                if starts_line:
                    line_no += 1
                is_start, starts_line = starts_line, piece.endswith(b"\n")
                if full or not is_start or not offset <= line_no < offset + limit:
                    continue
                if size + len(piece) <= cap:
                    collected.append(piece)
                    size += len(piece)
                    end = line_no
                    continue
                if not collected:  # one line longer than the cap: give its first 48 KiB
                    collected.append(piece[:cap])
                    end = line_no
                    cut_line = True
                full = True
    except OSError as err:
        raise _os_error(err, rel) from None
    total = line_no
    if offset > max(total, 1):
        raise ToolError("invalid_arguments", f"offset {offset} is past the end ({total} lines)")
    content = b"".join(collected).decode("utf-8", errors="ignore" if cut_line else "replace")
    hexdigest = digest.hexdigest()
    truncated = end < total
    meta = {
        "sha256": hexdigest,
        "total_lines": total,
        "first_line": offset,
        "last_line": end,
        "truncated": truncated or cut_line,
        "next_offset": end + 1 if truncated else None,
        "bytes": len(content.encode("utf-8")),
    }
    note = f"[file {rel}: lines {offset}-{end} of {total}; sha256 {hexdigest}]"
    if truncated:
        note += f"\n[truncated at {cap // 1024} KiB or {limit} lines: read on from line {end + 1} with offset={end + 1}]"
    if cut_line:
        note += f"\n[line {end} is longer than {cap} bytes and was cut]"
    return {"output": content, "note": note, "meta": meta}


def _display(path: str) -> str:
    return _rel(path) if os.path.isabs(path) else os.path.normpath(path)


def _walk(start: str, recursive: bool = True, strict: bool = False):
    """(entry, is_dir) under `start`, depth first in name order. Skipped directories are neither
    listed nor entered, and nothing is followed through a symlink. An unreadable directory is an
    error when `strict`, else passed over."""
    stack = [start]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as it:
                items = sorted(it, key=lambda e: e.name)
        except OSError as err:
            if strict:
                raise _os_error(err, _display(current)) from None
            continue
        subdirs = []
        for entry in items:
            is_dir = entry.is_dir(follow_symlinks=False)
            if is_dir and entry.name in limits.LIST_SKIPPED_DIRS:
                continue
            yield entry, is_dir
            if is_dir and recursive:
                subdirs.append(entry.path)
        stack.extend(reversed(subdirs))


def list_files(args: dict) -> dict:
    rel = _arg(args, "path", str, ".")
    recursive = _arg(args, "recursive", bool, True)
    real = resolve(rel)
    if not os.path.isdir(real):
        raise ToolError("not_a_directory", f"{rel} is not a directory")
    entries: list[str] = []
    more = False
    for entry, is_dir in _walk(local(real), recursive, strict=True):
        if len(entries) >= limits.LIST_MAX_ENTRIES:
            more = True
            break
        path = _display(entry.path)
        entries.append(path + "/" if is_dir else path)
    output = "\n".join(entries)
    if more:
        output += f"\n[truncated: the listing stops at {limits.LIST_MAX_ENTRIES} entries; list a subdirectory to see more]"
    return {"output": output, "meta": {"entries": len(entries), "truncated": more}}


def _walk_files(real: str):
    """Regular files under `real` (or `real` itself if it is one)."""
    start = local(real)
    if not os.path.isdir(start):
        yield start
        return
    for entry, is_dir in _walk(start):
        if not is_dir and entry.is_file(follow_symlinks=False):
            yield entry.path


def _read_for_grep(path: str) -> bytes | None:
    """The file's bytes, or None for what grep skips: unreadable, swapped, too large, binary."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        check_fd(fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
            size += len(chunk)
            if size > limits.GREP_MAX_FILE_BYTES:
                return None
    except (OSError, PathRefused):
        return None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    return None if b"\x00" in data[:8192] else data


def grep_files(args: dict) -> dict:
    pattern = _arg(args, "pattern", str, required=True)
    rel = _arg(args, "path", str, ".")
    glob = _arg(args, "glob", str, None)
    ignore_case = _arg(args, "ignore_case", bool, False)
    try:
        regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as err:
        raise ToolError("invalid_regex", f"invalid regular expression: {err}") from None
    real = resolve(rel)
    matches: list[str] = []
    more = False
    for file in _walk_files(real):
        shown = _display(file)
        if glob and not fnmatch.fnmatch(os.path.basename(file), glob) and not fnmatch.fnmatch(shown, glob):
            continue
        data = _read_for_grep(file)
        if data is None:
            continue
        lines = data.decode("utf-8", errors="replace").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for number, line in enumerate(lines, 1):
            line = line.removesuffix("\r")
            if regex.search(line):
                if len(matches) >= limits.GREP_MAX_LINES:
                    more = True
                    break
                matches.append(f"{shown}:{number}:{line[: limits.GREP_LINE_CHARS]}")
        if more:
            break
    output = "\n".join(matches) if matches else "no matches"
    if more:
        output += f"\n[truncated: the search stops at {limits.GREP_MAX_LINES} matching lines; narrow the pattern or path]"
    return {"output": output, "meta": {"matches": len(matches), "truncated": more}}


def _atomic_write(rel: str, real: str, data: bytes, mode: int | None) -> None:
    """Temp file in the same directory, fsync, rename: a reader sees the old or the new file, never a mix."""
    parent, name = os.path.split(real)
    try:
        dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise _os_error(err, rel) from None
    tmp = f".{name}.oa-tmp-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        check_fd(dfd, mutation=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644 if mode is None else mode, dir_fd=dfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if mode is not None:
                os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        tmp = ""
    except OSError as err:
        raise _os_error(err, rel) from None
    finally:
        if tmp:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
        os.close(dfd)


def _existing_mode(real: str) -> int | None:
    try:
        st = os.lstat(real)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode):
        raise ToolError("is_directory", f"{_rel(real)} is a directory")
    return stat.S_IMODE(st.st_mode)


def write_file(args: dict) -> dict:
    with _mutation_lock:
        return _write_file(args)


def edit_file(args: dict) -> dict:
    with _mutation_lock:
        return _edit_file(args)


def _write_file(args: dict) -> dict:
    rel = _arg(args, "path", str, required=True)
    content = _arg(args, "content", str, required=True)
    data = content.encode("utf-8", errors="surrogatepass")
    if len(data) > limits.WRITE_MAX_BYTES:
        raise ToolError("file_too_large", f"content is {len(data)} bytes; write_file takes at most {limits.WRITE_MAX_BYTES}")
    real = resolve(rel, mutation=True)
    mode = _existing_mode(real)
    parent = os.path.dirname(real)
    if not os.path.isdir(parent):
        if os.path.lexists(parent):
            raise ToolError("not_a_directory", f"{_rel(parent)} is not a directory")
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as err:
            raise _os_error(err, rel) from None
        resolve(rel, mutation=True)  # the new directories may not lead anywhere else
    _atomic_write(rel, real, data, mode)
    return {
        "output": f"wrote {len(data)} bytes to {rel}",
        "meta": {"sha256": sha256(data), "bytes": len(data), "created": mode is None},
    }


def _edit_file(args: dict) -> dict:
    rel = _arg(args, "path", str, required=True)
    old = _arg(args, "old_text", str, required=True)
    new = _arg(args, "new_text", str, required=True)
    allow_multiple = _arg(args, "allow_multiple", bool, False)
    expected = _arg(args, "expected_sha256", str, None)
    if old == "":
        raise ToolError("invalid_arguments", "old_text must not be empty; use write_file to create a file")
    real = resolve(rel, mutation=True)
    raw = _read_bytes(rel, real, limits.EDIT_MAX_FILE_BYTES)
    if expected is not None and expected.lower() != sha256(raw):
        raise ToolError("stale_content", f"{rel} changed since it was read (sha256 differs); read it again before editing")
    bom = raw.startswith(BOM)
    body = raw[len(BOM):] if bom else raw
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError("not_a_file", f"{rel} is not UTF-8 text; edit_file edits text only") from None
    crlf = "\r\n" in text
    work = text.replace("\r\n", "\n") if crlf else text
    old_n = old.replace("\r\n", "\n") if crlf else old
    new_n = new.replace("\r\n", "\n") if crlf else new
    count = work.count(old_n)
    if count == 0:
        raise ToolError("edit_no_match", f"old_text was not found in {rel}; read the file and copy the text exactly")
    if count > 1 and not allow_multiple:
        raise ToolError("edit_ambiguous", f"old_text occurs {count} times in {rel}; add context to make it unique or set allow_multiple")
    result = work.replace(old_n, new_n)
    import difflib  # only edits pay for it

    diff = "".join(difflib.unified_diff(work.splitlines(True), result.splitlines(True), f"a/{rel}", f"b/{rel}"))
    if len(diff) > DIFF_MAX_CHARS:
        diff = diff[:DIFF_MAX_CHARS] + "\n[diff truncated]\n"
    if crlf:
        result = result.replace("\n", "\r\n")
    data = (BOM if bom else b"") + result.encode("utf-8", errors="surrogatepass")
    _atomic_write(rel, real, data, _existing_mode(real))
    return {
        "output": f"replaced {count} occurrence{'s' if count != 1 else ''} in {rel}",
        "meta": {"sha256": sha256(data), "replacements": count, "diff": diff, "bom": bom, "crlf": crlf},
    }
