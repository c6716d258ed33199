"""The five file tools with the contract's bounds. ``shell`` lives in shell.py."""
from __future__ import annotations

import errno
import json
import os
import re
import signal
import stat
import threading
import time

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
    has_bom = head.startswith(BOM)
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
    if has_bom:
        meta["bom"] = True
        note += "\n" + BOM_NOTE
    if invalid:
        codec, label = _legacy_guess(raw)
        meta["invalid_utf8"] = True
        meta["encoding_guess"] = codec
        note += (f"\n[the file is not valid UTF-8 (its bytes look like {label}): bytes that are not UTF-8 show as U+FFFD; "
                 f"to see them decoded: `iconv -f {codec} -t utf-8 {rel} | head`; edit_file cannot edit it]")
    return {"output": content, "note": note, "meta": meta}


BOM_NOTE = "[the file starts with a UTF-8 byte-order mark (not shown in the output); write_file and edit_file keep it]"


def _legacy_guess(data: bytes) -> tuple[str, str]:
    """Which single-byte encoding a text that is not UTF-8 most likely is, for the note: Cyrillic
    words are runs of high bytes (windows-1251), Western European text has them one by one (an
    accent in a word: windows-1252, a superset of Latin-1's printable range)."""
    runs = lengths = 0
    run = 0
    for b in data[:SNIFF_BYTES * 8]:
        if b >= 0x80:
            run += 1
        elif run:
            runs, lengths, run = runs + 1, lengths + run, 0
    if run:
        runs, lengths = runs + 1, lengths + run
    if runs and lengths / runs >= 2.5:
        return "cp1251", "windows-1251 (Cyrillic)"
    return "cp1252", "windows-1252 / Latin-1 (Western European)"


def _legacy_text(head: bytes) -> bool:
    """Text in a single-byte encoding: its high bytes are mostly letters (0xC0-0xFF in Latin-1 and
    windows-1251 alike) and it has the spaces and line breaks of text. Dense 0x80-0xBF bytes, or
    high bytes with no whitespace between them, are not text."""
    high = sum(1 for b in head if b >= 0x80)
    letters = sum(1 for b in head if b >= 0xC0)
    spaces = sum(1 for b in head if b in b" \t\n\r")
    return letters * 10 >= high * 6 and spaces * 20 >= len(head)


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
    more than 10% suspicious bytes: control bytes, or bytes that are not part of valid UTF-8 unless
    the text reads as a single-byte encoding (windows-1251, Latin-1). A few stray Latin-1 bytes stay
    text (flagged); 128 bytes of 0x80 are not shown as 128 U+FFFD."""
    if not head:
        return False
    if b"\x00" in head or head.startswith(_BINARY_MAGIC):
        return True
    controls = sum(1 for b in head if b < 32 and b not in _TEXT_CONTROLS)
    if controls * 10 > len(head):
        return True
    invalid = sum(1 for ch in head.decode("utf-8", errors="surrogateescape") if "\udc80" <= ch <= "\udcff")
    # A mostly-ASCII file in windows-1251 or Latin-1 is text in another encoding, not binary.
    return (controls + invalid) * 10 > len(head) and not _legacy_text(head)


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
        text, bad = bytes(kept[bom_len:]).decode(codec), ""
    except UnicodeDecodeError as err:
        # The file's fault, not the arguments': shown with replacement, and said.
        text = bytes(kept[bom_len:]).decode(codec, errors="replace")
        bad = f"\n[the file is not valid {label} ({err.reason} at byte {err.start + bom_len}): what cannot be decoded shows as U+FFFD; edit_file cannot edit it]"
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
    note = f"[file {rel}: lines {offset}-{end} of {total}; decoded from {label} (it has a byte-order mark; write_file and edit_file keep it and the encoding); sha256 {hexdigest}]"
    if truncated:
        note += f"\n[truncated: read on from line {end + 1} with offset={end + 1}]"
    meta = {"sha256": hexdigest, "total_lines": total, "first_line": offset, "last_line": end, "truncated": truncated,
            "next_offset": end + 1 if truncated else None, "bytes": used, "encoding": codec, "bom": True}
    if bad:
        note += bad
        meta["invalid_encoding"] = True
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


def grep_files(args: dict) -> dict:
    """The regex search runs in a forked child with a deadline (GREP_TIMEOUT_S): a pattern that
    backtracks catastrophically is killed and answered as a typed timeout, with what was found so
    far, instead of holding the call until the host's deadline replaces the box."""
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
    root = local(real)
    notes: list[str] = []
    if not os.path.isdir(root):
        _refuse_trailing_slash(rel, real)
        notes += _explicit_file_problem(rel, root)
    if not _may_backtrack(pattern, regex.flags):
        return _search(regex, real, root, matcher, notes, _InProcess())
    return _run_search(lambda child: _search(regex, real, root, matcher, notes, child), limits.GREP_TIMEOUT_S)


_RISKY_OPS = frozenset({"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT", "GROUPREF", "GROUPREF_EXISTS"})


def _may_backtrack(pattern: str, flags: int) -> bool:
    """Whether a pattern's run time can grow faster than the line times the pattern: any repetition
    (nested or adjacent ones backtrack exponentially or polynomially, and even one `.*x` is
    quadratic on an 8 MiB line) or a backreference. Only those pay for the forked child with its
    deadline (a fork costs tens of milliseconds here); a literal, a class or an alternation of
    them is searched in the agent, as fast as before."""
    try:
        from re import _parser  # type: ignore[attr-defined]  # CPython's own parser of the pattern
    except ImportError:
        return True
    try:
        stack: list = [_parser.parse(pattern, flags)]
    except Exception:  # noqa: BLE001 - compiled already; whatever the parser says, be careful
        return True
    while stack:
        item = stack.pop()
        if isinstance(item, _parser.SubPattern):
            stack.extend(item.data)
        elif isinstance(item, (list, tuple)):
            if item and str(item[0]) in _RISKY_OPS:
                return True
            stack.extend(item)
    return False


class _InProcess:
    """The search's reporting when it runs in the agent itself: nothing to report to."""

    def send(self, message: dict) -> None:
        pass

    def at(self, shown: str) -> None:
        pass


class _Child:
    """What the search child tells its parent while it runs: each match as it is found (a pipe),
    and the file it is in (shared memory, no system call per file)."""

    def __init__(self, fd: int, shared) -> None:
        self.fd, self.shared = fd, shared

    def send(self, message: dict) -> None:
        data = memoryview(json.dumps(message).encode() + b"\n")
        while data:
            data = data[os.write(self.fd, data):]

    def at(self, shown: str) -> None:
        data = shown.encode("utf-8", errors="surrogateescape")[:PROGRESS_BYTES - 4]
        self.shared[4:4 + len(data)] = data
        self.shared[0:4] = len(data).to_bytes(4, "little")


PROGRESS_BYTES = 4096


class _Relayed:
    """A typed failure of the search child, raised again in the agent (its type was checked where
    the child raised it)."""

    def __init__(self, type: str, message: str) -> None:
        self.kind, self.message = type, message


def _run_search(search, timeout_s: float) -> dict:
    import mmap
    import select

    shared = mmap.mmap(-1, PROGRESS_BYTES)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: search, answer, exit; never return into the agent's threads
        code = 0
        try:
            os.close(r)
            _child_setup(w)
            try:
                payload: dict = {"done": search(_Child(w, shared))}
            except (ToolError, PathRefused) as err:
                payload = {"error": {"type": err.kind, "message": str(err)}}
            except MemoryError:
                payload = {"error": {"type": "resource_exhausted", "message": "the search ran out of memory"}}
            except BaseException as err:  # noqa: BLE001 - reported, typed, by the parent
                payload = {"error": {"type": "internal_error", "message": f"{type(err).__name__}: {err}"}}
            _Child(w, shared).send(payload)
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    data = bytearray()
    deadline = time.monotonic() + timeout_s
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if not select.select([r], [], [], left)[0]:
                continue
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            data += chunk
    finally:
        if timed_out:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # reaped by the shell's clean-up (PID 1 reaps every orphan)
            pass
        os.close(r)
    messages = [json.loads(line) for line in bytes(data).split(b"\n") if line]
    for message in messages:
        if "done" in message:
            shared.close()
            return message["done"]
        if "error" in message:
            shared.close()
            relayed = _Relayed(**message["error"])
            raise ToolError(relayed.kind, relayed.message)
    found = [m["m"] for m in messages if "m" in m]
    where = bytes(shared[4:4 + int.from_bytes(shared[0:4], "little")]).decode("utf-8", errors="replace")
    shared.close()
    if not timed_out:
        raise ToolError("io_error", "the search process ended before it answered (killed from outside?); run it again")
    shown = f" while searching {where}" if where else ""
    raise ToolError("timeout", f"the search passed its {timeout_s:.0f}s limit{shown} and was stopped; {len(found)} matching "
                    "line(s) found before that are in the output. A pattern with nested or adjacent quantifiers (like (a+)+ "
                    "or (a|a)*) can backtrack catastrophically: simplify it, or narrow the path or glob",
                    output="\n".join(found), meta={"matches": len(found), "timed_out": True, "searching": where})


def _child_setup(keep: int) -> None:
    """The forked child holds none of the agent's descriptors but its pipe (a running command's
    pipes would otherwise stay open until it exits) and none of its signal handling."""
    from . import paths

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (ValueError, OSError):
            pass
    try:
        signal.set_wakeup_fd(-1)
    except (ValueError, OSError):
        pass
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = []
    for fd in fds:
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass
    paths._proc_fd = None


SKIP_SHOWN = 10
_SKIP_WHY = {
    "unreadable": "unreadable (permission denied)",
    "binary": "binary",
    "encoding": "not valid in the encoding their byte-order mark names",
    "too_large": f"UTF-16/32 text larger than {limits.EDIT_MAX_FILE_BYTES} bytes",
}


def _search(regex, real: str, root: str, matcher, notes: list[str], child: _Child | _InProcess) -> dict:
    matches: list[str] = []
    unreadable: list[str] = []
    skipped: dict[str, list[str]] = {kind: [] for kind in _SKIP_WHY}
    not_utf8: list[str] = []
    long_lines: list[str] = []
    cut = 0
    more = False
    for file in _walk_files(real, unreadable):
        shown = _display(file)
        if matcher and not matcher(shown, os.path.relpath(file, root) if file != root else os.path.basename(file)):
            continue
        child.at(shown)
        lines, why = _grep_lines(file)
        if why:
            skipped[why].append(shown)
            continue
        bad = long = False
        for number, line, flags in lines:
            bad |= flags & 1
            long |= flags & 2
            if regex.search(line):
                if len(matches) >= limits.GREP_MAX_LINES:
                    more = True
                    break
                if len(line) > limits.GREP_LINE_CHARS:
                    cut += 1
                    line = line[: limits.GREP_LINE_CHARS] + f"… [line cut: {len(line)} characters]"
                matches.append(f"{shown}:{number}:{line}")
                child.send({"m": matches[-1]})
        if bad:
            not_utf8.append(shown)
        if long:
            long_lines.append(shown)
        if more:
            break
    output = "\n".join(matches) if matches else "no matches"
    if more:
        output += f"\n[truncated: the search stops at {limits.GREP_MAX_LINES} matching lines; narrow the pattern or path]"
    if unreadable:
        notes.append(_skipped_note(unreadable))
    for kind, files in skipped.items():
        if files:
            notes.append(f"[not searched: {_counted(files, 'file')} {_SKIP_WHY[kind]}: {_names(files)}]")
    if not_utf8:
        notes.append(f"[{_counted(not_utf8, 'file')} not valid UTF-8 and searched with the invalid bytes as U+FFFD "
                     f"(non-ASCII text there may not match): {_names(not_utf8)}]")
    if long_lines:
        notes.append(f"[only the first {limits.GREP_MAX_LINE_BYTES} bytes of lines longer than that were searched, in: {_names(long_lines)}]")
    if cut:
        notes.append(f"[{cut} matching line{'s were' if cut != 1 else ' was'} longer than {limits.GREP_LINE_CHARS} characters and cut; read_file shows them whole]")
    counts = {kind: len(files) for kind, files in skipped.items() if files}
    return {"output": output, "note": "\n".join(notes),
            "meta": {"matches": len(matches), "truncated": more, "lines_cut": cut, "unreadable": unreadable[:50],
                     "skipped": counts, "skipped_files": [f for files in skipped.values() for f in files][:50]}}


def _counted(items: list, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _names(items: list[str]) -> str:
    return ", ".join(items[:SKIP_SHOWN]) + (f" and {len(items) - SKIP_SHOWN} more" if len(items) > SKIP_SHOWN else "")


def _grep_lines(path: str):
    """(lines, None) or (None, why it is skipped). Lines are (number, text, flags): 1 = not valid
    UTF-8, 2 = cut at GREP_MAX_LINE_BYTES. The file is streamed: no size makes it unsearchable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except PermissionError:
        return None, "unreadable"
    except OSError:
        return (), None  # gone, or swapped for a link since the walk: nothing to search
    try:
        check_fd(fd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return (), None
        head = os.pread(fd, SNIFF_BYTES, 0)
    except (OSError, PathRefused):
        os.close(fd)
        return (), None
    wide = _wide_encoding(head)
    if wide:
        try:
            if st.st_size > limits.EDIT_MAX_FILE_BYTES:
                return None, "too_large"
            with os.fdopen(os.dup(fd), "rb") as fh:
                raw = fh.read(limits.EDIT_MAX_FILE_BYTES + 1)
            text = raw[wide[2]:].decode(wide[0])
        except UnicodeDecodeError:
            return None, "encoding"
        except OSError:
            return (), None
        finally:
            os.close(fd)
        return ((n, line.removesuffix("\r"), 0) for n, line in enumerate(text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"), 1)), None
    if _looks_binary(head):
        os.close(fd)
        return None, "binary"
    return _stream_lines(fd), None


def _stream_lines(fd: int):
    cap = limits.GREP_MAX_LINE_BYTES
    number = 0
    try:
        with os.fdopen(fd, "rb") as fh:
            while piece := fh.readline(cap):
                number += 1
                flags = 0
                if not piece.endswith(b"\n") and len(piece) >= cap:
                    flags |= 2
                    while (rest := fh.readline(cap)) and not rest.endswith(b"\n"):
                        pass
                if number == 1 and piece.startswith(BOM):
                    piece = piece[len(BOM):]
                try:
                    line = piece.decode("utf-8")
                except UnicodeDecodeError:
                    line = piece.decode("utf-8", errors="replace")
                    flags |= 1
                yield number, line.removesuffix("\n").removesuffix("\r"), flags
    except OSError:
        return


def _explicit_file_problem(rel: str, path: str) -> list[str]:
    """A file the model named is not passed over in silence: unreadable is permission_denied (as
    read_file says), a special file gets a note instead of a bare 'no matches' (a binary one is
    named by the search's own note)."""
    try:
        st = os.lstat(path)
    except OSError as err:
        raise _os_error(err, rel) from None
    if not stat.S_ISREG(st.st_mode):
        return [f"[{rel} is a {_file_type(st.st_mode)}, not a regular file; it was not searched]"]
    if not os.access(path, os.R_OK):
        raise ToolError("permission_denied", f"{rel}: permission denied")
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


def _find_line_ending_blind(text: str, old: str) -> tuple[list[re.Match], int]:
    """(non-overlapping occurrences, occurrences counted at every position) of `old`, where each of
    its line breaks matches LF or CRLF: the model copies text with \n whatever the file uses, and
    mixed files have both. "aa" in "aaa" is there twice (overlapping): that is ambiguous."""
    pieces = old.replace("\r\n", "\n").split("\n")
    pattern = "\r?\n".join(re.escape(p) for p in pieces)
    matches = list(re.finditer(pattern, text))
    if not matches or not _self_overlaps(old):
        return matches, len(matches)
    return matches, sum(1 for _ in re.finditer(f"(?=(?:{pattern}))", text))


def _self_overlaps(old: str) -> bool:
    """Whether two occurrences of `old` can overlap: some proper prefix is also a suffix (its KMP
    border); ignoring line endings, as the search does."""
    s = old.replace("\r\n", "\n")
    border = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = border[k - 1]
        if s[i] == s[k]:
            k += 1
        border[i] = k
    return bool(s) and border[-1] > 0


ALIGN_MAX_LINES = 5000  # past this (old or new), a mixed-ending match maps line breaks by position


def _replace_keeping_endings(text: str, matches: list[re.Match], new: str) -> str:
    """Every line outside the matches keeps its own ending byte for byte. Inside a match, a line of
    the replacement that is a line of the old text (unchanged context) keeps that line's ending; a
    changed line takes the ending of the line it replaces, an added one that of its neighbour
    (for a match within one line, that line's ending; at the end of the file, the file's usual one).
    In a file with both LF and CRLF, inserting a line must not move endings onto untouched lines."""
    usual = "\r\n" if text.count("\r\n") * 2 > text.count("\n") else "\n"
    new_lines = new.replace("\r\n", "\n").split("\n")
    out, last = [], 0
    for m in matches:
        old_lines = re.split("\r?\n", m.group(0))
        breaks = re.findall("\r?\n", m.group(0))
        after = text.find("\n", m.end())
        breaks.append(("\r\n" if after > 0 and text[after - 1] == "\r" else "\n") if after >= 0 else usual)
        out.append(text[last:m.start()])
        chosen = _endings_for(old_lines, breaks, new_lines)
        for j, line in enumerate(new_lines):
            out.append(line if j == len(new_lines) - 1 else line + chosen[j])
        last = m.end()
    out.append(text[last:])
    return "".join(out)


def _endings_for(old_lines: list[str], breaks: list[str], new_lines: list[str]) -> list[str]:
    """The ending of each new line: `breaks[i]` ends old line i (the last, the file's line the match
    ends in)."""
    if len(set(breaks)) == 1 or len(old_lines) > ALIGN_MAX_LINES or len(new_lines) > ALIGN_MAX_LINES:
        return [breaks[min(j, len(breaks) - 1)] for j in range(len(new_lines))]
    import difflib  # only a mixed-ending edit pays for it

    chosen = [breaks[0]] * len(new_lines)
    opcodes = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False).get_opcodes()
    for tag, i1, i2, j1, j2 in opcodes:
        for j in range(j1, j2):
            if tag in ("equal", "replace"):
                chosen[j] = breaks[min(i1 + (j - j1), i2 - 1)]
            elif tag == "insert":
                chosen[j] = breaks[i1 - 1] if i1 > 0 else breaks[0]
    return chosen


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
    kept = _kept_mark(real) if mode is not None else None
    note = ""
    if kept:
        mark, codec, label = kept
        text = content.removeprefix("\ufeff")
        data = mark + text.encode(codec, errors="surrogatepass")
        note = f"[the file had a {label} byte-order mark: kept" + (f", and the text written as {label}]" if codec != "utf-8" else "]")
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
    meta = {"sha256": sha256(data), "bytes": len(data), "created": mode is None, "atomic": atomic}
    if kept:
        meta["bom"] = True
        meta["encoding"] = kept[1]
    return {
        "output": f"wrote {len(data)} bytes to {rel}",
        "note": "\n".join(n for n in (note, "" if atomic else IN_PLACE_NOTE) if n),
        "meta": meta,
    }


def _kept_mark(real: str) -> tuple[bytes, str, str] | None:
    """The byte-order mark of the file a write replaces: (mark, codec, label), or None. A C# or
    PowerShell file keeps its mark (and UTF-16/32 its encoding) when the model writes it whole."""
    try:
        fd = os.open(local(real), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        check_fd(fd)
        head = os.pread(fd, 4, 0)
    except (OSError, PathRefused):
        return None
    finally:
        os.close(fd)
    wide = _wide_encoding(head)
    if wide:
        return head[:wide[2]], wide[0], wide[1]
    return (BOM, "utf-8", "UTF-8") if head.startswith(BOM) else None


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
    matches, occurrences = _find_line_ending_blind(text, old)
    count = len(matches)
    if count == 0:
        raise ToolError("edit_no_match", f"old_text was not found in {rel}{_closest_hint(text, old)}")
    if occurrences > count:
        where = _line_numbers(text, matches)
        raise ToolError("edit_ambiguous", f"old_text occurs {occurrences} times in {rel}, overlapping (at line {where}): which one to replace "
                        "is ambiguous; add context to make it unique")
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
            raise ToolError("encoding_error", f"{rel} starts with a {label} byte-order mark but is not valid {label}; it is not edited") from None
    mark = BOM if raw.startswith(BOM) else b""
    try:
        return raw[len(mark):].decode("utf-8"), mark, "utf-8"
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise ToolError("encoding_error", f"{rel} is not UTF-8 text (invalid byte at line {line}); edit_file edits UTF-8 (or UTF-16/32 with a byte-order mark) only; "
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
