"""Apply's plan: what the sanitiser would carry, leave out or refuse, decided before any write.

Kept apart from the writes so `planned_changes` (batch's patch, a preview of apply) runs the very
rules apply runs, and cannot write: a change is decided from the copy alone, then checked against
the real workspace (one conflict and nothing is applied), then every symlink is resolved, lexically,
in the workspace as it will be after apply.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from typing import Literal

from ...boxfs import BoxDir, HostBudget, open_dir, to_store
from ..copy import COPY_MAX_DEPTH, CopyManifest, ManifestEntry, Stamp
from ..host_code import keep_out
from ..integrity import special_name
from .nofollow import _locate, _open_dir, _open_file, _readlink, _Where
from .report import ApplyReport, Conflict, LeftOut
from .scan import Change, _is_git, _scan, shown

MAX_SYMLINK_HOPS = 40  # as the kernel's ELOOP limit
_CHUNK = 1 << 20
TEMP_PREFIX = ".oa-apply-"  # what earlier versions named their temp files (boxfs.write_atomic: ".oa-<hex>.tmp")
_TEMP_RE = re.compile(r"\.oa-(?:apply-)?[0-9a-f]{16}\.tmp\Z")
_REPO_MAKERS = ("head", "commondir")  # the entries without which git takes no directory for a repository


def _same_content(fd_a: int, fd_b: int) -> bool:
    os.lseek(fd_a, 0, os.SEEK_SET)
    os.lseek(fd_b, 0, os.SEEK_SET)
    while True:
        a, b = os.read(fd_a, _CHUNK), os.read(fd_b, _CHUNK)
        if a != b:
            return False
        if not a:
            return True


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


class _Planner:
    """Apply's decisions and checks, from the copy and against the real workspace: what apply
    would do, with every left-out entry and every conflict in the report; nothing written but an
    interrupted apply's temp files removed (plan(clean=True))."""

    def __init__(self, manifest: CopyManifest, budget: HostBudget | None = None) -> None:
        self.m = manifest
        self.report = ApplyReport()
        self.budget = budget if budget is not None else HostBudget(max_depth=COPY_MAX_DEPTH)
        # What the host runs or imports from the workspace (host_code.py): now, and as the session's start recorded it.
        self.host_code = keep_out(manifest.real, manifest.host_code)
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
        held = self._host_code(change.path)
        if held is not None:
            self.leave(change.path, held)
            return None
        if after is None:
            return _Act(change.path, "delete", change, entry)
        if _TEMP_RE.match(change.path.rpartition("/")[2]):
            self.leave(change.path, "a name apply reserves for its own temp files is never carried")
            return None
        if after.kind == "special":
            self.leave(change.path, f"{special_name(change.fmt)} is never carried")
            return None
        if (
            after.kind != "dir"
            and change.path.rpartition("/")[2].casefold() in _REPO_MAKERS
            and self._makes_repository(change.path)
        ):
            self.leave(
                change.path,
                "it would make its directory a repository git obeys (HEAD "
                "with objects/ and refs/, or a commondir): never carried",
            )
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

    def _host_code(self, rel: str) -> str | None:
        """Why a change at `rel` is never carried, when it lies at, under or above a path the host
        runs or imports from (a .pth in its venv, its entry script, its editable clone, its config)."""
        for path, what in self.host_code.items():
            if rel == path or rel.startswith(path + "/") or path.startswith(rel + "/") or not path:
                return (
                    "the host runs or imports from "
                    f"{shown(path) if path else 'the workspace itself'} ({what}): never carried"
                )
        return None

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
                names |= {os.fsdecode(n).casefold() for n in BoxDir.at(fd).names()}
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
                    self.conflict(
                        rel,
                        f"{shown(where.blocker)} is {where.blocker_kind} in the real workspace now; it was a directory",
                    )
                else:
                    self.leave(
                        rel,
                        f"{shown(where.blocker)} is {where.blocker_kind} in the real workspace, never written through",
                    )
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
            self.conflict(
                rel,
                "changed in the real workspace since the copy was taken"
                if expected
                else "added in the box, but the real workspace has it now too",
            )
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
            names = [to_store(n) for n in BoxDir.at(fd).names()]
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
        dirs = {c.path.rpartition("/")[0] for c in changes} | {
            c.path for c in changes if c.after and c.after.kind == "dir"
        }
        for rel in sorted(dirs):
            try:
                fd = _open_dir(self.real_fd, rel)
            except OSError:
                continue
            here = BoxDir.at(fd)
            try:
                for name in here.names():
                    if _TEMP_RE.match(os.fsdecode(name)):
                        try:
                            if not stat.S_ISDIR(here.lstat(name).st_mode):
                                here.unlink(name)
                        except OSError:
                            pass
            finally:
                os.close(fd)


def planned_changes(manifest: CopyManifest, budget: HostBudget | None = None) -> tuple[list[Change], ApplyReport]:
    """What `apply_changes` would carry now, without writing anything: the changes it would apply
    (for render_diff: the patch as the sanitiser would land it) and its report, with what it would
    leave out and any conflict (then it would apply nothing)."""
    applier = _Planner(manifest, budget)
    try:
        acts = applier.plan(clean=False)
        return ([] if applier.report.conflicts else [a.change for a in acts]), applier.report
    finally:
        applier.close()
