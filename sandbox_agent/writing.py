"""write_file and edit_file: one at a time, atomic where the directory allows it, keeping a file's
byte-order mark, encoding and mode."""

from __future__ import annotations

import os
import stat
import threading

from . import limits
from .edit_text import _closest_hint, _find_line_ending_blind, _line_numbers, _replace_keeping_endings
from .paths import PathRefused, check_fd, local, resolve
from .sniff import BOM, SNIFF_BYTES, _wide_encoding
from .tools import ToolError, _arg, _file_type, _os_error, _path_arg, _read_bytes, _refuse_trailing_slash, _rel, sha256

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start 10-25 ms
if TYPE_CHECKING:
    from typing import Any


DIFF_MAX_CHARS = 256 * 1024
# Writes and edits are read-modify-write: one at a time, so two concurrent edits never lose one.
_mutation_lock = threading.Lock()


def write_file(args: dict[str, Any]) -> dict[str, Any]:
    with _mutation_lock:
        return _write_file(args)


def edit_file(args: dict[str, Any]) -> dict[str, Any]:
    with _mutation_lock:
        return _edit_file(args)


def _write_file(args: dict[str, Any]) -> dict[str, Any]:
    rel = _path_arg(args)
    content = _arg(args, "content", str, required=True)
    data = content.encode("utf-8", errors="surrogatepass")
    if len(data) > limits.WRITE_MAX_BYTES:
        raise ToolError(
            "file_too_large", f"content is {len(data)} bytes; write_file takes at most {limits.WRITE_MAX_BYTES}"
        )
    real = resolve(rel, mutation=True)
    _refuse_trailing_slash(rel, real, creating=True)
    mode = _existing_mode(real)
    kept = _kept_mark(real) if mode is not None else None
    note = ""
    if kept:
        mark, codec, label = kept
        text = content.removeprefix("\ufeff")
        data = mark + text.encode(codec, errors="surrogatepass")
        note = f"[the file had a {label} byte-order mark: kept" + (
            f", and the text written as {label}]" if codec != "utf-8" else "]"
        )
    make_parent(rel, real)
    atomic = _atomic_write(rel, real, data, mode)
    meta = {"sha256": sha256(data), "bytes": len(data), "created": mode is None, "atomic": atomic}
    if kept:
        meta["bom"] = True
        meta["encoding"] = kept[1]
    return {
        "output": f"wrote {len(data)} bytes to {rel}",
        "note": "\n".join(n for n in (note, "" if atomic else IN_PLACE_NOTE) if n),
        "meta": meta,
    }


def make_parent(rel: str, real: str) -> None:
    """The directories a new file's path names, made where missing (write_file, write_bytes)."""
    parent = os.path.dirname(real)
    if not os.path.isdir(parent):
        if os.path.lexists(parent):
            raise ToolError("not_a_directory", f"{_rel(parent)} is not a directory")
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as err:
            raise _os_error(err, rel) from None
        resolve(rel, mutation=True)  # the new directories may not lead anywhere else


def _kept_mark(real: str) -> tuple[bytes, str, str] | None:
    """The byte-order mark of the file a write replaces: (mark, codec, label), or None. A C# or
    PowerShell file keeps its mark (and UTF-16/32 its encoding) when the model writes it whole."""
    try:
        fd = os.open(local(real), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        check_fd(fd)
        head = os.pread(fd, SNIFF_BYTES, 0)
        whole = os.fstat(fd).st_size <= len(head)
    except (OSError, PathRefused):
        return None
    finally:
        os.close(fd)
    wide = _wide_encoding(head, whole)  # a mark over a body that is not its encoding was only a hint: not kept
    if wide:
        return head[: wide[2]], wide[0], wide[1]
    return (BOM, "utf-8", "UTF-8") if head.startswith(BOM) else None


IN_PLACE_NOTE = "[the directory is read-only, so the file was rewritten in place rather than replaced atomically]"


def _edit_file(args: dict[str, Any]) -> dict[str, Any]:
    rel = _path_arg(args)
    old = _arg(args, "old_text", str, required=True)
    new = _arg(args, "new_text", str, required=True)
    allow_multiple = _arg(args, "allow_multiple", bool, False)
    expected = _arg(args, "expected_sha256", str, None)
    if old == "":
        raise ToolError("invalid_arguments", "old_text must not be empty; use write_file to create a file")
    if old == new:
        raise ToolError(
            "invalid_arguments", "old_text and new_text are the same; nothing would change (the file was not written)"
        )
    real = resolve(rel, mutation=True)
    _refuse_trailing_slash(rel, real)
    raw = _read_bytes(rel, real, limits.EDIT_MAX_FILE_BYTES)
    mode = _existing_mode(real)
    if expected is not None and expected.lower() != sha256(raw):
        raise ToolError(
            "stale_content", f"{rel} changed since it was read (sha256 differs); read it again before editing"
        )
    text, mark, codec = _decode_for_edit(rel, raw)
    bom = bool(mark)
    crlf = "\r\n" in text
    matches, occurrences = _find_line_ending_blind(text, old)
    count = len(matches)
    if count == 0:
        raise ToolError("edit_no_match", f"old_text was not found in {rel}{_closest_hint(text, old)}")
    if occurrences > count:
        where = _line_numbers(text, matches)
        raise ToolError(
            "edit_ambiguous",
            f"old_text occurs {occurrences} times in {rel}, overlapping (at line {where}): which one to replace "
            "is ambiguous; add context to make it unique",
        )
    if count > 1 and not allow_multiple:
        where = _line_numbers(text, matches)
        raise ToolError(
            "edit_ambiguous",
            f"old_text occurs {count} times in {rel} (at lines {where}); "
            "add context to make it unique or set allow_multiple",
        )
    result = _replace_keeping_endings(text, matches, new)
    import difflib  # only edits pay for it

    # Both sides with their real line endings: a changed ending shows in the diff, as it should.
    diff = "".join(difflib.unified_diff(text.splitlines(True), result.splitlines(True), f"a/{rel}", f"b/{rel}"))
    if len(diff) > DIFF_MAX_CHARS:
        diff = diff[:DIFF_MAX_CHARS] + "\n[diff truncated]\n"
    data = mark + result.encode(codec, errors="surrogatepass")
    atomic = _atomic_write(rel, real, data, mode)
    meta = {"sha256": sha256(data), "replacements": count, "diff": diff, "bom": bom, "crlf": crlf, "atomic": atomic}
    if codec != "utf-8":
        meta["encoding"] = codec
    return {
        "output": f"replaced {count} occurrence{'s' if count != 1 else ''} in {rel}",
        "note": "" if atomic else IN_PLACE_NOTE,
        "meta": meta,
    }


def _decode_for_edit(rel: str, raw: bytes) -> tuple[str, bytes, str]:
    """(text, byte-order mark, codec). UTF-8, with or without its mark; UTF-16/32 only with one (what
    read_file decodes, the model may edit, and the file keeps its encoding and mark)."""
    wide = _wide_encoding(raw[:4])
    if wide:
        codec, label, bom_len = wide
        try:
            return raw[bom_len:].decode(codec), raw[:bom_len], codec
        except UnicodeDecodeError:
            raise ToolError(
                "encoding_error",
                f"{rel} starts with a {label} byte-order mark but is not valid {label}; it is not edited",
            ) from None
    mark = BOM if raw.startswith(BOM) else b""
    try:
        return raw[len(mark) :].decode("utf-8"), mark, "utf-8"
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise ToolError(
            "encoding_error",
            f"{rel} is not UTF-8 text (invalid byte at line {line}); edit_file edits UTF-8 (or "
            "UTF-16/32 with a byte-order mark) only; use write_file or the shell for other encodings",
        ) from None


def _atomic_write(rel: str, real: str, data: bytes, mode: int | None) -> bool:
    """Temp file in the same directory, fsync, rename: a reader sees the old or the new file, never a mix.
    A writable file in a directory that refuses new entries is rewritten in place, as a plain write
    (an editor, `>`) would do it; that is not atomic, and the return value (False) says so."""
    parent, name = os.path.split(real)
    try:
        dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise _os_error(err, rel) from None
    tmp = f".{name}.oa-tmp-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        check_fd(dfd, mutation=True)
        try:
            fd = os.open(
                tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o644 if mode is None else mode,
                dir_fd=dfd,
            )
        except PermissionError:
            tmp = ""
            if mode is None:  # a new file where the directory refuses one: as a plain write, refused
                raise
            _write_in_place(rel, name, dfd, data)
            return False
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if mode is not None:
                os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        tmp = ""
        return True
    except OSError as err:
        raise _os_error(err, rel) from None
    finally:
        if tmp:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
        os.close(dfd)


def _write_in_place(rel: str, name: str, dfd: int, data: bytes) -> None:
    """Overwrite the existing file through its own fd: no link followed, re-checked where it is,
    written before it is truncated to size."""
    fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
    try:
        check_fd(fd, mutation=True)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ToolError("not_regular_file", f"{rel} is not a regular file; it is not replaced")
        view, pos = memoryview(data), 0
        while pos < len(data):
            pos += os.pwrite(fd, view[pos:], pos)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


def _existing_mode(real: str) -> int | None:
    """The mode a replacement keeps, after the checks a plain write would make: the atomic rename
    must not go around a file's own permissions (a 0444 file stays unwritable, as with `>`)."""
    try:
        st = os.lstat(real)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise _os_error(err, _rel(real)) from None
    if stat.S_ISDIR(st.st_mode):
        raise ToolError("is_directory", f"{_rel(real)} is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise ToolError(
            "not_regular_file", f"{_rel(real)} is a {_file_type(st.st_mode)}, not a regular file; it is not replaced"
        )
    if not os.access(real, os.W_OK, follow_symlinks=False):
        raise ToolError(
            "permission_denied", f"{_rel(real)} is read-only (mode {stat.S_IMODE(st.st_mode):04o}); it is not replaced"
        )
    return stat.S_IMODE(st.st_mode)
