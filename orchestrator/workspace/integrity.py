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
  user's next `git log`). In such a directory that was not one at the start, HEAD is moved out.

Moving out is a rename, never a copy: the sweep writes no data, so a sparse file of terabytes or
a thousand hard links of one inode cost nothing. When the state directory is on another file
system (the rename fails with EXDEV), the entry is defused where it is instead: renamed to an
inert name (`.oa-quarantined-<batch>-<n>`), every `.git` and HEAD name inside it renamed too (so
neither the user's git nor the next session's baseline takes any of it for a repository), its
files set to mode 0; the report says where. A FIFO, socket or device holds no data: across file
systems it is removed and its record (type, path) kept.

Every walk is boxfs's (iterative, fd-relative, no link followed) under a `HostBudget`: a sweep
that cannot finish within it says so (`SweepReport.unfinished`, typed), it never reports clean.
A host killed before its sweep (OOM, SIGKILL, power loss) leaves a journal (sandbox/sweep_journal.py)
that the next command completes, and that sweep_journal.capture_baseline completes before a baseline.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ..boxfs import BoxDir, BudgetExceeded, Entry, HostBudget, Walk, from_store, show, to_store
from ..errors import ErrorType, OpenAgentsError

SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID


def is_git_name(name: str) -> bool:
    return name.casefold() == ".git"


def is_head_name(name: str) -> bool:
    return name.casefold() == "head"


def git_shaped(dir_fd: int) -> bool:
    """Whether git's discovery takes the directory behind dir_fd for a git directory (setup.c,
    is_git_directory): HEAD plus objects/ and refs/, or HEAD plus a `commondir` file that points at
    them. By names only (any case, for case-insensitive disks), without reading anything; called
    only where a HEAD entry was met, so it costs nothing on ordinary trees."""
    try:
        names = {os.fsdecode(n).casefold() for n in BoxDir.at(dir_fd).names()}
    except (OSError, BudgetExceeded):
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


def _key(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _not_a_repo_dir(entry: Entry) -> bool:
    return not is_git_name(entry.name_text)


@dataclass(frozen=True)
class Baseline:
    """What the workspace held at the start, before the box could write anything."""

    git_entries: dict[
        str, tuple[int, int]
    ]  # every .git entry (dir or file), and every directory git takes for a repository (bare): path -> (st_dev, st_ino)
    special_bits: frozenset[str]  # paths that already carried setuid/setgid (the user's own)
    top_git_dir: bool  # WORKSPACE/.git is a real directory (not a symlink, not a gitfile)
    usage_bytes: int  # allocated outside the .git entries: where the write quota starts from
    took_s: float
    git_shaped_dirs: frozenset[tuple[int, int]] = (
        frozenset()
    )  # (st_dev, st_ino) of directories git took for a repository at the start, the root included
    entries: int = 0  # entries outside the .git entries: where the entry quota starts from
    unchecked: tuple[str, ...] = ()  # directories the walk could not enter (too deep, unreadable), shown

    @classmethod
    def _capture(cls, workspace: Path, budget: HostBudget | None = None) -> "Baseline":
        """The walk alone. A session's baseline comes from sweep_journal.capture_baseline, which
        first completes a sweep still pending for the workspace (the journal needs this module,
        so the step that needs the journal lives there)."""
        started = time.monotonic()
        git: dict[str, tuple[int, int]] = {}
        bits = set()
        seen: set[tuple[int, int]] = set()
        usage = 0
        shaped: set[tuple[int, int]] = set()
        walker = Walk(Path(workspace), budget or HostBudget(), enter=_not_a_repo_dir)
        count = 0
        for entry in walker.entries():
            count += 1
            key = entry.key
            if key not in seen:
                seen.add(key)
                usage += entry.st.st_blocks * 512
            if is_git_name(entry.name_text):
                git[entry.text] = key
            if is_head_name(entry.name_text) and git_shaped(entry.dir_fd):
                parent = os.fstat(entry.dir_fd)
                shaped.add(_key(parent))
                rel_parent = entry.text.rpartition("/")[0]
                if rel_parent:  # the user's own bare repository: kept, and mounted read-only like a .git
                    git[rel_parent] = _key(parent)
            if entry.st.st_mode & SPECIAL_BITS and not stat.S_ISLNK(entry.st.st_mode):
                bits.add(entry.text)
        try:
            top = stat.S_ISDIR(os.lstat(Path(workspace) / ".git").st_mode)
        except OSError:
            top = False
        unchecked = tuple(show(rel) for rel in walker.too_deep) + tuple(show(rel) for rel, _ in walker.unreadable)
        return cls(git, frozenset(bits), top, usage, time.monotonic() - started, frozenset(shaped), count, unchecked)

    def to_json(self) -> dict[str, Any]:
        """A lossless JSON form (names through boxfs.to_store) for the pending-sweep journal."""
        return {
            "git_entries": [[to_store(os.fsencode(rel)), dev, ino] for rel, (dev, ino) in self.git_entries.items()],
            "special_bits": [to_store(os.fsencode(rel)) for rel in sorted(self.special_bits)],
            "top_git_dir": self.top_git_dir,
            "usage_bytes": self.usage_bytes,
            "took_s": self.took_s,
            "git_shaped_dirs": [list(key) for key in sorted(self.git_shaped_dirs)],
            "entries": self.entries,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Baseline":
        return cls(
            {os.fsdecode(from_store(rel)): (int(dev), int(ino)) for rel, dev, ino in data["git_entries"]},
            frozenset(os.fsdecode(from_store(rel)) for rel in data["special_bits"]),
            bool(data["top_git_dir"]),
            int(data["usage_bytes"]),
            float(data["took_s"]),
            frozenset((int(dev), int(ino)) for dev, ino in data["git_shaped_dirs"]),
            int(data.get("entries", 0)),
        )


class Moved(BaseModel):
    path: str  # workspace-relative, boxfs.to_store form (lossless, valid UTF-8)
    kind: str  # git_dir | gitfile | git_head (the HEAD that made a directory a repository) | fifo | socket | device
    to: str | None = None  # where it went; None when only its record was kept (special files across devices)
    in_place: bool = (
        False  # defused where it was (renamed inert in the workspace): the state directory is on another file system
    )


class SweepReport(BaseModel):
    cleared_bits: list[str] = Field(default_factory=list)
    moved: list[Moved] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    unfinished: str | None = None  # why the sweep did not check everything (then it never counts as clean)
    error_type: str | None = None  # the ErrorType of `unfinished`
    took_s: float = 0.0

    @property
    def complete(self) -> bool:
        return self.unfinished is None

    def __bool__(self) -> bool:
        return bool(self.cleared_bits or self.moved or self.errors or self.unfinished)

    def lines(self) -> list[str]:
        out = [f"cleared setuid/setgid on {_shown(p)}" for p in self.cleared_bits]
        for m in self.moved:
            if m.in_place:
                out.append(
                    f"defused {m.kind} {_shown(m.path)} in place (renamed to "
                    f"{_shown(m.to or '')}, mode 0: the state directory is on another file system)"
                )
            else:
                out.append(
                    f"moved {m.kind} {_shown(m.path)} out of the workspace"
                    + (f" to {m.to}" if m.to else " (record kept)")
                )
        out += [f"could not fix {e}" for e in self.errors]
        if self.unfinished:
            out.append(
                f"{self.error_type}: the sweep did not finish, the workspace is NOT known clean: {self.unfinished}"
            )
        return out


def _shown(stored: str) -> str:
    return show(from_store(stored))


@dataclass
class Sweeper:
    """Sweeps one workspace against its baseline; moved entries go under `quarantine`."""

    workspace: Path
    baseline: Baseline
    quarantine: Path
    placeholder_mountpoint: bool = False  # we mount an empty .git at the top: its mountpoint is ours
    reports: list[SweepReport] = field(default_factory=list)

    def sweep(self, shared: bool = False, budget: HostBudget | None = None) -> SweepReport:
        """`shared`: other sandboxes still run on this workspace, so the top placeholder .git is
        still their mount point: leave it (removing or moving it would unmount it under them).
        `budget`: bounds the sweep's host work (default: boxfs's defaults, no clock); a sweep that
        passes it says so in `unfinished`, typed."""
        started = time.monotonic()
        report = SweepReport()
        budget = budget or HostBudget()
        known = set(self.baseline.git_entries.values())
        self._batch_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}"
        self._batch = self.quarantine / self._batch_id
        self._moved: set[tuple[int, int]] = set()
        self._count = 0
        walker = Walk(self.workspace, budget, enter=lambda e: _not_a_repo_dir(e) and e.key not in self._moved)
        try:
            for entry in walker.entries():
                self._check(entry, known, shared, report, budget)
        except BudgetExceeded as err:
            report.unfinished, report.error_type = err.message, err.type.value
        except OpenAgentsError as err:  # the workspace itself cannot be opened
            report.unfinished, report.error_type = err.message, err.type.value
        report.errors += [f"{show(rel)}: deeper than {budget.max_depth} levels, not checked" for rel in walker.too_deep]
        report.errors += [f"{show(rel)}: {why}, not checked" for rel, why in walker.unreadable]
        if report.unfinished is None and not walker.complete:
            report.unfinished = f"{len(walker.too_deep) + len(walker.unreadable)} director(ies) could not be checked"
            report.error_type = ErrorType.RESOURCE_EXHAUSTED.value if walker.too_deep else ErrorType.IO_ERROR.value
        report.took_s = round(time.monotonic() - started, 4)
        if report:
            self._write_manifest(report)
            self.reports.append(report)
        return report

    def _check(
        self, entry: Entry, known: set[tuple[int, int]], shared: bool, report: SweepReport, budget: HostBudget
    ) -> None:
        st, rel = entry.st, entry.rel
        # By identity, not by name: the user's own .git stays theirs wherever the box moved its
        # parent, and one the box put at a known path is still the box's.
        if is_git_name(entry.name_text) and entry.key not in known:
            if (
                rel == b".git"
                and self.placeholder_mountpoint
                and stat.S_ISDIR(st.st_mode)
                and self._placeholder(entry, shared)
            ):
                return
            self._move_out(entry, "git_dir" if stat.S_ISDIR(st.st_mode) else "gitfile", report, budget)
            return
        if is_head_name(entry.name_text) and git_shaped(entry.dir_fd):
            if _key(os.fstat(entry.dir_fd)) not in self.baseline.git_shaped_dirs:
                self._move_out(entry, "git_head", report, budget)
                return
        kind = special_kind(st.st_mode)
        if kind:
            self._move_out(entry, kind, report, budget)
        elif (
            st.st_mode & SPECIAL_BITS and not stat.S_ISLNK(st.st_mode) and entry.text not in self.baseline.special_bits
        ):
            try:
                _clear_bits(entry.dir_fd, entry.name)
                report.cleared_bits.append(to_store(rel))
            except OSError as err:
                report.errors.append(f"{show(rel)}: {err.strerror}")

    def _placeholder(self, entry: Entry, shared: bool) -> bool:
        """True when the top .git is our own empty mount point (then it is removed, unless shared)."""
        parent = BoxDir.at(entry.dir_fd)
        try:
            top = parent.sub(entry.name)
        except OSError:
            return False
        try:
            if not top.is_empty():
                return False
        except OSError:
            return False
        finally:
            top.close()
        if not shared:
            try:
                parent.rmdir(entry.name)
            except OSError:
                pass
        return True

    def _move_out(self, entry: Entry, kind: str, report: SweepReport, budget: HostBudget) -> None:
        self._moved.add(entry.key)
        try:
            report.moved.append(self._move(entry, kind, budget))
        except OSError as err:
            report.errors.append(f"{show(entry.rel)}: {err.strerror}")

    def _move(self, entry: Entry, kind: str, budget: HostBudget) -> Moved:
        """A rename, never a copy: into the quarantine when it is on the workspace's file system,
        else (EXDEV) defused where it is."""
        rel = entry.text
        dest = self._batch / rel
        dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        parent = BoxDir.at(entry.dir_fd)
        try:
            parent.rename_out(entry.name, dest)
        except OSError as err:
            if err.errno != errno.EXDEV:  # the state directory is on another file system
                raise
            if kind in ("fifo", "socket", "device"):
                parent.unlink(entry.name)  # holds no data: its record is all there was
                return Moved(path=to_store(entry.rel), kind=kind)
            return self._defuse_in_place(entry, kind, budget)
        _make_inert(dest, budget)
        return Moved(path=to_store(entry.rel), kind=kind, to=str(dest))

    def _defuse_in_place(self, entry: Entry, kind: str, budget: HostBudget) -> Moved:
        self._count += 1
        inert = f".oa-quarantined-{self._batch_id}-{self._count}".encode()
        here = BoxDir.at(entry.dir_fd, budget)
        if here.exists(inert):
            raise OSError(errno.EEXIST, f"{show(inert)} exists already")
        here.rename(entry.name, inert)
        _defuse(here, inert, self._batch_id)
        parent = entry.rel.rpartition(b"/")[0]
        where = parent + b"/" + inert if parent else inert
        return Moved(path=to_store(entry.rel), kind=kind, to=to_store(where), in_place=True)

    def _write_manifest(self, report: SweepReport) -> None:
        self.quarantine.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.quarantine / "manifest.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"ts": round(time.time(), 3), **report.model_dump(mode="json")}) + "\n")


def _clear_bits(dir_fd: int, name: bytes) -> None:
    """chmod through an O_PATH fd opened relative to the parent's fd (BoxDir.chmod_entry): nothing can be swapped in."""
    BoxDir.at(dir_fd).chmod_entry(name, lambda st: stat.S_IMODE(st.st_mode) & ~SPECIAL_BITS)


def _defuse(parent: BoxDir, name: bytes, batch: str) -> None:
    """Make parent/name (just renamed to an inert name, still in the workspace) harmless where it
    is: its files mode 0 (setuid gone, nothing to run or read), and every `.git` and HEAD name in
    it renamed, so no directory of it is a repository to git's discovery or to a later baseline.
    Renames only: nothing is copied or deleted."""
    suffix = f".oa-defused-{batch}".encode()
    _inert_at(parent, name, mode_file=0)
    try:
        top = parent.sub(name)
    except OSError:
        return  # not a directory (a gitfile, a HEAD file): done
    with top:
        later: list[bytes] = []  # directories with a git name: renamed after the walk, deepest first
        for entry in top.entries():
            here = BoxDir.at(entry.dir_fd)
            _inert_at(here, entry.name, mode_file=0)
            if is_git_name(entry.name_text) or is_head_name(entry.name_text):
                if entry.is_dir:
                    later.append(entry.rel)
                else:
                    here.rename(entry.name, entry.name + suffix)
        for rel in sorted(later, key=lambda r: r.count(b"/"), reverse=True):
            found = top.parent_of(rel)
            if found is None:
                continue
            with found[0] as where:
                where.rename(found[1], found[1] + suffix)


def _make_inert(path: Path, budget: HostBudget) -> None:
    """Quarantined entries are the user's to inspect, never to run: no exec, no setuid bits. Every
    entry is reached through O_NOFOLLOW fds (a box still running on a shared workspace may hold a
    directory of it open and swap links in), and a file with other names (a hard link the box made
    to a workspace file) keeps its mode: chmod would change the user's file as well."""
    try:
        parent = BoxDir.open(path.parent, budget)
    except OpenAgentsError:
        return
    with parent:
        _inert_at(parent, os.fsencode(path.name))
        try:
            top = parent.sub(os.fsencode(path.name))
        except OSError:
            return
        with top:
            for entry in top.entries():
                _inert_at(BoxDir.at(entry.dir_fd), entry.name)


def _inert_at(parent: BoxDir, name: bytes, mode_file: int = 0o600) -> None:
    try:
        parent.chmod_entry(name, lambda st: _inert_mode(st, mode_file))
    except OSError:
        pass


def _inert_mode(st: os.stat_result, mode_file: int) -> int | None:
    if stat.S_ISDIR(st.st_mode):
        return 0o700
    if st.st_nlink == 1 or not stat.S_ISREG(st.st_mode):
        return mode_file
    if st.st_mode & SPECIAL_BITS:  # another name is the user's: only the bits the box may have set go
        return stat.S_IMODE(st.st_mode) & ~SPECIAL_BITS
    return None
