"""The host's view of a working tree the sandbox has written: walked and read without trusting it.

Walked and read only through the shared layer (orchestrator/boxfs): an iterative, budgeted Walk
(sorted, fd-relative, O_NOFOLLOW: a symlink is never walked, a 1,000-deep chain costs no Python
frames and stops at the budget's depth with a note), files opened by boxfs.open_regular (never a
FIFO, socket or device; O_NONBLOCK), reads size-capped, hashing streams. A directory holding a
`.git` entry (directory or gitfile) is a nested repository: opaque, never descended, its `.git`
never read. Paths are shown by `quote`: as they are when plain, else quoted as git does with
boxfs.show's escapes (a newline, an escape sequence or invalid UTF-8 never reaches the output raw).
Output goes through a Bounded buffer that refuses to grow past its cap, so no command holds more
than the cap in memory.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from typing import Callable, Generator, cast

from sandbox_agent.paths import GIT_DIR, PathRefused, check_lexical

from ..boxfs import BoxDir, Entry, HostBudget, show
from ..boxfs import Walk as BoxWalk
from ..boxfs.read import read_fd
from ..errors import ErrorType, OpenAgentsError

MAX_ENTRIES = 100_000  # files walked per command; beyond this a command stops with a note
MAX_VISITED = 10 * MAX_ENTRIES  # entries visited per command (ignored ones included), else RESOURCE_EXHAUSTED
HASH_CHUNK = 1 << 20
IGNORE_FILE_CAP = 256 * 1024  # a .gitignore above this (or not a regular file) is not given to libgit2
MODE_FILE, MODE_EXEC, MODE_LINK, MODE_GITLINK = 0o100644, 0o100755, 0o120000, 0o160000


class Full(Exception):
    """The output cap is reached: stop producing."""


class Bounded:
    """An output buffer that never holds more than `cap` characters."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.parts: list[str] = []
        self.size = 0
        self.cut = False

    def write(self, text: str) -> None:
        room = self.cap - self.size
        if len(text) > room:
            self.parts.append(text[:room])
            self.size = self.cap
            self.cut = True
            raise Full
        self.parts.append(text)
        self.size += len(text)

    def text(self) -> str:
        return "".join(self.parts)


def quote(path: str) -> str:
    """A path as shown: as it is when plain; else, as git does, in double quotes with `"` and `\\`
    escaped, and every control, format or undecodable byte escaped by boxfs.show (`\\n`, `\\x1b`,
    `\\xff`): always one line, never a raw escape sequence."""
    if (
        any(ord(c) < 32 or 127 <= ord(c) < 160 or c in '"\\' or 0xD800 <= ord(c) <= 0xDFFF for c in path)
        or show(path) != path
    ):
        return '"' + show(path.replace("\\", "\\\\").replace('"', '\\"')) + '"'
    return path


@dataclass(frozen=True)
class WorkEntry:
    path: str
    mode: int  # MODE_FILE, MODE_EXEC, MODE_LINK, or 0 for a FIFO, socket or device (never read)
    size: int
    key: tuple[int, ...]  # what must not change for a cached hash to stay valid


@dataclass
class Walk:
    files: dict[str, WorkEntry] = field(default_factory=dict)
    opaque: list[str] = field(default_factory=list)  # directories holding a .git entry
    notes: list[str] = field(default_factory=list)
    truncated: bool = False


class PathProblem(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def check_pathspec(path: str) -> str:
    """A pathspec is a plain workspace-relative path, refused like every other path; no ':' magic."""
    try:
        rel = check_lexical(path)
    except PathRefused as err:
        raise PathProblem(err.kind, str(err)) from None
    if path.startswith(":") or path.startswith("-"):
        raise PathProblem("path_invalid", f"pathspec magic and options are refused: {path!r}; give a plain path")
    if any(p.casefold() == GIT_DIR for p in rel.split("/")):
        raise PathProblem("path_in_git_dir", f"paths under .git are refused: {path!r}")
    return rel


def _is_git_name(name: str | bytes) -> bool:
    return os.fsdecode(name).casefold() == GIT_DIR


def _holds_git_entry(dir_fd: int) -> bool:
    """Whether the directory dir_fd holds a `.git` entry (any case): streamed, nothing kept."""
    return BoxDir.at(dir_fd).has_name(_is_git_name)


def _read_ignore_file(dir_fd: int) -> bytes | None:
    """The .gitignore in dir_fd (b"" when there is none), read by boxfs (O_NOFOLLOW|O_NONBLOCK, a
    regular file by lstat and fstat) and at most IGNORE_FILE_CAP bytes; None when it is anything else.
    Read once, here: what libgit2 matches against is this copy, never the workspace file, which
    the box can swap for a link (to a FIFO: libgit2 would block in open() holding the GIL, and the
    whole host process with it) between this check and libgit2's own open."""
    try:
        fd, st = BoxDir.at(dir_fd).open_file(".gitignore")
    except OpenAgentsError as err:
        return b"" if err.type is ErrorType.FILE_NOT_FOUND else None
    try:
        return read_fd(fd, IGNORE_FILE_CAP, ".gitignore")
    except OpenAgentsError:
        return None
    finally:
        os.close(fd)


class Tree:
    """The working tree under one root, reached only through directory fds opened with O_NOFOLLOW."""

    def __init__(self, root: str, shadow: str | None = None) -> None:
        """`shadow`: a private directory where each .gitignore the walk accepts is copied (at the
        same relative path) for libgit2 to read instead of the workspace's."""
        self.root = root
        self.shadow = shadow

    def _ignore_file_ok(self, dir_fd: int, rel_dir: str) -> bool:
        data = _read_ignore_file(dir_fd)
        if data is None:
            return False
        if self.shadow is not None:
            where = os.path.join(self.shadow, rel_dir.strip("/"))
            os.makedirs(where, mode=0o700, exist_ok=True)
            target = os.path.join(where, ".gitignore")
            if data:
                with open(target, "wb") as fh:
                    fh.write(data)
            elif os.path.lexists(target):
                os.unlink(target)
        return True

    def _open_dir(self, rel: str, nested_check: bool = False) -> tuple[int, bool]:
        """An fd for directory `rel`; also whether every .gitignore on the way is safe to hand to libgit2.
        With nested_check, a directory on the way that holds a .git entry is refused (a pathspec
        may not reach into a nested repository)."""
        fd = BoxDir.open(self.root, last_nofollow=True).detach()
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        try:
            ignore_ok = self._ignore_file_ok(fd, "")
            for i, part in enumerate(parts):
                here = "/".join(parts[: i + 1])
                try:
                    child = BoxDir.at(fd).sub(part).detach()
                except OSError as err:
                    st = BoxDir.at(fd).lstat_or_none(part)
                    if st is not None and stat.S_ISLNK(st.st_mode):
                        raise PathProblem(
                            "path_outside_workspace", f"{here!r} is a symbolic link; git paths do not go through links"
                        ) from None
                    raise PathProblem(
                        "file_not_found" if err.errno == 2 else "path_invalid", f"{here!r}: {err.strerror}"
                    ) from None
                os.close(fd)
                fd = child
                if nested_check and _holds_git_entry(fd):
                    raise PathProblem("path_invalid", f"{here!r} holds a .git entry: a nested repository, never opened")
                ignore_ok = ignore_ok and self._ignore_file_ok(fd, here)
            return fd, ignore_ok
        except BaseException:
            os.close(fd)
            raise

    def lstat(self, rel: str) -> os.stat_result | None:
        """lstat of `rel`, with its parents opened without following links; None if missing."""
        parent, _, name = rel.rpartition("/")
        try:
            fd, _ = self._open_dir(parent)
        except PathProblem as err:
            if err.kind == "file_not_found":
                return None
            raise
        try:
            return BoxDir.at(fd).lstat_or_none(name)
        finally:
            os.close(fd)

    def check_spec(self, rel: str) -> os.stat_result | None:
        """A pathspec's lstat (None if missing), refused if it goes through a link or into a nested
        repository, or is itself a link leading out of the workspace."""
        parent, _, name = rel.rpartition("/")
        try:
            fd, _ = self._open_dir(parent, nested_check=True)
        except PathProblem as err:
            if err.kind == "file_not_found":
                return None
            raise
        try:
            st = BoxDir.at(fd).lstat_or_none(name)
            if st is None:
                return None
            if stat.S_ISLNK(st.st_mode):
                real = os.path.realpath(os.path.join(self.root, rel))
                if real != self.root and not real.startswith(self.root.rstrip("/") + "/"):
                    raise PathProblem(
                        "path_outside_workspace", f"{rel!r} is a symbolic link leading outside the workspace"
                    )
            elif stat.S_ISDIR(st.st_mode):
                try:
                    child = BoxDir.at(fd).sub(name).detach()
                except FileNotFoundError:
                    return None
                try:
                    if _holds_git_entry(child):
                        raise PathProblem(
                            "path_invalid", f"{rel!r} holds a .git entry: a nested repository, never opened"
                        )
                finally:
                    os.close(child)
            return st
        finally:
            os.close(fd)

    def walk(
        self, start: str, skip: Callable[[str, bool, bool], bool], walk: Walk, budget: HostBudget | None = None
    ) -> None:
        """Walk `start` (a directory or a file), adding entries to `walk`. skip(rel, is_dir, ignore_ok)
        says what to leave out (ignored and untracked). Bounded by `budget` (default: MAX_VISITED
        entries, boxfs's depth): a directory deeper than its depth is not walked (a note says so)."""
        if budget is None:
            budget = HostBudget(max_entries=MAX_VISITED, max_bytes=None)
        if start == ".":
            fd, ok = self._open_dir(".")
            try:
                self._walk_dir(fd, "", skip, walk, ok, True, budget)
            finally:
                os.close(fd)
            return
        st = self.lstat(start)
        if st is None:
            return
        parent, _, name = start.rpartition("/")
        fd, ok = self._open_dir(parent)
        try:
            if stat.S_ISDIR(st.st_mode):
                child = BoxDir.at(fd).sub(name).detach()
                try:
                    self._walk_dir(
                        child, start + "/", skip, walk, ok and self._ignore_file_ok(child, start), False, budget
                    )
                finally:
                    os.close(child)
            else:
                self._add(walk, start, st)
        finally:
            os.close(fd)

    def _walk_dir(
        self,
        fd: int,
        prefix: str,
        skip: Callable[[str, bool, bool], bool],
        walk: Walk,
        ignore_ok: bool,
        top: bool,
        budget: HostBudget,
    ) -> None:
        """Everything under the directory fd (shown as `prefix`), through boxfs's Walk: sorted, no
        link followed, no recursion. `enter` does git's part: ignored directories and nested
        repositories are not entered; each entered directory's .gitignore is taken (or noted)."""
        if not top and _holds_git_entry(fd):
            walk.opaque.append(prefix)
            return
        if not self._ignore_file_ok(fd, prefix):
            walk.notes.append(
                f"{quote(prefix + '.gitignore')} is not a regular file of at most "
                f"{IGNORE_FILE_CAP} bytes: ignore rules below it are not applied"
            )
        ok_below: dict[bytes, bool] = {
            b"": ignore_ok
        }  # a directory's path under fd -> whether its ignore rules all apply

        def enter(entry: Entry) -> bool:
            if _is_git_name(entry.name):
                return False  # the repository itself (top) or a case variant that must never be added
            rel = prefix + entry.text
            parent_ok = ok_below[entry.rel.rpartition(b"/")[0]]
            if skip(rel, True, parent_ok):
                return False
            try:
                sub = BoxDir.at(entry.dir_fd).sub(entry.name).detach()
            except OSError:
                walk.notes.append(f"{quote(rel)}/ could not be opened")
                return False
            try:
                if _holds_git_entry(sub):
                    walk.opaque.append(rel + "/")
                    return False
                here_ok = self._ignore_file_ok(sub, rel)
                if not here_ok:
                    walk.notes.append(
                        f"{quote(rel + '/.gitignore')} is not a regular file of at most {IGNORE_FILE_CAP} bytes: "
                        "ignore rules below it are not applied"
                    )
                ok_below[entry.rel] = parent_ok and here_ok
            except OSError:
                walk.notes.append(f"{quote(rel)}/ could not be opened")
                return False
            finally:
                os.close(sub)
            return True

        walker = BoxWalk(fd, budget, enter=enter, sort=True)
        entries = cast(Generator[Entry, None, None], walker.entries())
        try:
            for entry in entries:
                if _is_git_name(entry.name):
                    continue
                if len(walk.files) >= MAX_ENTRIES:
                    walk.truncated = True
                    return
                if entry.is_dir:
                    continue
                rel = prefix + entry.text
                if not skip(rel, False, ok_below[entry.rel.rpartition(b"/")[0]]):
                    self._add(walk, rel, entry.st)
        finally:
            entries.close()
        for deep in walker.too_deep:
            walk.notes.append(
                f"{quote(prefix + os.fsdecode(deep))}/ is deeper than {budget.max_depth} levels: not walked"
            )
        for bad, _why in walker.unreadable:
            walk.notes.append(f"{quote(prefix + os.fsdecode(bad))}/ could not be opened")

    @staticmethod
    def _add(walk: Walk, rel: str, st: os.stat_result) -> None:
        if stat.S_ISREG(st.st_mode):
            mode = MODE_EXEC if st.st_mode & stat.S_IXUSR else MODE_FILE
        elif stat.S_ISLNK(st.st_mode):
            mode = MODE_LINK
        else:
            mode = 0
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)
        walk.files[rel] = WorkEntry(rel, mode, st.st_size, key)

    def open_regular(self, rel: str) -> tuple[int, os.stat_result]:
        """An fd on a regular file (boxfs.open_regular: never through a link, never blocking); else PathProblem."""
        parent, _, name = rel.rpartition("/")
        dir_fd, _ = self._open_dir(parent)
        try:
            return BoxDir.at(dir_fd).open_file(name, rel)
        except OpenAgentsError as err:
            raise PathProblem(
                "file_not_found" if err.type is ErrorType.FILE_NOT_FOUND else "not_regular_file",
                f"{rel!r}: {err.message}",
            ) from None
        finally:
            os.close(dir_fd)

    def readlink(self, rel: str) -> bytes:
        parent, _, name = rel.rpartition("/")
        dir_fd, _ = self._open_dir(parent)
        try:
            return BoxDir.at(dir_fd).readlink(name)
        finally:
            os.close(dir_fd)

    def read_head(self, rel: str, cap: int) -> bytes:
        """At most `cap` bytes of a regular file (or a link's target): one bounded read of a file
        boxfs opened, so a file the box is still growing costs no more than the cap."""
        entry_st = self.lstat(rel)
        if entry_st is not None and stat.S_ISLNK(entry_st.st_mode):
            return self.readlink(rel)[:cap]
        fd, _ = self.open_regular(rel)
        try:
            return os.pread(fd, cap, 0)
        finally:
            os.close(fd)

    def blob_id(self, entry: WorkEntry, hex_len: int) -> str:
        """The git blob id of a file or link, streamed: a large file is never held in memory."""
        digest = hashlib.sha1() if hex_len == 40 else hashlib.sha256()
        if entry.mode == MODE_LINK:
            data = self.readlink(entry.path)
            digest.update(b"blob %d\0" % len(data) + data)
            return digest.hexdigest()
        fd, st = self.open_regular(entry.path)
        try:
            digest.update(b"blob %d\0" % st.st_size)
            left = st.st_size
            while left > 0:
                chunk = os.read(fd, min(left, HASH_CHUNK))
                if not chunk:
                    raise PathProblem("io_error", f"{entry.path!r} changed while it was read")
                digest.update(chunk)
                left -= len(chunk)
            return digest.hexdigest()
        finally:
            os.close(fd)
