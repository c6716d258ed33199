"""The workspace after the box: what it may have planted for the host or the user to trip over.

The box writes the workspace as its owner. Whatever it leaves there outlives the session: a
setuid binary the user later runs, a `.git` (directory or gitfile) that the user's own `git
status` obeys, a FIFO that hangs the next tool to open it. So the host takes a baseline before
the first call and, whenever the box is gone (session end, container replaced), sweeps:

- setuid/setgid bits that were not there at the start are cleared;
- every `.git` entry (any case: `.GIT` is a git dir on case-insensitive disks) that did not exist
  at the start, and every FIFO, socket or device file, is moved out into the session's state
  directory;
- git also takes a directory itself for a repository, with no `.git` name anywhere, when it holds
  HEAD with objects/ and refs/ (a bare repository, found from that directory and every directory
  below it) or HEAD with a `commondir` file; its config then runs programs (core.pager on the
  user's next `git log`). In such a directory that was not one at the start, HEAD is moved out into the state
  directory. Nothing is deleted: a FIFO, socket or device holds no data, so when it cannot be
  renamed across file systems its record (type, mode) is kept instead.

The walk never follows a symlink and never opens anything but directories; it runs only while no
container is using the workspace, so nothing can race it.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from pydantic import BaseModel, Field

SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID


def is_git_name(name: str) -> bool:
    return name.casefold() == ".git"


def is_head_name(name: str) -> bool:
    return name.casefold() == "head"


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except OSError:
        return False


def git_shaped(dir_fd: int) -> bool:
    """Whether git's discovery takes the directory behind dir_fd for a git directory (setup.c,
    is_git_directory): HEAD plus objects/ and refs/, or HEAD plus a `commondir` file that points at
    them. By names only (any case, for case-insensitive disks), without reading anything; called
    only where a HEAD entry was met, so it costs nothing on ordinary trees."""
    try:
        names = {n.casefold() for n in os.listdir(dir_fd)}
    except OSError:
        return False
    return "head" in names and ("commondir" in names or {"objects", "refs"} <= names)


def special_kind(mode: int) -> str | None:
    """fifo, socket or device: what holds no data and must never be opened by the host."""
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return None


def special_name(mode: int, other: str = "not a regular file") -> str:
    """The kind in words for a person: 'a FIFO', 'a socket', 'a device file', else `other`."""
    return {"fifo": "a FIFO", "socket": "a socket", "device": "a device file"}.get(special_kind(mode) or "", other)


MAX_DEPTH = 512
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Found:
    """One entry met by the walk: its parent directory's fd (valid only while it is yielded), its
    name, its relative path and its lstat. Acting through (dir_fd, name) means that a parent
    swapped for a symlink by a box still running on a shared workspace cannot redirect the act."""

    __slots__ = ("dir_fd", "name", "rel", "st")

    def __init__(self, dir_fd: int, name: str, rel: str, st: os.stat_result) -> None:
        self.dir_fd, self.name, self.rel, self.st = dir_fd, name, rel, st


def walk(root: Path, enter: Callable[[Found], bool] = lambda found: not is_git_name(found.name),
         too_deep: list[str] | None = None) -> Iterator[Found]:
    """Every entry under root, depth first, through directory fds opened with O_NOFOLLOW: no
    symlink is ever followed, at any level. `enter(found)` decides whether a directory is entered
    (default: everything but .git entries)."""
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError:
        return
    try:
        yield from _walk_fd(fd, "", enter, 0, too_deep)
    finally:
        os.close(fd)


def _walk_fd(dir_fd: int, rel_dir: str, enter: Callable[[Found], bool], depth: int, too_deep: list[str] | None) -> Iterator[Found]:
    try:
        with os.scandir(dir_fd) as it:
            names = [e.name for e in it]
    except OSError:
        return
    for name in names:
        try:
            st = os.lstat(name, dir_fd=dir_fd)
        except OSError:
            continue
        found = Found(dir_fd, name, f"{rel_dir}/{name}" if rel_dir else name, st)
        yield found
        if not stat.S_ISDIR(st.st_mode) or not enter(found):
            continue
        if depth + 1 >= MAX_DEPTH:
            if too_deep is not None:
                too_deep.append(found.rel)
            continue
        try:
            sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError:
            continue
        try:
            yield from _walk_fd(sub, found.rel, enter, depth + 1, too_deep)
        finally:
            os.close(sub)


@dataclass(frozen=True)
class Baseline:
    """What the workspace held at the start, before the box could write anything."""

    git_entries: dict[str, tuple[int, int]]  # every .git entry (dir or file), and every directory git takes for a repository (bare): path -> (st_dev, st_ino)
    special_bits: frozenset[str]  # paths that already carried setuid/setgid (the user's own)
    top_git_dir: bool  # WORKSPACE/.git is a real directory (not a symlink, not a gitfile)
    usage_bytes: int  # allocated outside the .git entries: where the write quota starts from
    took_s: float
    git_shaped_dirs: frozenset[tuple[int, int]] = frozenset()  # (st_dev, st_ino) of directories git took for a repository at the start, the root included

    @classmethod
    def capture(cls, workspace: Path) -> "Baseline":
        started = time.monotonic()
        git: dict[str, tuple[int, int]] = {}
        bits = set()
        seen: set[tuple[int, int]] = set()
        usage = 0
        shaped: set[tuple[int, int]] = set()
        for found in walk(workspace):
            key = (found.st.st_dev, found.st.st_ino)
            if key not in seen:
                seen.add(key)
                usage += found.st.st_blocks * 512
            if is_git_name(found.name):
                git[found.rel] = (found.st.st_dev, found.st.st_ino)
            if is_head_name(found.name) and git_shaped(found.dir_fd):
                parent = os.fstat(found.dir_fd)
                shaped.add((parent.st_dev, parent.st_ino))
                rel_parent = found.rel.rpartition("/")[0]
                if rel_parent:  # the user's own bare repository: kept, and mounted read-only like a .git
                    git[rel_parent] = (parent.st_dev, parent.st_ino)
            if found.st.st_mode & SPECIAL_BITS and not stat.S_ISLNK(found.st.st_mode):
                bits.add(found.rel)
        try:
            top = stat.S_ISDIR(os.lstat(workspace / ".git").st_mode)
        except OSError:
            top = False
        return cls(git, frozenset(bits), top, usage, time.monotonic() - started, frozenset(shaped))


class Moved(BaseModel):
    path: str
    kind: str  # git_dir | gitfile | git_head (the HEAD that made a directory a repository) | fifo | socket | device
    to: str | None = None  # where it went; None when only its record was kept (special files across devices)


class SweepReport(BaseModel):
    cleared_bits: list[str] = Field(default_factory=list)
    moved: list[Moved] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    took_s: float = 0.0

    def __bool__(self) -> bool:
        return bool(self.cleared_bits or self.moved or self.errors)

    def lines(self) -> list[str]:
        out = [f"cleared setuid/setgid on {p}" for p in self.cleared_bits]
        out += [f"moved {m.kind} {m.path} out of the workspace" + (f" to {m.to}" if m.to else " (record kept)") for m in self.moved]
        return out + [f"could not fix {e}" for e in self.errors]


@dataclass
class Sweeper:
    """Sweeps one workspace against its baseline; moved entries go under `quarantine`."""

    workspace: Path
    baseline: Baseline
    quarantine: Path
    placeholder_mountpoint: bool = False  # we mount an empty .git at the top: its mountpoint is ours
    reports: list[SweepReport] = field(default_factory=list)

    def sweep(self, shared: bool = False) -> SweepReport:
        """`shared`: other sandboxes still run on this workspace, so the top placeholder .git is
        still their mount point: leave it (removing or moving it would unmount it under them)."""
        started = time.monotonic()
        report = SweepReport()
        known = set(self.baseline.git_entries.values())
        shaped_before = self.baseline.git_shaped_dirs
        too_deep: list[str] = []
        self._batch = self.quarantine / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}"
        for found in walk(self.workspace, too_deep=too_deep):
            st, rel = found.st, found.rel
            # By identity, not by name: the user's own .git stays theirs wherever the box moved its
            # parent, and one the box put at a known path is still the box's.
            if is_git_name(found.name) and (st.st_dev, st.st_ino) not in known:
                if rel == ".git" and self.placeholder_mountpoint and stat.S_ISDIR(st.st_mode) and self._placeholder(found, shared):
                    continue
                self._move_out(found, "git_dir" if stat.S_ISDIR(st.st_mode) else "gitfile", report)
                continue
            if is_head_name(found.name) and git_shaped(found.dir_fd):
                parent = os.fstat(found.dir_fd)
                if (parent.st_dev, parent.st_ino) not in shaped_before:
                    self._move_out(found, "git_head", report)
                    continue
            kind = special_kind(st.st_mode)
            if kind:
                self._move_out(found, kind, report)
            elif st.st_mode & SPECIAL_BITS and not stat.S_ISLNK(st.st_mode) and rel not in self.baseline.special_bits:
                try:
                    _clear_bits(found)
                    report.cleared_bits.append(rel)
                except OSError as err:
                    report.errors.append(f"{rel}: {err.strerror}")
        report.errors += [f"{rel}: deeper than {MAX_DEPTH} levels, not checked" for rel in too_deep]
        report.took_s = round(time.monotonic() - started, 4)
        if report:
            self._write_manifest(report)
            self.reports.append(report)
        return report

    def _placeholder(self, found: Found, shared: bool) -> bool:
        """True when the top .git is our own empty mount point (then it is removed, unless shared)."""
        try:
            fd = os.open(found.name, _DIR_FLAGS, dir_fd=found.dir_fd)
        except OSError:
            return False
        try:
            if os.listdir(fd):
                return False
        except OSError:
            return False
        finally:
            os.close(fd)
        if not shared:
            try:
                os.rmdir(found.name, dir_fd=found.dir_fd)
            except OSError:
                pass
        return True

    def _move_out(self, found: Found, kind: str, report: SweepReport) -> None:
        try:
            report.moved.append(self._move(found, kind))
        except OSError as err:
            report.errors.append(f"{found.rel}: {err.strerror}")

    def _move(self, found: Found, kind: str) -> Moved:
        dest = self._batch / found.rel
        dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            os.rename(found.name, dest, src_dir_fd=found.dir_fd)
        except OSError as err:
            if err.errno != errno.EXDEV:  # the state directory is on another file system
                raise
            if kind in ("fifo", "socket", "device"):
                os.unlink(found.name, dir_fd=found.dir_fd)  # holds no data: its record is all there was
                return Moved(path=found.rel, kind=kind)
            _copy_out(found.dir_fd, found.name, dest)
            _remove_tree(found.dir_fd, found.name)
        _make_inert(dest)
        return Moved(path=found.rel, kind=kind, to=str(dest))

    def _write_manifest(self, report: SweepReport) -> None:
        self.quarantine.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.quarantine / "manifest.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"ts": round(time.time(), 3), **report.model_dump(mode="json")}) + "\n")


def _clear_bits(found: Found) -> None:
    """chmod through an O_PATH fd opened relative to the parent's fd: nothing can be swapped in."""
    fd = os.open(found.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=found.dir_fd)
    try:
        st = os.fstat(fd)
        if stat.S_ISLNK(st.st_mode):
            return
        os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode) & ~SPECIAL_BITS)
    finally:
        os.close(fd)


def _copy_out(dir_fd: int, name: str, dest: Path, depth: int = 0) -> None:
    """Copy a planted .git tree across file systems: regular files, dirs and links only."""
    st = os.lstat(name, dir_fd=dir_fd)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=dir_fd), dest)
    elif stat.S_ISREG(st.st_mode):
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        with os.fdopen(fd, "rb") as fin, open(dest, "xb") as fout:
            shutil.copyfileobj(fin, fout)
    elif stat.S_ISDIR(st.st_mode) and depth < MAX_DEPTH:
        dest.mkdir(mode=0o700)
        sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        try:
            for child in os.listdir(sub):
                _copy_out(sub, child, dest / child, depth + 1)
        finally:
            os.close(sub)


def _remove_tree(dir_fd: int, name: str) -> None:
    if stat.S_ISDIR(os.lstat(name, dir_fd=dir_fd).st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def _make_inert(path: Path) -> None:
    """Quarantined copies are the user's to inspect, never to run: no exec, no setuid bits. Every
    entry is reached through O_NOFOLLOW fds (a box still running on a shared workspace may hold a
    directory of it open and swap links in), and a file with other names (a hard link the box made
    to a workspace file) keeps its mode: chmod would change the user's file as well."""
    _inert(os.path.dirname(path), os.path.basename(path))
    if os.path.isdir(path) and not os.path.islink(path):
        for found in walk(path, enter=lambda f: True):
            _inert_at(found.dir_fd, found.name)


def _inert(parent: str, name: str) -> None:
    try:
        fd = os.open(parent, _DIR_FLAGS)
    except OSError:
        return
    try:
        _inert_at(fd, name)
    finally:
        os.close(fd)


def _inert_at(dir_fd: int, name: str) -> None:
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            os.chmod(f"/proc/self/fd/{fd}", 0o600)
        elif stat.S_ISDIR(st.st_mode):
            os.chmod(f"/proc/self/fd/{fd}", 0o700)
    except OSError:
        pass
    finally:
        os.close(fd)
