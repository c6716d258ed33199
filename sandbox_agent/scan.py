"""grep_files' reading of one file: one open, one read whose first 8 KiB are the head the binary
check judges and whose whole is the first block searched, and the lines searched a block at a time
by C code (one decode per block, a split, `map(regex.search, lines)`), never a Python step per line.

A block is whole lines (at most GREP_MAX_LINE_BYTES, so no line in it is cut). Before a block is
decoded, the literal every match must contain (search.py's _needle) is looked for in its raw bytes:
a block without it holds no matching line, and only its validity as UTF-8 is asked (for the note).
The lines, their numbers, the flags and the notes are those of a line-by-line reading (one line at a
time: at most GREP_MAX_LINE_BYTES of it searched, the UTF-8 BOM taken off the first, invalid bytes
as U+FFFD, the line break and one carriage return before it taken off); tests/unit/test_grep_equivalence.py
holds the two to each other."""

from __future__ import annotations

import errno
import os
import stat
from itertools import compress  # loaded already, as operator is: re imports them (through functools and collections)
from operator import attrgetter

from . import limits
from .paths import PathRefused, check_fd
from .sniff import BOM, SNIFF_BYTES, _looks_binary, _wide_encoding
from .tools import _display, _os_error

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start 10-25 ms
if TYPE_CHECKING:
    import re
    from typing import Callable, Iterator

READ_BLOCK = 1 << 20  # a read; a block is the whole lines of what was read
_OPEN_FILE = (
    os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
)  # O_NONBLOCK: a FIFO swapped in is not waited on
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_WIDE_FIRST = b"\xff\xfe\x00"  # the first byte of every UTF-16/32 byte-order mark (or none: an empty file)


class FileScan:
    """One text file's matching lines (`matches`); `bad` (a line was not valid UTF-8) and `long` (a
    line was longer than GREP_MAX_LINE_BYTES) say what the lines read so far held: when the search
    stops at its 200th line, they cover the lines up to it, as a line-by-line reading's would."""

    def __init__(self, fd: int | None, data: bytes, eof: bool, lines: list[str] | None = None) -> None:
        self._fd, self._data, self._eof, self._lines = fd, data, eof, lines
        self.bad = self.long = False

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _read(self) -> bytes:
        if self._fd is None:
            return b""
        try:
            return os.read(self._fd, READ_BLOCK)
        except OSError:  # as a line-by-line reading: the lines read so far are the file
            return b""

    def matches(
        self, regex: re.Pattern[str], needle: bytes | None, fold: bool, progress: Callable[[int], None]
    ) -> Iterator[tuple[int, str]]:
        """(line number, text) of each line `regex` finds something in. `needle`: bytes every
        matching line contains (lower case and looked for in the lowered bytes if `fold`).
        `progress(n)` is told the first line number of each block before it is searched."""
        search = regex.search
        if self._lines is not None:  # UTF-16/32 text, decoded whole
            progress(1)
            yield from compress(enumerate(self._lines, 1), map(search, self._lines))
            return
        cap = limits.GREP_MAX_LINE_BYTES
        pending, eof, number = self._data, self._eof, 0
        self._data = b""
        while pending or not eof:
            nl = pending.find(b"\n", 0, cap)
            if nl < 0 and not eof and len(pending) < cap:
                more = self._read()
                if more:
                    pending += more
                else:
                    eof = True
                continue
            if nl < 0 and len(pending) >= cap:  # a line of `cap` bytes or more: its first `cap` are searched
                number += 1
                progress(number)
                self.long = True
                line, bad = _decoded(pending[:cap], number == 1)
                self.bad |= bad
                if search(line):
                    yield number, line
                pending, eof = self._skip_line(pending[cap:], eof)
                continue
            cut = len(pending) if nl < 0 else pending.rfind(b"\n", 0, cap) + 1
            block, pending = pending[:cut], pending[cut:]
            progress(number + 1)
            body = block[len(BOM) :] if number == 0 and block.startswith(BOM) else block
            if needle is not None and needle not in (body.lower() if fold else body):
                if pending or not eof:  # the numbers of the lines after this block (a file's last one needs none)
                    number += body.count(b"\n") + (not block.endswith(b"\n"))
                if not body.isascii() and not _valid(body):
                    self.bad = True
                continue
            try:
                text, bad_line = body.decode("utf-8"), 0
            except UnicodeDecodeError as err:
                text = body.decode("utf-8", errors="replace")
                bad_line = number + body.count(b"\n", 0, err.start) + 1  # the first line that is not UTF-8
            if "\r" in text:
                text = text.replace("\r\n", "\n")  # each line's one carriage return before its break
            lines = text.split("\n")
            if block.endswith(b"\n"):
                lines.pop()
            elif lines[-1].endswith("\r"):  # the last line, without a break
                lines[-1] = lines[-1][:-1]
            for found in compress(enumerate(lines, number + 1), map(search, lines)):
                if bad_line and bad_line <= found[0]:
                    self.bad = True
                yield found
            number += len(lines)
            if bad_line:
                self.bad = True

    def _skip_line(self, rest: bytes, eof: bool) -> tuple[bytes, bool]:
        """Past the end of a long line: what follows its line break, and whether the file ended."""
        while True:
            nl = rest.find(b"\n")
            if nl >= 0:
                return rest[nl + 1 :], eof
            if eof:
                return b"", True
            rest = self._read()
            eof = not rest


def _decoded(piece: bytes, first: bool) -> tuple[str, bool]:
    if first and piece.startswith(BOM):
        piece = piece[len(BOM) :]
    try:
        line, bad = piece.decode("utf-8"), False
    except UnicodeDecodeError:
        line, bad = piece.decode("utf-8", errors="replace"), True
    return line.removesuffix("\r"), bad


def _valid(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def open_scan(path: str, dir_fd: int | None = None) -> tuple[FileScan | None, str | None]:
    """(scan, None) for a text file; (None, why it is skipped) for one that is not searched and is
    named in a note; (None, None) for one that is gone or is no longer a regular file. One open,
    one fstat (the type, and the size that sizes the first read), one read for most files.
    With `dir_fd` (walk_files'), `path` is a name in that directory, opened without following a
    link: nothing can lead it out of the workspace, and no other check is needed."""
    try:
        fd = os.open(path, _OPEN_FILE, dir_fd=dir_fd)
    except PermissionError:
        return None, "unreadable"
    except OSError:
        return None, None  # gone, or swapped for a link since the walk: nothing to search
    try:
        if dir_fd is None:
            check_fd(fd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return None, None
        want = st.st_size + 1
        want = READ_BLOCK if want > READ_BLOCK else SNIFF_BYTES if want < SNIFF_BYTES else want
        data = os.read(fd, want)
        eof = len(data) < want and (len(data) == st.st_size or not data)  # short, at the size fstat gave: the end
        while len(data) < SNIFF_BYTES and not eof:  # the head is the first 8 KiB, however the reads came
            more = os.read(fd, SNIFF_BYTES - len(data))
            data += more
            eof = not more
    except (OSError, PathRefused):
        os.close(fd)
        return None, None
    head = data[:SNIFF_BYTES]
    wide = _wide_encoding(head) if head[:1] in _WIDE_FIRST else None
    if wide:
        if st.st_size > limits.EDIT_MAX_FILE_BYTES:
            os.close(fd)
            return None, "too_large"
        try:
            while len(data) <= limits.EDIT_MAX_FILE_BYTES and not eof:
                more = os.read(fd, limits.EDIT_MAX_FILE_BYTES + 1 - len(data))
                data += more
                eof = not more
        except OSError:
            os.close(fd)
            return None, None
        try:
            text = data[wide[2] : limits.EDIT_MAX_FILE_BYTES + 1].decode(wide[0])
        except UnicodeDecodeError:
            if _looks_binary(head):
                os.close(fd)
                return None, "encoding"
            return FileScan(fd, data, eof), None  # the byte-order mark was only a hint: searched as ordinary text
        os.close(fd)
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        return FileScan(None, b"", True, [line.removesuffix("\r") for line in lines]), None
    if _looks_binary(head):
        os.close(fd)
        return None, "binary"
    return FileScan(fd, data, eof), None


def walk_files(start: str, unreadable: list[str]) -> Iterator[tuple[str, str, int]]:
    """(name, path relative to `start`, the fd of its directory) of each regular file under the
    directory `start`, in listing.py's _walk order (depth first, a directory's files before its
    subdirectories, names in order), the skipped directories not entered, no link followed. Each
    directory is opened once (without following a final link) and checked where it really is
    (paths.check_fd); its files are opened relative to it (open_scan), so a file costs no check
    and no walk of its path. A subdirectory that cannot be opened is named in `unreadable`."""
    stack = [(start, "")]
    while stack:
        current, rel = stack.pop()
        try:
            fd = os.open(current, _OPEN_DIR)
        except OSError as err:
            if current == start:
                raise _os_error(err, _display(current)) from None
            if err.errno in (errno.EACCES, errno.EPERM):
                unreadable.append(_display(current))
            continue  # otherwise gone, or no longer a directory (swapped for a link) since it was listed
        try:
            check_fd(fd)
            with os.scandir(fd) as it:
                items = sorted(it, key=_by_name)
            subdirs = []
            for entry in items:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in limits.LIST_SKIPPED_DIRS:
                        subdirs.append(entry.name)
                elif entry.is_file(follow_symlinks=False):
                    yield entry.name, rel + entry.name, fd
        except PathRefused:
            continue  # swapped for a way out of the workspace since it was listed: nothing in it is searched
        except OSError as err:
            if current == start:
                raise _os_error(err, _display(current)) from None
            unreadable.append(_display(current))
            continue
        finally:
            os.close(fd)
        stack.extend((os.path.join(current, name), f"{rel}{name}/") for name in reversed(subdirs))


_by_name = attrgetter("name")
