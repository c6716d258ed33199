"""Copy mode's review and apply: what the box changed, shown safely, and carried back by a sanitiser.

The copy is the box's: by the time anyone reviews it, every byte, name, mode and link in it may
be an attack on the host or on the user's real workspace. So this module touches it only through
the shared layer (orchestrator/boxfs): the copy is scanned by its iterative, budgeted Walk; every
path is reached from a directory fd, one O_NOFOLLOW component at a time; nothing but directories
and regular files is opened (O_NONBLOCK, so a FIFO cannot hang it); reads are capped; files land
through `write_atomic` (holes kept: a sparse file stays sparse on the user's disk). Paths are kept
in `boxfs.to_store` form (valid text, lossless: a newline or invalid UTF-8 in a name survives the
JSON manifest and the report) and shown only through `boxfs.show`.

`apply_changes()` is a sanitiser, not a copy. It carries regular files (modes normalised, never
setuid, setgid or sticky), directories, deletions and symlinks that stay inside the workspace;
it leaves out, and lists, everything else, and a HEAD or commondir that would make a directory a
bare repository the user's git obeys (integrity.git_shaped). It checks every change against the real workspace
before it writes anything: a path the user changed since the copy was taken is a conflict, and
one conflict means nothing is applied. Each file lands atomically (a recognisable temp file in
the same directory, fsync, rename), so a kill -9 at any moment leaves every file old or new; the
next apply removes the stale temp files and skips what already landed.
"""
from __future__ import annotations

import difflib
import errno
import os
import re
import stat
from dataclasses import dataclass
from typing import Iterator, Literal

from pydantic import BaseModel, Field

from .bounded_diff import bounded_unified_diff, split_lines
from ..boxfs import HostBudget, Walk, from_store, lstat_workspace, open_parent, open_regular, read_at, show, to_store, write_atomic
from ..boxfs.copy import temp_name
from ..boxfs.read import DIR_FLAGS, components, open_dir
from ..errors import OpenAgentsError
from .integrity import special_name
from ..terminal.render import visible
from .copy import COPY_MAX_DEPTH, CopyManifest, ManifestEntry, Stamp

ChangeKind = Literal["added", "modified", "deleted", "type_changed", "mode_changed"]

MAX_DIFF_FILE_BYTES = 256 * 1024  # larger files are summarised, never diffed (bounded memory and time)
IN_PROCESS_DIFF_WORK = 1_000_000  # old lines x new lines up to which difflib runs here: its worst case stays well under a second
DIFF_DEADLINE_S = 2.0  # a larger diff runs in bounded_diff's child, killed after this
MAX_DIFF_BYTES = 1 << 20  # and returns at most this much
MAX_FILE_LINES = 1000  # diff lines shown per file
MAX_TOTAL_LINES = 20000  # diff lines shown in all
MAX_STAT_FILES = 5000  # --stat lines before "and N more"
MAX_SYMLINK_HOPS = 40  # as the kernel's ELOOP limit
_CHUNK = 1 << 20
TEMP_PREFIX = ".oa-apply-"  # what earlier versions named their temp files (boxfs.write_atomic: ".oa-<hex>.tmp")
_TEMP_RE = re.compile(r"\.oa-(?:apply-)?[0-9a-f]{16}\.tmp\Z")
_LINE = re.compile(r"[^\n]*\n|[^\n]+")
_REPO_MAKERS = ("head", "commondir")  # the entries without which git takes no directory for a repository


class Change(BaseModel):
    """One entry the box changed in the copy, relative to the copy as it was made."""

    path: str  # boxfs.to_store form (from_store gives the bytes; shown() the line for a person)
    status: ChangeKind
    before: Stamp | None = None  # the copy right after it was made (None: added)
    after: Stamp | None = None  # the copy now (None: deleted)
    fmt: int = 0  # S_IFMT of the entry now: tells a FIFO from a socket from a device
    nlink: int = 1
    box_link: bool = False  # a hard link made in the box (not one the copy kept from the real tree)


class LeftOut(BaseModel):
    path: str
    reason: str


class Conflict(BaseModel):
    path: str
    reason: str


class Normalised(BaseModel):
    path: str
    box_mode: str  # as the box left it, octal
    mode: str  # as written to the real workspace, octal


class ApplyReport(BaseModel):
    applied: list[str] = Field(default_factory=list)
    left_out: list[LeftOut] = Field(default_factory=list)
    conflicts: list[Conflict] = Field(default_factory=list)
    normalised: list[Normalised] = Field(default_factory=list)  # applied, with another mode than the box's
    already: list[str] = Field(default_factory=list)  # already as the box left them (an earlier, interrupted apply)

    def lines(self) -> list[str]:
        """For a terminal: every path made visible (a name may hold escape sequences)."""
        out = [f"conflict: {shown(c.path)}: {show(c.reason)}" for c in self.conflicts]
        out += [f"applied: {shown(p)}" for p in self.applied]
        out += [f"mode {n.box_mode} normalised to {n.mode}: {shown(n.path)}" for n in self.normalised]
        return out + [f"left out: {shown(lo.path)}: {show(lo.reason)}" for lo in self.left_out]


def shown(path: str) -> str:
    """A path kept in to_store form, as a person sees it: boxfs.show of its bytes (one line)."""
    return show(from_store(path))


def _box_made_link(manifest: CopyManifest, path: str, ino: int, nlink: int) -> bool:
    """Whether a file with `nlink` names is a hard link made in the box: any, unless it is the
    copy's own inode at `path` with no more names than the copy gave it (a hard-linked group of the
    real tree is copied as one linked group: each of its names is carried as a file)."""
    if nlink <= 1:
        return False
    entry = manifest.entries.get(path)
    return not (entry is not None and entry.copy.kind == "file" and entry.copy.ino == ino and nlink <= manifest.link_group(ino))


def _is_git(name: str) -> bool:
    return name.casefold() == ".git"


def _in_git(rel: str) -> bool:
    return any(_is_git(part) for part in rel.split("/"))


# ---------------------------------------------------------------------------------------------
# what changed


@dataclass
class _Scan:
    changes: list[Change]
    git_entries: list[str]  # .git entries (any case) the box added or changed: never carried
    too_deep: list[str]  # directories not entered (deeper than the budget's depth)
    depth: int
    unreadable: list[tuple[str, str]]  # directories that could not be opened or listed, and why


def _status(before: Stamp, now: Stamp) -> ChangeKind | None:
    if before.kind != now.kind:
        return "type_changed"
    if now.kind != "dir" and (before.size, before.mtime_ns) != (now.size, now.mtime_ns):
        return "modified"  # a directory's mtime moves with its entries: those are reported themselves
    if before.mode != now.mode:
        return "mode_changed"
    return None


def _scan(manifest: CopyManifest, budget: HostBudget | None = None) -> _Scan:
    changes: list[Change] = []
    git: list[str] = []
    seen: set[str] = set()
    walk = Walk(manifest.copy_dir, budget if budget is not None else HostBudget(max_depth=COPY_MAX_DEPTH),
                enter=lambda e: not _is_git(os.fsdecode(e.name)))  # never enters a .git
    for found in walk.entries():
        rel, now = to_store(found.rel), Stamp.of(found.st)
        entry = manifest.entries.get(rel)
        if _is_git(os.fsdecode(found.name)):
            if entry is None or not now.same_as(entry.copy):
                if not (rel == ".git" and _empty_dir(found.dir_fd, found.name)):  # the .git mount point
                    git.append(rel)
            continue
        seen.add(rel)
        fmt, nlink = stat.S_IFMT(found.st.st_mode), found.st.st_nlink
        linked = stat.S_ISREG(found.st.st_mode) and _box_made_link(manifest, rel, found.st.st_ino, nlink)
        if entry is None:
            changes.append(Change(path=rel, status="added", after=now, fmt=fmt, nlink=nlink, box_link=linked))
        elif status := _status(entry.copy, now):
            changes.append(Change(path=rel, status=status, before=entry.copy, after=now, fmt=fmt, nlink=nlink, box_link=linked))
    too_deep = [to_store(r) for r in walk.too_deep]
    unreadable = [(to_store(r), why) for r, why in walk.unreadable]
    unseen = tuple(r + "/" for r in too_deep + [u for u, _ in unreadable])  # not looked into: nothing there is "deleted"
    for rel, entry in manifest.entries.items():
        if rel not in seen and not _in_git(rel) and not rel.startswith(unseen):
            changes.append(Change(path=rel, status="deleted", before=entry.copy))
    changes.sort(key=lambda c: c.path.split("/"))
    return _Scan(changes, sorted(git), too_deep, walk.budget.max_depth, unreadable)


def _empty_dir(dir_fd: int, name: bytes) -> bool:
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        with os.scandir(fd) as it:
            return next(iter(it), None) is None
    finally:
        os.close(fd)


def list_changes(manifest: CopyManifest, budget: HostBudget | None = None) -> list[Change]:
    """What the box changed in the copy since it was made, parents before children; nothing in or
    under any `.git` (any case) is ever reported or entered. The scan is bounded by `budget`
    (default: boxfs's, with the copy's depth, COPY_MAX_DEPTH); over it, BudgetExceeded (typed RESOURCE_EXHAUSTED), never a short list."""
    return _scan(manifest, budget).changes


# ---------------------------------------------------------------------------------------------
# walking a tree without following anything


def _unsafe(err: OpenAgentsError) -> OSError:
    """boxfs's typed refusal (a link on the way, not a regular file) as the OSError callers handle."""
    return OSError(errno.ELOOP, err.message)


def _open_dir(root_fd: int, rel: str) -> int:
    """A new fd of the directory root/rel (to_store form; "" is root), through boxfs.open_parent:
    no link followed anywhere (a symlink raises ELOOP)."""
    if not rel:
        return os.dup(root_fd)
    parent, leaf = _parent(root_fd, rel)
    try:
        return os.open(leaf, DIR_FLAGS, dir_fd=parent)
    finally:
        os.close(parent)


@dataclass
class _Where:
    st: os.stat_result | None = None  # the entry itself, not followed
    blocker: str | None = None  # the first parent that is not a plain directory (to_store form)
    blocker_kind: str = ""
    parent_missing: bool = False


def _locate(root_fd: int, rel: str) -> _Where:
    """What is at rel, and if a parent is not a plain directory, which one: the conflict rule tells
    a directory the user replaced from one that was never one. Each component is opened with
    boxfs's O_NOFOLLOW directory flags from its parent's fd."""
    parts = components(from_store(rel))
    fd = os.dup(root_fd)
    try:
        for i, name in enumerate(parts[:-1]):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return _Where(parent_missing=True)
            if not stat.S_ISDIR(st.st_mode):
                return _Where(blocker=to_store(b"/".join(parts[: i + 1])),
                              blocker_kind="a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory")
            sub = os.open(name, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = sub
        try:
            return _Where(st=os.stat(parts[-1], dir_fd=fd, follow_symlinks=False))
        except FileNotFoundError:
            return _Where()
    finally:
        os.close(fd)


def _parent(root_fd: int, rel: str) -> tuple[int, bytes]:
    """(a new fd of rel's parent, rel's last name), reached through boxfs.open_parent."""
    try:
        found = open_parent(root_fd, from_store(rel))
    except OpenAgentsError as err:
        raise _unsafe(err) from None
    if found is None:
        raise FileNotFoundError(errno.ENOENT, "a parent directory is missing")
    return found


def _open_file(root_fd: int, rel: str) -> int:
    """An fd of the regular file root/rel (boxfs.open_regular): no link followed, never blocking
    (a FIFO, socket or device is refused before it is opened)."""
    parent, leaf = _parent(root_fd, rel)
    try:
        return open_regular(parent, leaf, from_store(rel))[0]
    except OpenAgentsError as err:
        raise _unsafe(err) from None
    finally:
        os.close(parent)


def _readlink(root_fd: int, rel: str) -> str:
    """The target of the symlink root/rel, in to_store form (read, never followed)."""
    parent, leaf = _parent(root_fd, rel)
    try:
        return to_store(os.readlink(leaf, dir_fd=parent))
    finally:
        os.close(parent)


def _same_content(fd_a: int, fd_b: int) -> bool:
    os.lseek(fd_a, 0, os.SEEK_SET)
    os.lseek(fd_b, 0, os.SEEK_SET)
    while True:
        a, b = os.read(fd_a, _CHUNK), os.read(fd_b, _CHUNK)
        if a != b:
            return False
        if not a:
            return True


# ---------------------------------------------------------------------------------------------
# the diff


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
        data = read_at(parent, leaf, MAX_DIFF_FILE_BYTES, from_store(rel))[0]
    except OpenAgentsError as err:
        if "cap" in err.message:
            return _Side("file", st.st_size, mode, note=f"large file, {max(st.st_size, MAX_DIFF_FILE_BYTES + 1)}+ bytes")
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
    result = bounded_unified_diff(old.text or "", new.text or "", "a", "b", max_bytes=MAX_DIFF_BYTES, deadline_s=DIFF_DEADLINE_S,
                                  context=context)
    if result.text is None:
        return [], result.skipped or "not diffed"
    lines = [line[:-1] if line.endswith("\n") else line for line in split_lines(result.text)[2:]]
    return lines, f"cut at {MAX_DIFF_BYTES >> 10} KiB" if result.cut else None


def _hunks(old: _Side, new: _Side) -> list[str]:
    """Unified diff body lines, each one terminal line (made visible), with git's no-newline marks."""
    lines, problem = _unified(old, new, 3)
    out = [visible(line) for line in lines]
    return out + [f"# diff {problem}"] if problem else out


def _headers(change: Change, old: _Side, new: _Side) -> list[str]:
    p = shown(change.path)
    out = [f"diff --git a/{p} b/{p}"]
    if old.kind == "absent" and new.kind != "absent":
        out.append(f"new file mode {_git_mode(new)}")
    elif new.kind == "absent" and old.kind != "absent":
        out.append(f"deleted file mode {_git_mode(old)}")
    elif (old.kind, old.mode) != (new.kind, new.mode):
        out += [f"old mode {_git_mode(old)}", f"new mode {_git_mode(new)}"]
    for label, side in (("real workspace", old), ("copy", new)):
        if side.kind in ("special", "unsafe"):
            out.append(f"# {label}: {side.note} (not carried by apply)" if label == "copy" else f"# {label}: {side.note}")
        elif side.kind == "dir":
            out.append(f"# {label}: a directory")
    if new.kind in ("file", "dir") and new.mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX):
        out.append("# setuid, setgid and sticky bits are never carried by apply")
    if change.box_link and new.kind == "file":
        out.append(f"# a hard link ({change.nlink} names): not carried by apply")
    return out


def _summary(side: _Side) -> str:
    return side.note or ("absent" if side.kind == "absent" else f"{side.size} bytes")


def _body(old: _Side, new: _Side, path: str) -> list[str]:
    if old.note and old.kind == "file" or new.note and new.kind == "file":
        return [f"# not diffed: a/{path}: {_summary(old)}; b/{path}: {_summary(new)}"]
    if old.text is None and new.text is None:
        return []
    label_a = f"a/{path}" if old.text is not None else "/dev/null"
    label_b = f"b/{path}" if new.text is not None else "/dev/null"
    hunks = _hunks(old, new)
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


def render_diff(manifest: CopyManifest, changes: list[Change], stat: bool = False) -> Iterator[str]:
    """Each change as a git-style diff against the REAL workspace file, one terminal line per item.

    Bounded: files over MAX_DIFF_FILE_BYTES or holding a NUL are summarised by size, at most
    MAX_FILE_LINES lines per file and MAX_TOTAL_LINES in all. `stat=True`: one line per file with
    +/- counts and a total line, like `git diff --stat`. Names and content are made visible.
    """
    real_fd = open_dir(manifest.real)
    copy_fd = open_dir(manifest.copy_dir)
    try:
        yield from (_stat_lines if stat else _diff_lines)(real_fd, copy_fd, changes)
    finally:
        os.close(real_fd)
        os.close(copy_fd)


def _diff_lines(real_fd: int, copy_fd: int, changes: list[Change]) -> Iterator[str]:
    total = 0
    for i, change in enumerate(changes):
        if total >= MAX_TOTAL_LINES:
            yield f"# diff truncated at {MAX_TOTAL_LINES} lines: {len(changes) - i} more changed entries not shown (see --stat)"
            return
        old = _side(real_fd, change.path)
        new = _side(copy_fd, change.path) if change.after is not None else _Side("absent")
        lines = _headers(change, old, new) + _body(old, new, shown(change.path))
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


# ---------------------------------------------------------------------------------------------
# apply


@dataclass
class _Act:
    path: str
    op: Literal["write", "chmod", "mkdir", "symlink", "delete"]
    change: Change
    entry: ManifestEntry | None
    real: os.stat_result | None = None  # the real entry now (None: nothing there)
    mode: int = 0o644
    target: str = ""  # symlinks: checked once, written as checked (never read again)
    replaces_dir: bool = False  # the real entry is a directory the box replaced: after deletions

    @property
    def box_mode(self) -> int:
        """The mode the box left: write and chmod act on an entry the copy still has."""
        assert self.change.after is not None, f"{self.op} of {self.path}: the copy has no entry"
        return self.change.after.mode


def _mode_for(box_mode: int, real: os.stat_result | None) -> int:
    """0644/0755 for a new file; an existing file keeps its own permission bits (a private 0600
    file stays private) with the exec bits as the box left them; never setuid, setgid or sticky."""
    box_exec = bool(box_mode & 0o111)
    if real is None or not stat.S_ISREG(real.st_mode):
        return 0o755 if box_exec else 0o644
    base = stat.S_IMODE(real.st_mode) & 0o777
    return base | ((base & 0o444) >> 2) if box_exec else base & ~0o111


def _owner(real: os.stat_result | None, manifest: CopyManifest) -> tuple[int, int]:
    return (real.st_uid, real.st_gid) if real is not None else (manifest.real_uid, manifest.real_gid)


class _Applier:
    def __init__(self, manifest: CopyManifest, budget: HostBudget | None = None) -> None:
        self.m = manifest
        self.report = ApplyReport()
        self.touched: set[str] = set()  # directories whose entries changed: fsynced once, at the end
        self.budget = budget if budget is not None else HostBudget(max_depth=COPY_MAX_DEPTH)
        self.real_fd = open_dir(manifest.real)
        try:
            self.copy_fd = open_dir(manifest.copy_dir)
        except BaseException:
            os.close(self.real_fd)
            raise

    def close(self) -> None:
        os.close(self.real_fd)
        os.close(self.copy_fd)

    def leave(self, path: str, reason: str) -> None:
        self.report.left_out.append(LeftOut(path=path, reason=reason))

    def conflict(self, path: str, reason: str) -> None:
        self.report.conflicts.append(Conflict(path=path, reason=reason))

    # -- deciding, from the copy alone

    def decide(self, change: Change) -> _Act | None:
        entry = self.m.entries.get(change.path)
        after = change.after
        if after is None:
            return _Act(change.path, "delete", change, entry)
        if _TEMP_RE.match(change.path.rpartition("/")[2]):
            self.leave(change.path, "a name apply reserves for its own temp files is never carried")
            return None
        if after.kind == "special":
            self.leave(change.path, f"{special_name(change.fmt)} is never carried")
            return None
        if after.kind != "dir" and change.path.rpartition("/")[2].casefold() in _REPO_MAKERS and self._makes_repository(change.path):
            self.leave(change.path, "it would make its directory a repository git obeys (HEAD with objects/ and refs/, or a commondir): never carried")
            return None
        if after.kind == "file":
            if change.box_link:
                self.leave(change.path, f"a hard link ({change.nlink} names) made in the box is never carried")
                return None
            return _Act(change.path, "chmod" if change.status == "mode_changed" else "write", change, entry)
        if after.kind == "dir":
            if change.status == "mode_changed":
                self.leave(change.path, f"a directory's mode change ({after.mode:04o}) is never carried")
                return None
            return _Act(change.path, "mkdir", change, entry)
        try:
            target = _readlink(self.copy_fd, change.path)
        except OSError:
            self.leave(change.path, "the symlink could not be read safely")
            return None
        if target.startswith("/"):
            self.leave(change.path, "an absolute symlink is never carried")
            return None
        if "\0" in target or len(target) > 4096:
            self.leave(change.path, "a symlink target that is not a plain path")
            return None
        return _Act(change.path, "symlink", change, entry, target=target)

    def _makes_repository(self, rel: str) -> bool:
        """Whether the directory of `rel` would be a git directory to the user's git (a bare
        repository, found from it and from every directory below) once `rel` lands: judged on
        the names in the copy's directory and the real one together."""
        parent = rel.rpartition("/")[0]
        names: set[str] = set()
        for root in (self.copy_fd, self.real_fd):
            try:
                fd = _open_dir(root, parent)
            except OSError:
                continue
            try:
                names |= {n.casefold() for n in os.listdir(fd)}
            finally:
                os.close(fd)
        return "head" in names and ("commondir" in names or {"objects", "refs"} <= names)

    # -- checking, against the real workspace

    def check(self, act: _Act, planned: dict[str, _Act]) -> bool:
        """True when the act can go ahead; records a conflict or a left-out entry otherwise."""
        rel = act.path
        where = _locate(self.real_fd, rel)
        if where.blocker:
            replacer = planned.get(where.blocker)
            if not (replacer and replacer.op == "mkdir"):
                entry = self.m.entries.get(where.blocker)
                if entry is not None and entry.real.kind == "dir":
                    self.conflict(rel, f"{shown(where.blocker)} is {where.blocker_kind} in the real workspace now; it was a directory")
                else:
                    self.leave(rel, f"{shown(where.blocker)} is {where.blocker_kind} in the real workspace, never written through")
                return False
            where = _Where()  # below a symlink the box turned into a directory: nothing there yet
        elif where.parent_missing:
            parent = rel.rpartition("/")[0]
            if act.op == "delete":
                self.report.already.append(rel)  # gone with its parent
                return False
            if not (parent in planned and planned[parent].op == "mkdir") and not self._parent_planned(parent, planned):
                self.conflict(rel, "its directory is gone from the real workspace since the copy was taken")
                return False
        act.real = where.st
        if act.op in ("write", "chmod"):
            act.mode = _mode_for(act.box_mode, act.real)
        expected = act.entry.real if act.entry else None
        if act.real is None:
            if act.op == "delete":
                self.report.already.append(rel)
                return False
            if expected is not None:
                self.conflict(rel, "deleted in the real workspace since the copy was taken")
                return False
            return True
        if expected is None or not self._unchanged(act.real, expected):
            if self._already(act, act.real):
                self.report.already.append(rel)
                return False
            self.conflict(rel, "changed in the real workspace since the copy was taken" if expected else
                          "added in the box, but the real workspace has it now too")
            return False
        if stat.S_ISDIR(act.real.st_mode) and act.op != "mkdir":
            act.replaces_dir = True
            extra = self._extra_names(rel, planned)
            if extra:
                self.leave(rel, f"the real directory holds {shown(extra)}, which apply never removes")
                return False
        return True

    def _parent_planned(self, parent: str, planned: dict[str, _Act]) -> bool:
        while parent:
            if parent in planned and planned[parent].op == "mkdir":
                return True
            parent = parent.rpartition("/")[0]
        return False

    @staticmethod
    def _unchanged(now: os.stat_result, expected: Stamp) -> bool:
        stamp = Stamp.of(now)
        if stamp.kind == "dir" == expected.kind:
            return stamp.mode == expected.mode  # its mtime moves with its entries (and with our own apply)
        return stamp.same_as(expected)

    def _already(self, act: _Act, real: os.stat_result) -> bool:
        """The real entry (`real`, there) is already what apply would make it (an earlier apply was interrupted)."""
        if act.op == "mkdir":
            return stat.S_ISDIR(real.st_mode)
        if act.op == "symlink":
            return stat.S_ISLNK(real.st_mode) and _readlink(self.real_fd, act.path) == act.target
        if act.op in ("write", "chmod") and stat.S_ISREG(real.st_mode) and stat.S_IMODE(real.st_mode) == act.mode:
            try:
                a, b = _open_file(self.real_fd, act.path), _open_file(self.copy_fd, act.path)
            except OSError:
                return False
            try:
                return os.fstat(a).st_size == os.fstat(b).st_size and _same_content(a, b)
            finally:
                os.close(a)
                os.close(b)
        return False

    def _extra_names(self, rel: str, planned: dict[str, _Act]) -> str | None:
        """A name in the real directory that apply would not remove (so it cannot be removed)."""
        fd = _open_dir(self.real_fd, rel)
        try:
            names = [to_store(os.fsencode(n)) for n in os.listdir(fd)]
        finally:
            os.close(fd)
        for name in sorted(names):
            child = f"{rel}/{name}"
            if _TEMP_RE.match(name):
                continue
            act = planned.get(child)
            if act is None or act.op != "delete":
                return child
        return None

    # -- symlinks: inside the workspace as it will be after apply

    def _layout(self, rel: str, planned: dict[str, _Act], cache: dict[str, tuple[str, str]]) -> tuple[str, str]:
        """(kind, link target) at rel after apply: the plan where it says, else the real workspace."""
        act = planned.get(rel)
        if act is not None:
            kind = {"write": "file", "chmod": "file", "mkdir": "dir", "symlink": "symlink", "delete": "absent"}[act.op]
            return kind, act.target
        if rel not in cache:
            try:
                where = _locate(self.real_fd, rel)
                st = where.st
                if st is None or where.blocker:
                    cache[rel] = ("absent", "")
                elif stat.S_ISLNK(st.st_mode):
                    cache[rel] = ("symlink", _readlink(self.real_fd, rel))
                else:
                    cache[rel] = ("dir" if stat.S_ISDIR(st.st_mode) else "file", "")
            except OSError:
                cache[rel] = ("unsafe", "")
        return cache[rel]

    def link_problem(self, act: _Act, planned: dict[str, _Act], cache: dict[str, tuple[str, str]]) -> str | None:
        """Why the symlink would lead outside the workspace (or into a .git), else None. Purely
        lexical, one component at a time, with each link met read (never followed)."""
        base = act.path.split("/")[:-1]
        pending = act.target.split("/")
        hops = 0
        while pending:
            part = pending.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                if not base:
                    return "a symlink leading outside the workspace is never carried"
                base.pop()
                continue
            if _is_git(part):
                return "a symlink into a .git is never carried"
            base.append(part)
            kind, target = self._layout("/".join(base), planned, cache)
            if kind == "unsafe":
                return "a symlink through a path that cannot be checked is never carried"
            if kind == "symlink":
                hops += 1
                if hops > MAX_SYMLINK_HOPS:
                    return "a symlink chain too long to check is never carried"
                if target.startswith("/"):
                    return "a symlink through an absolute symlink is never carried"
                base.pop()
                pending[:0] = target.split("/")
        return None

    # -- writing

    def run(self) -> ApplyReport:
        ok = self.plan(clean=True)
        if self.report.conflicts:
            return self.report  # nothing is applied: the CLI says so and exits 1
        deletes = [a for a in ok if a.op == "delete"]
        first = [a for a in ok if a.op != "delete" and not a.replaces_dir]
        last = [a for a in ok if a.op != "delete" and a.replaces_dir]
        for act in first:  # parents before children
            self._do(act)
        for act in reversed(deletes):  # children before parents
            self._do(act)
        for act in last:  # a directory the box replaced, now emptied
            self._do(act)
        self._sync_dirs()
        return self.report

    def plan(self, clean: bool) -> list[_Act]:
        """Scan, decide and check: what apply would do, with everything left out and every conflict
        in the report; nothing written (`clean`: remove an interrupted apply's temp files first)."""
        scan = _scan(self.m, self.budget)
        for rel in scan.git_entries:
            self.leave(rel, "a .git entry (any case) is never carried")
        for rel in scan.too_deep:
            self.leave(rel, f"deeper than {scan.depth} levels: not checked, not carried")
        for rel, why in scan.unreadable:
            self.leave(rel, f"could not be read ({why}): not checked, not carried")
        # a directory the walk did not enter is not carried itself either: what apply makes is
        # never deeper than what the next copy takes (COPY_MAX_DEPTH)
        unseen = set(scan.too_deep) | {u for u, _ in scan.unreadable}
        below = tuple(u + "/" for u in unseen)
        changes = [c for c in scan.changes if c.path not in unseen and not c.path.startswith(below)]
        if clean:
            self._clean_stale(changes)
        acts = [a for a in map(self.decide, changes) if a is not None]
        planned = {a.path: a for a in acts}
        ok = []
        for act in acts:
            try:
                good = self.check(act, planned)
            except OSError as err:
                self.leave(act.path, f"could not be checked: {err.strerror}")
                good = False
            if good:
                ok.append(act)
            elif planned.get(act.path) is act:
                del planned[act.path]  # the real workspace keeps what it has there
        if self.report.conflicts:
            return ok
        return self._check_links(ok, planned)

    def _sync_dirs(self) -> None:
        """Each file's data was fsynced before its rename; the renames themselves are made durable
        here, once per directory (a crash before this leaves each file old or new, never torn)."""
        for rel in sorted(self.touched):
            try:
                fd = _open_dir(self.real_fd, rel)
            except OSError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _check_links(self, ok: list[_Act], planned: dict[str, _Act]) -> list[_Act]:
        """Refuse bad links until none is left: refusing one changes the layout others resolve in."""
        links = [a for a in ok if a.op == "symlink"]
        for _ in range(8):
            cache: dict[str, tuple[str, str]] = {}
            refused = [(a, p) for a in links if (p := self.link_problem(a, planned, cache))]
            if not refused:
                break
            for act, problem in refused:
                self.leave(act.path, problem)
                links.remove(act)
                del planned[act.path]
        else:
            for act in links:
                self.leave(act.path, "a symlink whose target could not be settled is never carried")
            links = []
        keep = {id(a) for a in links}
        return [a for a in ok if a.op != "symlink" or id(a) in keep]

    def _clean_stale(self, changes: list[Change]) -> None:
        """Temp files an interrupted apply left behind, in every directory this apply touches."""
        dirs = {c.path.rpartition("/")[0] for c in changes} | {c.path for c in changes if c.after and c.after.kind == "dir"}
        for rel in sorted(dirs):
            try:
                fd = _open_dir(self.real_fd, rel)
            except OSError:
                continue
            try:
                for name in os.listdir(fd):
                    if _TEMP_RE.match(name):
                        try:
                            if not stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
                                os.unlink(name, dir_fd=fd)
                        except OSError:
                            pass
            finally:
                os.close(fd)

    def _do(self, act: _Act) -> None:
        where = act.path.rpartition("/")[0]
        try:
            parent, name = _parent(self.real_fd, act.path)
        except OSError as err:
            self.leave(act.path, f"not applied: {err.strerror}")
            return
        try:
            getattr(self, f"_{act.op}")(act, parent, name)
            self.touched.add(where)
            self.report.applied.append(act.path)
            if act.op in ("write", "chmod") and act.mode != act.box_mode:
                self.report.normalised.append(Normalised(path=act.path, box_mode=f"{act.box_mode:04o}", mode=f"{act.mode:04o}"))
        except _Refused as err:
            self.leave(act.path, str(err))
        except OpenAgentsError as err:  # boxfs refused an entry swapped since the check
            self.leave(act.path, f"not applied: {err.message}")
        except OSError as err:
            self.leave(act.path, f"not applied: {err.strerror}")
        finally:
            os.close(parent)

    def _mkdir(self, act: _Act, parent: int, name: bytes) -> None:
        if act.real is not None:
            os.unlink(name, dir_fd=parent)  # a file or a symlink the box turned into a directory
        os.mkdir(name, 0o755, dir_fd=parent)
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        try:
            _chown(fd, *_owner(None, self.m))
            os.fchmod(fd, 0o755)
        finally:
            os.close(fd)

    def _write(self, act: _Act, parent: int, name: bytes) -> None:
        src = _open_file(self.copy_fd, act.path)
        try:
            st = os.fstat(src)
            if _box_made_link(self.m, act.path, st.st_ino, st.st_nlink):
                raise _Refused(f"a hard link ({st.st_nlink} names) made in the box is never carried")
            uid, gid = _settable(*_owner(act.real if act.real is not None and stat.S_ISREG(act.real.st_mode) else None, self.m))
            if act.replaces_dir:
                os.rmdir(name, dir_fd=parent)  # emptied by the deletions before
            # a temp name, fsync, rename: old or new, never half; holes kept (a sparse file stays sparse)
            write_atomic(parent, name, src, self.budget, mode=act.mode, uid=uid, gid=gid)
        finally:
            os.close(src)

    def _chmod(self, act: _Act, parent: int, name: bytes) -> None:
        try:
            fd = open_regular(parent, name)[0]
        except OpenAgentsError:
            raise _Refused("no longer a regular file in the real workspace") from None
        try:
            os.fchmod(fd, act.mode)
        finally:
            os.close(fd)

    def _symlink(self, act: _Act, parent: int, name: bytes) -> None:
        tmp = temp_name()
        os.symlink(from_store(act.target), tmp, dir_fd=parent)
        try:
            uid, gid = _owner(act.real, self.m)
            try:
                os.chown(tmp, uid, gid, dir_fd=parent, follow_symlinks=False)
            except PermissionError:
                pass
            if act.replaces_dir:
                os.rmdir(name, dir_fd=parent)
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=parent)
            except OSError:
                pass
            raise

    def _delete(self, act: _Act, parent: int, name: bytes) -> None:
        st = os.lstat(name, dir_fd=parent)
        if stat.S_ISDIR(st.st_mode):
            os.rmdir(name, dir_fd=parent)
        elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
            os.unlink(name, dir_fd=parent)
        else:
            raise _Refused("not a file, directory or symlink in the real workspace: left alone")


class _Refused(Exception):
    """Something found at write time that the plan did not allow (the box may still be running)."""


def _settable(uid: int, gid: int) -> tuple[int | None, int | None]:
    """The owner write_atomic may give a file: any as root, else only our own (None: as created)."""
    if os.geteuid() == 0 or uid == os.geteuid() and (gid == os.getegid() or gid in os.getgroups()):
        return uid, gid
    return None, None


def _chown(fd: int, uid: int, gid: int) -> None:
    try:
        os.fchown(fd, uid, gid)
    except PermissionError:
        pass  # not root: the file is ours, which is the best an unprivileged apply can do


def planned_changes(manifest: CopyManifest, budget: HostBudget | None = None) -> tuple[list[Change], ApplyReport]:
    """What `apply_changes` would carry now, without writing anything: the changes it would apply
    (for render_diff: the patch as the sanitiser would land it) and its report, with what it would
    leave out and any conflict (then it would apply nothing)."""
    applier = _Applier(manifest, budget)
    try:
        acts = applier.plan(clean=False)
        return ([] if applier.report.conflicts else [a.change for a in acts]), applier.report
    finally:
        applier.close()


def apply_changes(manifest: CopyManifest, budget: HostBudget | None = None) -> ApplyReport:
    """Carry the box's changes into the real workspace, sanitised; nothing at all on a conflict.

    Returns what was applied, what was left out (with why) and the conflicts; the caller exits 1
    when there are conflicts. Safe to run again after an interruption. The scan of the copy and
    the bytes written are bounded by `budget` (default: boxfs's, with the copy's depth: nothing
    apply makes is deeper than the next copy takes).
    """
    applier = _Applier(manifest, budget)
    try:
        return applier.run()
    finally:
        applier.close()


# ---------------------------------------------------------------------------------------------
# landing more than once (MCP's apply_changes, ACP's end of every prompt turn)


def apply_scanned(manifest: CopyManifest) -> tuple[ApplyReport, dict[str, Change]]:
    """apply_changes, with the copy's changes as scanned just before: what `move_on` needs."""
    scanned = {c.path: c for c in list_changes(manifest)}
    return apply_changes(manifest), scanned


def move_on(manifest: CopyManifest, scanned: dict[str, Change], report: ApplyReport) -> None:
    """After a landing without conflicts, each landed entry's stamps become the real file as it is
    now and the copy as it was scanned before the landing, so the next landing carries only what is
    new: the user's landed file is not taken for their own later change (a false conflict), and a
    change the box made during the landing is seen again. A landed deletion drops its subtree."""
    for rel in [*report.applied, *report.already]:
        change = scanned.get(rel)
        if change is None:
            continue  # made by the box during the landing: judged on its content next time
        if change.after is None:
            below = rel + "/"
            for key in [k for k in manifest.entries if k == rel or k.startswith(below)]:
                del manifest.entries[key]
            continue
        try:
            now = lstat_workspace(manifest.real, from_store(rel))
        except OpenAgentsError:
            now = None
        if now is not None:
            manifest.entries[rel] = ManifestEntry(Stamp.of(now), change.after)
