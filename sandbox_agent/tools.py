"""The five file tools with the contract's bounds. ``shell`` lives in shell.py."""
from __future__ import annotations

import errno
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
    from _sha256 import sha256 as _sha256  # type: ignore[import-not-found]  # CPython's private module: no stubs
except ImportError:
    try:
        from _sha2 import sha256 as _sha256  # type: ignore[import-not-found]  # the same, renamed in 3.12
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
        _refuse_special(rel, real)  # gVisor refuses to open a host FIFO (EACCES): say what it is
        raise _os_error(err, rel) from None
    try:
        check_fd(fd)
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ToolError("is_directory", f"{rel} is a directory; use list_files")
        if not stat.S_ISREG(st.st_mode):
            raise ToolError("not_regular_file", f"{rel} is a {_file_type(st.st_mode)}, not a regular file; only regular files are read")
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
        raise ToolError("not_regular_file", f"{rel} is a {_file_type(mode)}, not a regular file; only regular files are read")


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


def _refuse_trailing_slash(rel: str, real: str, creating: bool = False) -> None:
    """'f.txt/' names a directory: POSIX refuses it (ENOTDIR for a file, EISDIR to create one), but the
    path check normalises the slash away, so a write to 'newdir/' would make a file called newdir."""
    if not rel.endswith("/") or os.path.isdir(real):
        return
    if os.path.lexists(real):
        raise ToolError("not_a_directory", f"{rel}: {rel.rstrip('/')} is not a directory (drop the trailing '/')")
    if creating:
        raise ToolError("is_directory", f"{rel} ends with '/', so it names a directory; write_file writes a file: drop the '/'")


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
    real = resolve(rel)
    _refuse_trailing_slash(rel, real)
    fd = _open_regular(rel, real)
    try:
        head = os.pread(fd, SNIFF_BYTES, 0)
        size_on_disk = os.fstat(fd).st_size
    except OSError as err:
        os.close(fd)
        raise _os_error(err, rel) from None
    encoding = _wide_encoding(head)
    if encoding or _looks_binary(head):
        return _read_special(rel, fd, encoding, size_on_disk, offset, limit)
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
    raw = b"".join(collected)
    if b"\x00" in raw:  # past the 8 KiB sniff: still binary, still not for the model's context
        nul_line = offset + raw[:raw.index(b"\x00")].count(b"\n")
        return _binary_result(rel, size_on_disk, digest.hexdigest(), f"a NUL byte at line {nul_line}")
    try:
        content = raw.decode("utf-8")
        invalid = False
    except UnicodeDecodeError as err:
        # A cut line may end inside a character: that is ours, not the file's.
        invalid = not (cut_line and err.start >= len(raw) - 3)
        content = raw.decode("utf-8", errors="replace" if invalid else "ignore")
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
    if invalid:
        meta["invalid_utf8"] = True
        note += "\n[the file is not valid UTF-8: bytes that are not show as U+FFFD; edit_file cannot edit it]"
    return {"output": content, "note": note, "meta": meta}


SNIFF_BYTES = 8192
_WIDE_BOMS = (  # longest first: the UTF-32 LE mark starts with the UTF-16 LE one
    (b"\xff\xfe\x00\x00", "utf-32-le", "UTF-32 LE"),
    (b"\x00\x00\xfe\xff", "utf-32-be", "UTF-32 BE"),
    (b"\xff\xfe", "utf-16-le", "UTF-16 LE"),
    (b"\xfe\xff", "utf-16-be", "UTF-16 BE"),
)
_BINARY_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"%PDF-", b"PK\x03\x04", b"\x7fELF", b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")
_TEXT_CONTROLS = frozenset(b"\t\n\r\f\b\x1b")


def _wide_encoding(head: bytes) -> tuple[str, str, int] | None:
    for bom, codec, label in _WIDE_BOMS:
        if head.startswith(bom):
            return codec, label, len(bom)
    return None


def _looks_binary(head: bytes) -> bool:
    """As git and Gemini CLI (its isbinaryfile) judge it: a NUL byte, a known binary format's magic, or
    more than 10% suspicious bytes: control bytes, or bytes that are not part of valid UTF-8. A few
    stray Latin-1 bytes stay text (flagged); 128 bytes of 0x80 are not shown as 128 U+FFFD."""
    if not head:
        return False
    if b"\x00" in head or head.startswith(_BINARY_MAGIC):
        return True
    controls = sum(1 for b in head if b < 32 and b not in _TEXT_CONTROLS)
    invalid = sum(1 for ch in head.decode("utf-8", errors="surrogateescape") if "\udc80" <= ch <= "\udcff")
    return (controls + invalid) * 10 > len(head)


def _binary_result(rel: str, size: int, hexdigest: str, why: str = "") -> dict:
    return {"output": f"[binary file {rel}: {size} bytes, sha256 {hexdigest}; not shown]",
            "note": (f"[{why}] " if why else "") + "[binary content (or text in an encoding other than UTF-8) is not shown; use "
                    "shell tools to inspect it, e.g. `file`, `od -c | head`, or `iconv -f latin1 -t utf-8 FILE | head`]",
            "meta": {"sha256": hexdigest, "bytes": size, "binary": True, "total_lines": 0, "truncated": False}}


def _read_special(rel: str, fd: int, encoding: tuple[str, str, int] | None, size: int, offset: int, limit: int) -> dict:
    """A binary file is described, never shown (garbage in the model's context helps nobody);
    UTF-16/32 text is decoded, so the model reads the text and not every other byte as NUL."""
    digest = _sha256()
    kept = bytearray()
    cap = limits.EDIT_MAX_FILE_BYTES
    try:
        with os.fdopen(fd, "rb") as fh:
            while chunk := fh.read(READ_CHUNK):
                digest.update(chunk)
                if encoding and len(kept) <= cap:
                    kept += chunk
    except OSError as err:
        raise _os_error(err, rel) from None
    hexdigest = digest.hexdigest()
    if encoding is None:
        return _binary_result(rel, size, hexdigest)
    codec, label, bom_len = encoding
    if len(kept) > cap:
        raise ToolError("file_too_large", f"{rel} is {label} text of {size} bytes; read_file decodes at most {cap}")
    try:
        text = bytes(kept[bom_len:]).decode(codec)
    except UnicodeDecodeError as err:
        raise ToolError("invalid_arguments", f"{rel} starts with a {label} byte-order mark but is not valid {label}: {err.reason} at byte {err.start}") from None
    lines = text.splitlines(keepends=True)
    total = len(lines)
    if offset > max(total, 1):
        raise ToolError("invalid_arguments", f"offset {offset} is past the end ({total} lines)")
    chosen: list[str] = []
    used = 0
    for line in lines[offset - 1: offset - 1 + limit]:
        encoded = len(line.encode("utf-8", errors="surrogatepass"))
        if used + encoded > limits.READ_CAP_BYTES and chosen:
            break
        chosen.append(line)
        used += encoded
    end = offset - 1 + len(chosen)
    truncated = end < total
    note = f"[file {rel}: lines {offset}-{end} of {total}; decoded from {label}; sha256 {hexdigest}]"
    if truncated:
        note += f"\n[truncated: read on from line {end + 1} with offset={end + 1}]"
    meta = {"sha256": hexdigest, "total_lines": total, "first_line": offset, "last_line": end, "truncated": truncated,
            "next_offset": end + 1 if truncated else None, "bytes": used, "encoding": codec}
    return {"output": "".join(chosen), "note": note, "meta": meta}


def _display(path: str) -> str:
    return _rel(path) if os.path.isabs(path) else os.path.normpath(path)


def _walk(start: str, recursive: bool = True, unreadable: list[str] | None = None, dirs_first: bool = False):
    """(entry, is_dir) under `start`, depth first in name order (with `dirs_first`, a directory's
    subdirectories before its files, as Gemini CLI's ls and `tree --dirsfirst` show them; grep keeps
    plain path order). Skipped directories are neither listed nor entered, and nothing is followed
    through a symlink. The start directory must be readable; a subdirectory that is not is passed
    over and named in `unreadable`."""
    stack = [start]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as it:
                items = sorted(it, key=lambda e: (dirs_first and not e.is_dir(follow_symlinks=False), e.name))
        except OSError as err:
            if current == start:
                raise _os_error(err, _display(current)) from None
            if unreadable is not None:
                unreadable.append(_display(current))
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
    if not os.path.lexists(real):
        raise ToolError("file_not_found", f"{rel}: no such file or directory")
    if not os.path.isdir(real):
        raise ToolError("not_a_directory", f"{rel} is not a directory; use read_file for a file")
    entries: list[str] = []
    unreadable: list[str] = []
    more = False
    for entry, is_dir in _walk(local(real), recursive, unreadable, dirs_first=True):
        if len(entries) >= limits.LIST_MAX_ENTRIES:
            more = True
            break
        path = _display(entry.path)
        entries.append(path + "/" if is_dir else path)
    output = "\n".join(entries)
    if more:
        output += f"\n[truncated: the listing stops at {limits.LIST_MAX_ENTRIES} entries; list a subdirectory to see more]"
    return {"output": output or "(empty directory)", "note": _skipped_note(unreadable),
            "meta": {"entries": len(entries), "truncated": more, "unreadable": unreadable[:50]}}


def _skipped_note(unreadable: list[str]) -> str:
    if not unreadable:
        return ""
    shown = ", ".join(unreadable[:20]) + (f" and {len(unreadable) - 20} more" if len(unreadable) > 20 else "")
    return f"[skipped {len(unreadable)} unreadable director{'y' if len(unreadable) == 1 else 'ies'} (permission denied): {shown}]"


def _walk_files(real: str, unreadable: list[str]):
    """Regular files under `real` (or `real` itself if it is one)."""
    start = local(real)
    if not os.path.isdir(start):
        yield start
        return
    for entry, is_dir in _walk(start, unreadable=unreadable):
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
    matcher = compile_glob(glob) if glob else None
    real = resolve(rel)
    if not os.path.lexists(real):
        raise ToolError("file_not_found", f"{rel}: no such file or directory")
    matches: list[str] = []
    unreadable: list[str] = []
    unread_files = cut = 0
    more = False
    root = local(real)
    notes: list[str] = []
    if not os.path.isdir(root):
        _refuse_trailing_slash(rel, real)
        notes += _explicit_file_problem(rel, root)
    for file in _walk_files(real, unreadable):
        shown = _display(file)
        if matcher and not matcher(shown, os.path.relpath(file, root) if file != root else os.path.basename(file)):
            continue
        data = _read_for_grep(file)
        if data is None:
            unread_files += data is None and not os.access(file, os.R_OK)
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
                if len(line) > limits.GREP_LINE_CHARS:
                    cut += 1
                    line = line[: limits.GREP_LINE_CHARS] + f"… [line cut: {len(line)} characters]"
                matches.append(f"{shown}:{number}:{line}")
        if more:
            break
    output = "\n".join(matches) if matches else "no matches"
    if more:
        output += f"\n[truncated: the search stops at {limits.GREP_MAX_LINES} matching lines; narrow the pattern or path]"
    if unreadable:
        notes.append(_skipped_note(unreadable))
    if unread_files:
        notes.append(f"[skipped {unread_files} unreadable file{'s' if unread_files != 1 else ''} (permission denied)]")
    if cut:
        notes.append(f"[{cut} matching line{'s were' if cut != 1 else ' was'} longer than {limits.GREP_LINE_CHARS} characters and cut; read_file shows them whole]")
    return {"output": output, "note": "\n".join(notes),
            "meta": {"matches": len(matches), "truncated": more, "lines_cut": cut, "unreadable": unreadable[:50]}}


def _explicit_file_problem(rel: str, path: str) -> list[str]:
    """A file the model named is not passed over in silence: unreadable is permission_denied (as
    read_file says), a binary or special file gets a note instead of a bare 'no matches'."""
    try:
        st = os.lstat(path)
    except OSError as err:
        raise _os_error(err, rel) from None
    if not stat.S_ISREG(st.st_mode):
        return [f"[{rel} is a {_file_type(st.st_mode)}, not a regular file; it was not searched]"]
    if not os.access(path, os.R_OK):
        raise ToolError("permission_denied", f"{rel}: permission denied")
    if _read_for_grep(path) is None:
        return [f"[{rel} is a binary file (or larger than {limits.GREP_MAX_FILE_BYTES} bytes); it was not searched]"]
    return []


MAX_GLOB_ALTERNATIVES = 256


def _expand_braces(pattern: str, depth: int = 0) -> list[str]:
    """`*.{ts,tsx}` -> `*.ts`, `*.tsx`, as shells and ripgrep read it; nested braces too, bounded."""
    if depth > 8:
        raise ToolError("invalid_arguments", "the glob nests braces too deeply")
    start = pattern.find("{")
    if start < 0:
        return [pattern]
    level, parts, last = 0, [], start + 1
    for i in range(start, len(pattern)):
        ch = pattern[i]
        if ch == "{":
            level += 1
        elif ch == "}":
            level -= 1
            if level == 0:
                parts.append(pattern[last:i])
                head, tail = pattern[:start], pattern[i + 1:]
                out: list[str] = []
                for part in parts:
                    for expanded in _expand_braces(head + part + tail, depth + 1):
                        out.append(expanded)
                        if len(out) > MAX_GLOB_ALTERNATIVES:
                            raise ToolError("invalid_arguments", f"the glob expands to more than {MAX_GLOB_ALTERNATIVES} patterns")
                return out
        elif ch == "," and level == 1:
            parts.append(pattern[last:i])
            last = i + 1
    raise ToolError("invalid_arguments", f"the glob {pattern!r} has an unclosed '{{'")


def _glob_regex(pattern: str) -> str:
    """`**` crosses directories (and `**/` may match none), `*` and `?` stay within one name."""
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            close = pattern.find("]", i + 2 if pattern[i + 1:i + 2] in ("!", "^") else i + 1)
            if close < 0:
                out.append(re.escape(ch))
            else:
                body = pattern[i + 1:close]
                if body[:1] in ("!", "^"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = close
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


def compile_glob(glob: str):
    """A matcher of (workspace-relative path, path relative to the search root). A pattern without
    '/' matches the file's name anywhere, as ripgrep's --glob and Gemini CLI's include do."""
    if len(glob) > 1000:
        raise ToolError("invalid_arguments", "the glob is longer than 1000 characters")
    regexes = []
    for alternative in _expand_braces(glob):
        try:
            regexes.append((re.compile(_glob_regex(alternative.removeprefix("./")), re.DOTALL), "/" in alternative))
        except re.error as err:
            raise ToolError("invalid_arguments", f"the glob {glob!r} is not valid: {err}") from None

    def matches(shown: str, under_root: str) -> bool:
        name = os.path.basename(shown)
        for regex, has_slash in regexes:
            if has_slash:
                if regex.fullmatch(shown) or regex.fullmatch(under_root):
                    return True
            elif regex.fullmatch(name):
                return True
        return False

    return matches


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
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644 if mode is None else mode, dir_fd=dfd)
        except PermissionError:
            tmp = ""
            if mode is None:  # a new file where the directory refuses one: as a plain write, refused
                raise
            _write_in_place(rel, name, dfd, data)
            return False
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
        raise ToolError("not_regular_file", f"{_rel(real)} is a {_file_type(st.st_mode)}, not a regular file; it is not replaced")
    if not os.access(real, os.W_OK, follow_symlinks=False):
        raise ToolError("permission_denied", f"{_rel(real)} is read-only (mode {stat.S_IMODE(st.st_mode):04o}); it is not replaced")
    return stat.S_IMODE(st.st_mode)


def _find_line_ending_blind(text: str, old: str) -> list[re.Match]:
    """Non-overlapping occurrences of `old` where each of its line breaks matches LF or CRLF: the
    model copies text with \\n whatever the file uses, and mixed files have both."""
    pieces = old.replace("\r\n", "\n").split("\n")
    return list(re.finditer("\r?\n".join(re.escape(p) for p in pieces), text))


def _replace_keeping_endings(text: str, matches: list[re.Match], new: str) -> str:
    """The n-th line break of a replacement takes the ending of the n-th break it replaces (the
    last one for extra lines; for a match within one line, that line's ending; at the end of the
    file, the file's usual one); every line outside the matches keeps its own ending byte for byte."""
    usual = "\r\n" if text.count("\r\n") * 2 > text.count("\n") else "\n"
    new_lines = new.replace("\r\n", "\n").split("\n")
    out, last = [], 0
    for m in matches:
        breaks = re.findall("\r?\n", m.group(0))
        if not breaks:
            after = text.find("\n", m.end())
            breaks = [("\r\n" if after > 0 and text[after - 1] == "\r" else "\n") if after >= 0 else usual]
        out.append(text[last:m.start()])
        for j, line in enumerate(new_lines):
            out.append(line if j == len(new_lines) - 1 else line + breaks[min(j, len(breaks) - 1)])
        last = m.end()
    out.append(text[last:])
    return "".join(out)


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
    _refuse_trailing_slash(rel, real, creating=True)
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
    atomic = _atomic_write(rel, real, data, mode)
    return {
        "output": f"wrote {len(data)} bytes to {rel}",
        "note": "" if atomic else IN_PLACE_NOTE,
        "meta": {"sha256": sha256(data), "bytes": len(data), "created": mode is None, "atomic": atomic},
    }


IN_PLACE_NOTE = "[the directory is read-only, so the file was rewritten in place rather than replaced atomically]"


def _edit_file(args: dict) -> dict:
    rel = _arg(args, "path", str, required=True)
    old = _arg(args, "old_text", str, required=True)
    new = _arg(args, "new_text", str, required=True)
    allow_multiple = _arg(args, "allow_multiple", bool, False)
    expected = _arg(args, "expected_sha256", str, None)
    if old == "":
        raise ToolError("invalid_arguments", "old_text must not be empty; use write_file to create a file")
    if old == new:
        raise ToolError("invalid_arguments", "old_text and new_text are the same; nothing would change (the file was not written)")
    real = resolve(rel, mutation=True)
    _refuse_trailing_slash(rel, real)
    raw = _read_bytes(rel, real, limits.EDIT_MAX_FILE_BYTES)
    mode = _existing_mode(real)
    if expected is not None and expected.lower() != sha256(raw):
        raise ToolError("stale_content", f"{rel} changed since it was read (sha256 differs); read it again before editing")
    text, mark, codec = _decode_for_edit(rel, raw)
    bom = bool(mark)
    crlf = "\r\n" in text
    matches = _find_line_ending_blind(text, old)
    count = len(matches)
    if count == 0:
        raise ToolError("edit_no_match", f"old_text was not found in {rel}{_closest_hint(text, old)}")
    if count > 1 and not allow_multiple:
        where = _line_numbers(text, matches)
        raise ToolError("edit_ambiguous", f"old_text occurs {count} times in {rel} (at lines {where}); add context to make it unique or set allow_multiple")
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
    return {"output": f"replaced {count} occurrence{'s' if count != 1 else ''} in {rel}", "note": "" if atomic else IN_PLACE_NOTE, "meta": meta}


def _decode_for_edit(rel: str, raw: bytes) -> tuple[str, bytes, str]:
    """(text, byte-order mark, codec). UTF-8, with or without its mark; UTF-16/32 only with one (what
    read_file decodes, the model may edit, and the file keeps its encoding and mark)."""
    wide = _wide_encoding(raw[:4])
    if wide:
        codec, label, bom_len = wide
        try:
            return raw[bom_len:].decode(codec), raw[:bom_len], codec
        except UnicodeDecodeError:
            raise ToolError("not_a_file", f"{rel} starts with a {label} byte-order mark but is not valid {label}; it is not edited") from None
    mark = BOM if raw.startswith(BOM) else b""
    try:
        return raw[len(mark):].decode("utf-8"), mark, "utf-8"
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise ToolError("not_a_file", f"{rel} is not UTF-8 text (invalid byte at line {line}); edit_file edits UTF-8 (or UTF-16/32 with a byte-order mark) only; "
                        "use write_file or the shell for other encodings") from None


def _line_numbers(text: str, matches: list[re.Match], most: int = 10) -> str:
    numbers, line, pos = [], 1, 0
    for m in matches[:most]:
        line += text.count("\n", pos, m.start())
        pos = m.start()
        numbers.append(str(line))
    return ", ".join(numbers) + (f" and {len(matches) - most} more" if len(matches) > most else "")


HINT_MAX_LINES = 200_000     # past this a failed edit just says "not found"
HINT_FUZZY_MAX_LINES = 5000  # the similar-line search only on files this long...
HINT_FUZZY_MAX_RATIOS = 1500  # ...and with at most this many full comparisons: a failed edit stays cheap
HINT_SHOWN_CHARS = 200


def _closest_hint(text: str, old: str) -> str:
    """Why old_text did not match, when that can be told cheaply: the same text with other whitespace
    (tabs for spaces, indentation, trailing blanks) or other letter case, else the most similar line.
    The model then fixes its copy instead of guessing; the hint never shows more than one line."""
    plain = [ln.rstrip("\r") for ln in text.split("\n")]
    if len(plain) > HINT_MAX_LINES or len(old) > 64 * 1024:
        return "; read the file and copy the text exactly"
    wanted = [p.rstrip("\r") for p in old.replace("\r\n", "\n").strip("\n").split("\n")]
    squashed = ["".join(w.split()) for w in wanted]
    folded = [w.casefold() for w in wanted]
    span = len(wanted)
    if any(squashed):
        lines_squashed = ["".join(ln.split()) for ln in plain]
        for i in range(len(plain) - span + 1):
            if lines_squashed[i] == squashed[0] and lines_squashed[i:i + span] == squashed:
                return (f"; the same text with different whitespace (tabs, spaces or indentation) is at line {i + 1}: "
                        f"{_shown(plain[i])}; copy it exactly, whitespace included")
        for i in range(len(plain) - span + 1):
            if plain[i].casefold() == folded[0] and [ln.casefold() for ln in plain[i:i + span]] == folded:
                return f"; the same text in different letter case is at line {i + 1}: {_shown(plain[i])}"
    first = max(wanted, key=len).strip()
    if not first or len(plain) > HINT_FUZZY_MAX_LINES:
        return "; read the file and copy the text exactly"
    import difflib  # only a failed edit pays for it

    best, best_ratio, budget = -1, 0.6, HINT_FUZZY_MAX_RATIOS
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(first[:HINT_SHOWN_CHARS * 2])
    for i, candidate in enumerate(plain):
        stripped = candidate.strip()[:HINT_SHOWN_CHARS * 2]
        if not stripped or abs(len(stripped) - len(first)) > max(len(first), 8):
            continue
        matcher.set_seq1(stripped)
        if matcher.real_quick_ratio() <= best_ratio or matcher.quick_ratio() <= best_ratio:
            continue
        budget -= 1
        if budget < 0:
            break
        ratio = matcher.ratio()
        if ratio > best_ratio:
            best, best_ratio = i, ratio
    if best >= 0:
        return f"; the most similar line is line {best + 1}: {_shown(plain[best])}; read the file and copy the text exactly"
    return "; nothing similar is in the file: read it and copy the text exactly"


def _shown(line: str) -> str:
    return repr(line if len(line) <= HINT_SHOWN_CHARS else line[:HINT_SHOWN_CHARS] + "…")
