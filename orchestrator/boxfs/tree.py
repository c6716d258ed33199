"""`BoxDir`: one directory of a box-written tree, the handle every consumer acts through.

A `BoxDir` holds one directory descriptor, opened once (a trusted root by its path; everything
below it one O_NOFOLLOW component at a time from its parent's descriptor), and the `HostBudget`
its work is charged to. Every act on an entry in it (stat, list, open, read, readlink, mkdir,
rename, unlink, chmod, chown, atomic write, copy, remove, walk) is a method here, made relative
to that descriptor with the link-refusing flags of this package: no link is followed, no parent
can be swapped between a check and its use, names are bytes (str accepted, os.fsencode'd by the
kernel call), and the work is bounded by the budget (entries listed, bytes written, wall time).
Host code outside orchestrator/boxfs/ never spells openat, fstatat, `dir_fd=` or O_NOFOLLOW
itself (tests/architecture/test_boxfs_guard.py): when a rule changes, it changes here.

Errors are the kernel's (OSError: ENOTDIR or ELOOP for a link where a directory was wanted,
ENOENT), as the callers handled them before this handle existed; reads of file content refuse
with boxfs's typed UNSAFE_WORKSPACE_FILE (see read.py).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import TracebackType
from typing import Callable, Iterator

from ..errors import ErrorType, OpenAgentsError
from .budget import BudgetExceeded, HostBudget
from .copy import HardLinks, copy_regular, temp_name
from .names import show
from .read import DIR_FLAGS, Name, components, lstat_at, open_dir, open_parent, open_regular, read_at
from .restore import remove_tree, write_atomic
from .walk import Entry, Walk

_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class BoxDir:
    """A directory of a box-written tree (see the module docstring). Close it (or use `with`)
    when it owns its descriptor; one made by `at()` borrows a descriptor and closes nothing."""

    __slots__ = ("fd", "budget", "rel", "_owned")

    def __init__(self, fd: int, budget: HostBudget | None = None, rel: bytes = b"", *, owned: bool = True) -> None:
        self.fd, self.rel, self._owned = fd, rel, owned
        self.budget = budget if budget is not None else HostBudget()

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def open(
        cls, root: Path | str | bytes, budget: HostBudget | None = None, *, last_nofollow: bool = False
    ) -> "BoxDir":
        """The trusted root of a tree (the user's workspace, a copy's directory): its own path is
        the host's and opened normally (typed IO_ERROR when it cannot be); nothing below it is
        ever reached by path. `last_nofollow`: a directory we just made, whose last component
        must not be a link (OSError ELOOP, as the kernel says)."""
        if last_nofollow:
            return cls(os.open(root, DIR_FLAGS), budget)
        return cls(open_dir(root), budget)

    @classmethod
    def at(cls, fd: int, budget: HostBudget | None = None, rel: bytes = b"") -> "BoxDir":
        """A borrowed view of an open directory descriptor (a walk's parent, a caller's root)."""
        return cls(fd, budget, rel, owned=False)

    def sub(self, name: Name) -> "BoxDir":
        """The child directory `name`, opened O_NOFOLLOW|O_DIRECTORY: a symlink or a file raises ENOTDIR (or ELOOP)."""
        raw = name if isinstance(name, bytes) else os.fsencode(name)
        return BoxDir(os.open(name, DIR_FLAGS, dir_fd=self.fd), self.budget, self.rel + b"/" + raw if self.rel else raw)

    def sub_path(self, rel: Name) -> "BoxDir":
        """The directory at the relative path `rel` ("" or b"": a new handle of this one), each
        component opened O_NOFOLLOW from its parent (OSError as `sub`)."""
        if not rel:
            return BoxDir(os.dup(self.fd), self.budget, self.rel)
        parts = components(rel)
        if len(parts) > self.budget.max_depth:
            raise BudgetExceeded("depth", self.budget.max_depth, f"{len(parts)} levels")
        here = self.dup()
        try:
            for part in parts:
                nxt = here.sub(part)
                here.close()
                here = nxt
            return here
        except BaseException:
            here.close()
            raise

    def parent_of(self, rel: Name) -> tuple["BoxDir", bytes] | None:
        """(a handle of rel's parent, rel's last name), reached without following a link; None when
        a parent is missing or not a directory; a symlinked parent is refused, typed."""
        found = open_parent(self.fd, rel)
        if found is None:
            return None
        return BoxDir(found[0], self.budget), found[1]

    def dup(self) -> "BoxDir":
        return BoxDir(os.dup(self.fd), self.budget, self.rel)

    def detach(self) -> int:
        """The descriptor, now the caller's to close."""
        self._owned = False
        return self.fd

    def close(self) -> None:
        if self._owned and self.fd >= 0:
            os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> "BoxDir":
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def fileno(self) -> int:
        return self.fd

    # -- looking -------------------------------------------------------------------------------

    def lstat(self, name: Name) -> os.stat_result:
        """The entry itself (a link is not followed); OSError when it is not there."""
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def lstat_or_none(self, name: Name) -> os.stat_result | None:
        return lstat_at(self.fd, name)

    def exists(self, name: Name) -> bool:
        """Whether an entry (of any kind, a dangling link too) is there."""
        try:
            self.lstat(name)
        except OSError:
            return False
        return True

    def stat_self(self) -> os.stat_result:
        return os.fstat(self.fd)

    def names(self) -> list[bytes]:
        """The names in this directory, streamed and bounded by the budget's entries (a directory
        of millions of names is refused, typed, before it is held)."""
        out: list[bytes] = []
        cap = self.budget.max_entries
        with os.scandir(self.fd) as it:
            for item in it:
                out.append(os.fsencode(item.name))
                if cap is not None and len(out) > cap:
                    raise BudgetExceeded("entry", cap, f"{len(out)} names in one directory")
                if len(out) & 0xFFF == 0:
                    self.budget.check_time()
        return out

    def is_empty(self) -> bool:
        with os.scandir(self.fd) as it:
            return next(iter(it), None) is None

    def has_name(self, wanted: Callable[[bytes], bool]) -> bool:
        """Whether some name here passes `wanted`: streamed, stops at the first, nothing kept."""
        with os.scandir(self.fd) as it:
            return any(wanted(os.fsencode(item.name)) for item in it)

    def readlink(self, name: Name) -> bytes:
        """A symlink's target, read and never followed."""
        return os.readlink(name if isinstance(name, bytes) else os.fsencode(name), dir_fd=self.fd)

    def open_file(self, name: Name, rel: Name | None = None) -> tuple[int, os.stat_result]:
        """A read descriptor of the regular file `name` and its fstat (see read.open_regular)."""
        return open_regular(self.fd, name, rel)

    def read(self, name: Name, cap: int, rel: Name | None = None) -> tuple[bytes, os.stat_result]:
        """At most `cap` bytes of the regular file `name`, and the fstat of what was read."""
        return read_at(self.fd, name, cap, rel)

    def walk(
        self,
        *,
        enter: Callable[[Entry], bool] = lambda entry: True,
        sort: bool = False,
        budget: HostBudget | None = None,
    ) -> Walk:
        """A walk of the tree under this directory (boxfs.Walk: iterative, no link followed)."""
        return Walk(self.fd, budget if budget is not None else self.budget, enter, sort)

    def entries(self, **kw: object) -> Iterator[Entry]:
        return self.walk(**kw).entries()  # type: ignore[arg-type]

    # -- changing ------------------------------------------------------------------------------

    def mkdir(self, name: Name, mode: int = 0o700) -> None:
        os.mkdir(name, mode, dir_fd=self.fd)

    def rename(self, name: Name, new: Name, into: "BoxDir | None" = None) -> None:
        """Rename `name` to `new` in this directory, or in `into`; the entry is moved, never followed."""
        os.rename(name, new, src_dir_fd=self.fd, dst_dir_fd=(into or self).fd)

    def rename_out(self, name: Name, dest: Path | str) -> None:
        """Move the entry `name` to a host path of ours (a quarantine): a rename, never a copy."""
        os.rename(name, dest, src_dir_fd=self.fd)

    def unlink(self, name: Name) -> None:
        os.unlink(name, dir_fd=self.fd)

    def rmdir(self, name: Name) -> None:
        os.rmdir(name, dir_fd=self.fd)

    def symlink(self, target: Name, name: Name) -> None:
        os.symlink(target, name, dir_fd=self.fd)

    def lchown(self, name: Name, uid: int, gid: int) -> None:
        os.chown(name, uid, gid, dir_fd=self.fd, follow_symlinks=False)

    def lutime(self, name: Name, ns: tuple[int, int]) -> None:
        os.utime(name, ns=ns, dir_fd=self.fd, follow_symlinks=False)

    def chmod_entry(self, name: Name, mode_for: Callable[[os.stat_result], int | None]) -> None:
        """chmod the entry `name` (never a link's target) to mode_for(its fstat), unless that is
        None: through an O_PATH descriptor opened from this one, so nothing can be swapped in
        between the look and the change. OSError when it cannot be opened."""
        fd = os.open(name, _PATH_FLAGS, dir_fd=self.fd)
        try:
            st = os.fstat(fd)
            if stat.S_ISLNK(st.st_mode):
                return
            mode = mode_for(st)
            if mode is not None:
                os.chmod(f"/proc/self/fd/{fd}", mode)
        finally:
            os.close(fd)

    def create(self, name: Name, mode: int = 0o600) -> int:
        """A write descriptor of a new regular file `name` (O_EXCL: never an existing entry, never
        through a link)."""
        return os.open(name, _NEW_FILE, mode, dir_fd=self.fd)

    def write_atomic(
        self,
        name: Name,
        source: bytes | int,
        *,
        mode: int,
        uid: int | None = None,
        gid: int | None = None,
        times: tuple[int, int] | None = None,
        budget: HostBudget | None = None,
    ) -> os.stat_result:
        """See restore.write_atomic: a temporary name, fsync'd, renamed over `name`."""
        return write_atomic(
            self.fd,
            name,
            source,
            budget if budget is not None else self.budget,
            mode=mode,
            uid=uid,
            gid=gid,
            times=times,
        )

    def copy_in(
        self,
        src: "BoxDir",
        name: bytes,
        *,
        mode: int,
        uid: int | None = None,
        gid: int | None = None,
        times: tuple[int, int] | None = None,
        links: HardLinks | None = None,
        reflinks: bool = True,
        rel: bytes | None = None,
        budget: HostBudget | None = None,
    ) -> os.stat_result:
        """Copy the regular file src/name to a new entry `name` here (see copy.copy_regular)."""
        return copy_regular(
            src.fd,
            name,
            self.fd,
            budget if budget is not None else self.budget,
            mode=mode,
            uid=uid,
            gid=gid,
            times=times,
            links=links,
            reflinks=reflinks,
            rel=rel,
        )

    def replace_link(
        self,
        target: Name,
        name: Name,
        owner: tuple[int, int] | None = None,
        replaces_dir: bool = False,
        *,
        owner_required: bool = False,
    ) -> None:
        """Make `name` a symlink to `target` atomically: the link is made under a temporary name
        (owned as asked; where not permitted, left ours unless `owner_required`) and renamed over
        the entry, replacing a file or a link itself, never through it; an empty directory there
        is removed first when `replaces_dir`."""
        tmp = temp_name()
        self.symlink(target, tmp)
        try:
            if owner is not None:
                try:
                    self.lchown(tmp, *owner)
                except PermissionError:
                    if owner_required:
                        raise
            if replaces_dir:
                self.rmdir(name)
            self.rename(tmp, name)
        except BaseException:
            try:
                self.unlink(tmp)
            except OSError:
                pass
            raise

    def remove_tree(self, name: Name, budget: HostBudget | None = None) -> None:
        """Remove `name` and all under it (see restore.remove_tree: iterative, no link followed)."""
        remove_tree(self.fd, name, budget if budget is not None else self.budget)


def remove_path(path: Path | str) -> None:
    """Remove `path` and everything under it, as a tree the box may have written: iterative, no
    link followed (a link is removed, never its target), bounded by time only (a removal must
    finish); nothing there is not an error. shutil.rmtree's place for our trees (a scratch
    workspace, a shadow repository, a self-check's box)."""
    path = Path(path)
    try:
        with BoxDir.open(path.parent, HostBudget(max_entries=None, max_bytes=None)) as where:
            where.remove_tree(path.name)
    except (FileNotFoundError, OpenAgentsError):
        pass


def read_workspace_file(workspace: Path | str, rel: Name, cap: int) -> bytes:
    """The bytes of the regular file WORKSPACE/rel, at most `cap` of them, or a typed refusal:
    UNSAFE_WORKSPACE_FILE for a link anywhere on the path, a non-regular leaf or one over the cap;
    FILE_NOT_FOUND when nothing is there."""
    with BoxDir.open(workspace) as top:
        found = top.parent_of(rel)
    if found is None:
        raise OpenAgentsError(ErrorType.FILE_NOT_FOUND, f"workspace file '{show(rel)}' does not exist")
    with found[0] as parent:
        return parent.read(found[1], cap, rel)[0]


def lstat_workspace(workspace: Path | str, rel: Name) -> os.stat_result | None:
    """What is at `rel` (the entry itself), or None if nothing is; a symlinked parent is refused."""
    with BoxDir.open(workspace) as top:
        found = top.parent_of(rel)
    if found is None:
        return None
    with found[0] as parent:
        return parent.lstat_or_none(found[1])
