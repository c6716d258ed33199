"""The diff a person reads before apply: the real workspace against the copy, bounded and escaped.

Every line is the box's text, so it is made visible (ground.text.visible) and bounded: files
over MAX_DIFF_FILE_BYTES or holding a NUL are summarised, a diff whose worst case is large runs in
bounded_diff's child under a deadline, and the lines per file and in all are capped.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from dataclasses import dataclass
from typing import Iterator

from ...boxfs import BoxDir, from_store, open_dir
from ...boxfs.names import git_quoted
from ...errors import OpenAgentsError
from ...ground.text import visible
from ..bounded_diff import bounded_unified_diff, split_lines
from ..copy import CopyManifest
from ..integrity import special_name
from .nofollow import _locate, _parent, _readlink
from .scan import Change, shown

MAX_DIFF_FILE_BYTES = 256 * 1024  # larger files are summarised, never diffed (bounded memory and time)
IN_PROCESS_DIFF_WORK = (
    1_000_000  # old lines x new lines up to which difflib runs here: its worst case stays well under a second
)
DIFF_DEADLINE_S = 2.0  # a larger diff runs in bounded_diff's child, killed after this
MAX_DIFF_BYTES = 1 << 20  # and returns at most this much
MAX_FILE_LINES = 1000  # diff lines shown per file
MAX_TOTAL_LINES = 20000  # diff lines shown in all
MAX_STAT_FILES = 5000  # --stat lines before "and N more"
_LINE = re.compile(r"[^\n]*\n|[^\n]+")


@dataclass
class _Side:
    kind: str  # absent | file | symlink | dir | special | unsafe
    size: int = 0
    mode: int = 0
    text: str | None = None  # decoded content (files within bounds, symlink targets)
    note: str = ""  # why there is no text: "binary file, N bytes", "large file, N bytes"


def _side(root_fd: int, rel: str) -> _Side:
    try:
        where = _locate(root_fd, rel)
    except OSError:
        return _Side("unsafe", note="could not be looked at safely")
    if where.blocker:
        return _Side("unsafe", note=f"{shown(where.blocker)} is {where.blocker_kind}")
    st = where.st
    if st is None:
        return _Side("absent")
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        try:
            target = from_store(_readlink(root_fd, rel)).decode("utf-8", "backslashreplace")
            return _Side("symlink", st.st_size, mode, text=target)
        except OSError:
            return _Side("unsafe", note="the link could not be read")
    if stat.S_ISDIR(st.st_mode):
        return _Side("dir", mode=mode)
    if not stat.S_ISREG(st.st_mode):
        return _Side("special", mode=mode, note=special_name(st.st_mode))
    if st.st_size > MAX_DIFF_FILE_BYTES:
        return _Side("file", st.st_size, mode, note=f"large file, {st.st_size} bytes")
    try:
        parent, leaf = _parent(root_fd, rel)
    except OSError:
        return _Side("unsafe", note="could not be opened safely")
    try:  # capped: the box may still be growing it
        data = BoxDir.at(parent).read(leaf, MAX_DIFF_FILE_BYTES, from_store(rel))[0]
    except OpenAgentsError as err:
        if "cap" in err.message:
            return _Side(
                "file", st.st_size, mode, note=f"large file, {max(st.st_size, MAX_DIFF_FILE_BYTES + 1)}+ bytes"
            )
        return _Side("unsafe", note="could not be opened safely")
    except OSError:
        return _Side("unsafe", note="could not be opened safely")
    finally:
        os.close(parent)
    if b"\0" in data[:8192]:
        return _Side("file", len(data), mode, note=f"binary file, {len(data)} bytes")
    return _Side("file", len(data), mode, text=data.decode("utf-8", errors="replace"))


_GIT_TYPE = {"file": 0o100000, "symlink": 0o120000, "dir": 0o040000}


def _git_mode(side: _Side) -> str:
    return f"{_GIT_TYPE.get(side.kind, 0) | side.mode:06o}"


def _lines(text: str | None) -> list[str]:
    return _LINE.findall(text) if text else []


def _unified(old: _Side, new: _Side, context: int) -> tuple[list[str], str | None]:
    """The diff's body (no ---/+++ header), one item a line without its newline, git's no-newline
    marks included; and why it is missing or cut (None: whole). The text is the box's: a diff
    whose worst case is small runs here, a larger one in bounded_diff's child under a deadline
    (difflib on box-written lines that each recur just under its junk bound takes minutes)."""
    a, b = _lines(old.text), _lines(new.text)
    if len(a) * len(b) <= IN_PROCESS_DIFF_WORK:
        out: list[str] = []
        for line in list(difflib.unified_diff(a, b, n=context))[2:]:
            if line.endswith("\n"):
                out.append(line[:-1])
            else:
                out += [line, "\\ No newline at end of file"]
        return out, None
    result = bounded_unified_diff(
        old.text or "", new.text or "", "a", "b", max_bytes=MAX_DIFF_BYTES, deadline_s=DIFF_DEADLINE_S, context=context
    )
    if result.text is None:
        return [], result.skipped or "not diffed"
    lines = [line[:-1] if line.endswith("\n") else line for line in split_lines(result.text)[2:]]
    return lines, f"cut at {MAX_DIFF_BYTES >> 10} KiB" if result.cut else None


def _hunks(old: _Side, new: _Side, for_git: bool) -> list[str]:
    """Unified diff body lines, each one terminal line (made visible unless `for_git`: then as they
    are, for a patch in JSON), with git's no-newline marks."""
    lines, problem = _unified(old, new, 3)
    out = lines if for_git else [visible(line) for line in lines]
    return out + [f"# diff {problem}"] if problem else out


def _label(side: str, path: str, for_git: bool) -> str:
    """`a/NAME` for a person (shown: one line, escaped), or as git writes it (git_quoted, exact)."""
    return git_quoted(side.encode() + from_store(path)) if for_git else f"{side}{shown(path)}"


def _headers(change: Change, old: _Side, new: _Side, for_git: bool = False) -> list[str]:
    out = [f"diff --git {_label('a/', change.path, for_git)} {_label('b/', change.path, for_git)}"]
    if old.kind == "absent" and new.kind != "absent":
        out.append(f"new file mode {_git_mode(new)}")
    elif new.kind == "absent" and old.kind != "absent":
        out.append(f"deleted file mode {_git_mode(old)}")
    elif (old.kind, old.mode) != (new.kind, new.mode):
        out += [f"old mode {_git_mode(old)}", f"new mode {_git_mode(new)}"]
    for label, side in (("real workspace", old), ("copy", new)):
        if side.kind in ("special", "unsafe"):
            out.append(
                f"# {label}: {side.note} (not carried by apply)" if label == "copy" else f"# {label}: {side.note}"
            )
        elif side.kind == "dir":
            out.append(f"# {label}: a directory")
    if new.kind in ("file", "dir") and new.mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX):
        out.append("# setuid, setgid and sticky bits are never carried by apply")
    if change.box_link and new.kind == "file":
        out.append(f"# a hard link ({change.nlink} names): not carried by apply")
    return out


def _summary(side: _Side) -> str:
    return side.note or ("absent" if side.kind == "absent" else f"{side.size} bytes")


def _body(old: _Side, new: _Side, path: str, for_git: bool = False) -> list[str]:
    """`path` in to_store form."""
    if old.note and old.kind == "file" or new.note and new.kind == "file":
        return [f"# not diffed: a/{shown(path)}: {_summary(old)}; b/{shown(path)}: {_summary(new)}"]
    if old.text is None and new.text is None:
        return []
    tab = "\t" if for_git and b" " in from_store(path) else ""  # as git: a name with a space ends at a tab
    label_a = _label("a/", path, for_git) + tab if old.text is not None else "/dev/null"
    label_b = _label("b/", path, for_git) + tab if new.text is not None else "/dev/null"
    hunks = _hunks(old, new, for_git)
    return [f"--- {label_a}", f"+++ {label_b}", *hunks] if hunks else []


def _counts(old: _Side, new: _Side) -> tuple[int, int] | str | None:
    """(insertions, deletions); None when a side is binary or too large to count; why, when the
    bounded differ gave up."""
    if old.note and old.kind == "file" or new.note and new.kind == "file":
        return None
    lines, problem = _unified(old, new, 0)
    if problem and not lines:
        return problem
    plus = sum(1 for line in lines if line.startswith("+"))
    minus = sum(1 for line in lines if line.startswith("-"))
    return plus, minus


def render_diff(
    manifest: CopyManifest, changes: list[Change], stat: bool = False, for_git: bool = False
) -> Iterator[str]:
    """Each change as a git-style diff against the REAL workspace file, one terminal line per item.

    Bounded: files over MAX_DIFF_FILE_BYTES or holding a NUL are summarised by size, at most
    MAX_FILE_LINES lines per file and MAX_TOTAL_LINES in all. `stat=True`: one line per file with
    +/- counts and a total line, like `git diff --stat`. Names and content are made visible; with
    `for_git` (a patch carried in JSON, e.g. a batch result) names are quoted as git quotes them and
    content lines are as they are, so `git apply` lands exactly the names the box made.
    """
    real_fd = open_dir(manifest.real)
    copy_fd = open_dir(manifest.copy_dir)
    try:
        if stat:
            yield from _stat_lines(real_fd, copy_fd, changes)
        else:
            yield from _diff_lines(real_fd, copy_fd, changes, for_git)
    finally:
        os.close(real_fd)
        os.close(copy_fd)


def _diff_lines(real_fd: int, copy_fd: int, changes: list[Change], for_git: bool = False) -> Iterator[str]:
    total = 0
    for i, change in enumerate(changes):
        if total >= MAX_TOTAL_LINES:
            yield (
                f"# diff truncated at {MAX_TOTAL_LINES} lines: "
                f"{len(changes) - i} more changed entries not shown (see --stat)"
            )
            return
        old = _side(real_fd, change.path)
        new = _side(copy_fd, change.path) if change.after is not None else _Side("absent")
        lines = _headers(change, old, new, for_git) + _body(old, new, change.path, for_git)
        if len(lines) > MAX_FILE_LINES:
            lines = lines[:MAX_FILE_LINES] + [f"# {len(lines) - MAX_FILE_LINES} more lines of this file not shown"]
        total += len(lines)
        yield from lines


def _stat_lines(real_fd: int, copy_fd: int, changes: list[Change]) -> Iterator[str]:
    plus_total = minus_total = 0
    for i, change in enumerate(changes):
        old = _side(real_fd, change.path)
        new = _side(copy_fd, change.path) if change.after is not None else _Side("absent")
        counts = _counts(old, new)
        if isinstance(counts, tuple):
            plus_total, minus_total = plus_total + counts[0], minus_total + counts[1]
        if i >= MAX_STAT_FILES:
            continue
        path = shown(change.path)
        if counts is None:
            yield f" {path} | Bin {old.size} -> {new.size} bytes"
        elif isinstance(counts, str):
            yield f" {path} | not counted: {counts}"
        elif new.kind in ("special", "unsafe") or old.kind == "dir" or new.kind == "dir":
            yield f" {path} | {change.status}" + (f" ({new.note})" if new.note else "")
        else:
            n = counts[0] + counts[1]
            scale = max(1, -(-n // 40))
            yield f" {path} | {n:>5} {'+' * -(-counts[0] // scale)}{'-' * -(-counts[1] // scale)}".rstrip()
    if len(changes) > MAX_STAT_FILES:
        yield f" ... and {len(changes) - MAX_STAT_FILES} more"
    yield f" {len(changes)} files changed, {plus_total} insertions(+), {minus_total} deletions(-)"
