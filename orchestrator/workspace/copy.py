"""Copy mode: the box works on a private copy, so nothing touches the user's files until they apply.

The copy is taken before the box exists, from the user's real workspace, which may itself be a
hostile clone. It goes through the shared layer (orchestrator/boxfs): the walk is iterative and
bounded by a `HostBudget` (entries, bytes, depth, wall time), no symlink is followed (links are
copied as links), FIFOs, sockets and devices are left out (listed), setuid/setgid bits are
dropped, every entry is owned by the unprivileged sandbox uid. Data is cloned with FICLONE where
the file system can (no bytes), else only its data segments are copied, so holes stay holes; the
names of one inode (hard links) become names of one copy, never several full copies. The top
`.git` is not copied: the real one is mounted read-only, as in bind mode.

Before anything is copied, `measure_workspace` counts the tree with a bounded walk that stops as
soon as a limit is passed (`CopyLimits`: 2 GiB of data or 200,000 entries by default, raised by
--copy-max-bytes / --copy-max-entries or copy_max_bytes / copy_max_entries in config.toml): a run
started in /tmp or a home directory is refused in seconds (`WorkspaceTooLarge`, typed
RESOURCE_EXHAUSTED, one line naming what was found and the flag that raises the limit), and no
session directory is made. The copy itself keeps its own budget, twice the guard's limits and never
below COPY_MAX_* (the tree may grow between the count and the copy): a workspace that passes the
guard is not stopped half-way unless it grew.
One over that budget, or deeper than its depth (a partial copy would show the box, and the review,
a tree that is not the user's), is still refused, typed and naming the bound; the half-made copy
is removed. A caller may pass `progress`, called about twice a second while a copy runs.

The manifest records, for every entry, how the real file looked (so `apply` can tell that the
user changed it since) and how the copy looked (so `changes` can tell what the box changed). Its
keys are paths in `boxfs.to_store` form: valid text for the JSON store whatever bytes a name
holds (a newline, invalid UTF-8), and exactly one form per name (`boxfs.from_store` gives the
bytes back).
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

from pydantic import BaseModel, Field, PrivateAttr

from ..boxfs import (
    BoxDir,
    BudgetExceeded,
    HardLinks,
    HostBudget,
    Walk,
    copy_regular,
    kind_of,
    open_dir,
    remove_tree,
    show,
    to_store,
)
from ..boxfs.atomic import write_atomic
from ..errors import ErrorType, OpenAgentsError
from .copy_census import CopyCensus
from .integrity import Baseline

COPY_MAX_BYTES = 4 << 30  # data written by one copy (a reflink writes none)
COPY_MAX_ENTRIES = 500_000
COPY_MAX_DEPTH = 256  # a descriptor per level is held on each side: far below any fd limit
COPY_MAX_SECONDS = 300.0
GUARD_MAX_BYTES = 2 << 30  # the size guard's defaults: a bigger workspace is refused before any copying
GUARD_MAX_ENTRIES = 200_000

__all__ = [
    "COPY_MAX_BYTES",
    "COPY_MAX_DEPTH",
    "COPY_MAX_ENTRIES",
    "COPY_MAX_SECONDS",
    "GUARD_MAX_BYTES",
    "GUARD_MAX_ENTRIES",
    "CopyLimits",
    "CopyManifest",
    "CopyProgress",
    "ManifestEntry",
    "Stamp",
    "WorkspaceSize",
    "WorkspaceTooLarge",
    "copy_workspace",
    "kind_of",
    "measure_workspace",
]


class CopyProgress(NamedTuple):
    """A copy under way: entries copied and bytes of data written so far, of what the guard counted."""

    entries: int
    bytes: int
    total_entries: int  # 0: not counted
    elapsed_s: float
    done: bool = False


@dataclass(frozen=True)
class CopyLimits:
    """The size guard's limits, and who hears of a long copy's progress."""

    max_bytes: int = GUARD_MAX_BYTES
    max_entries: int = GUARD_MAX_ENTRIES
    progress: Callable[[CopyProgress], None] | None = None

    def copy_budget(self) -> HostBudget:
        """The copy's own stop, consistent with the guard: twice its limits, never below COPY_MAX_*."""
        return HostBudget.until(
            COPY_MAX_SECONDS,
            max_bytes=max(COPY_MAX_BYTES, 2 * self.max_bytes),
            max_entries=max(COPY_MAX_ENTRIES, 2 * self.max_entries + 16),
            max_depth=COPY_MAX_DEPTH,
        )


class WorkspaceSize(NamedTuple):
    """What the guard's walk counted (it stops as soon as a limit is passed: then these are lower bounds)."""

    entries: int
    bytes: int
    over: str | None  # "entries", "bytes", "depth", "time", or None: within the limits


class WorkspaceTooLarge(OpenAgentsError):
    def __init__(self, real: Path, size: WorkspaceSize, limits: CopyLimits) -> None:
        self.size = size
        found = f"{size.entries:,} entries and {_size(size.bytes)} of data"
        if size.over == "entries":
            what = (
                f"over {limits.max_entries:,} entries (stopped counting "
                f"at {found}); raise the limit with --copy-max-entries N"
            )
        elif size.over == "bytes":
            what = (
                f"over {_size(limits.max_bytes)} of data (stopped counting "
                f"at {found}); raise the limit with --copy-max-bytes SIZE"
            )
        elif size.over == "depth":
            what = f"a directory deeper than {COPY_MAX_DEPTH} levels (after {found})"
        else:
            what = f"more than {COPY_MAX_SECONDS:.0f} s to count ({found} so far)"
        super().__init__(
            ErrorType.RESOURCE_EXHAUSTED,
            f"copy mode refused the workspace {show(os.fsencode(real))} before copying anything: {what}, "
            "or run in bind mode (--workspace-mode bind) or from a smaller directory",
        )


def measure_workspace(real: Path, limits: CopyLimits, seconds: float = COPY_MAX_SECONDS) -> WorkspaceSize:
    """Count what a copy of `real` would take (entries, and data: allocated bytes, each inode once),
    as the copy walks it (no link followed, the top .git left out), stopping as soon as a limit is
    passed: a 16 GB /tmp is refused in seconds, not measured to its end."""
    budget = HostBudget.until(seconds, max_entries=limits.max_entries, max_bytes=None, max_depth=COPY_MAX_DEPTH)
    walk = Walk(real, budget, enter=lambda e: not (e.depth == 1 and e.name == b".git"))
    entries = data = 0
    seen: set[tuple[int, int]] = set()
    try:
        for entry in walk.entries():
            if entry.depth == 1 and entry.name == b".git":
                continue
            entries += 1
            st = entry.st
            if not stat.S_ISREG(st.st_mode):
                continue
            if st.st_nlink > 1:
                if entry.key in seen:
                    continue
                seen.add(entry.key)
            data += min(st.st_size, st.st_blocks * 512)
            if data > limits.max_bytes:
                return WorkspaceSize(entries, data, "bytes")
    except BudgetExceeded as err:
        over = {"entry": "entries", "wall-time": "time"}.get(err.what, err.what)
        return WorkspaceSize(max(entries, budget.entries_spent), data, over)
    return WorkspaceSize(entries, data, "depth" if walk.too_deep else None)


class Stamp(NamedTuple):
    """How one entry looked: enough to notice a change without reading the content."""

    kind: str
    mode: int
    size: int
    mtime_ns: int
    ino: int
    ctime_ns: int = 0  # 0: a manifest made before it was kept (the checkpoints' stat cache then never trusts it)

    @classmethod
    def of(cls, st: os.stat_result) -> "Stamp":
        return cls(kind_of(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)

    def same_as(self, other: "Stamp | None") -> bool:
        """Same kind, size, mtime and mode (the inode may differ: an atomic rewrite changes it)."""
        return other is not None and self[:4] == tuple(other)[:4]


class ManifestEntry(NamedTuple):
    real: Stamp  # the user's file when the copy was taken
    copy: Stamp  # the copy right after it was made


class CopyManifest(BaseModel):
    real: str
    copy_dir: str
    uid: int
    gid: int
    real_uid: int
    real_gid: int
    entries: dict[str, ManifestEntry] = Field(default_factory=dict)  # to_store(path) -> stamps
    left_out: dict[str, str] = Field(default_factory=dict)  # to_store(path) -> why it was not copied
    host_code: list[str] = Field(
        default_factory=list
    )  # to_store paths the host ran or imported from at the start: never landed (host_code.py)
    took_s: float = 0.0
    _groups: dict[int, int] | None = PrivateAttr(default=None)
    _census: CopyCensus | None = PrivateAttr(default=None)  # a fresh copy's baseline, counted as it was made

    def fresh_baseline(self, copy: Path) -> Baseline | None:
        """The integrity baseline of the copy this manifest was just made with (copy_census.py): no
        second walk of the tree on the first answer's path. None for a manifest read back from disk
        (a resumed session's copy was written by a box: it is walked)."""
        return self._census.baseline(copy) if self._census is not None else None

    def save(self, path: Path) -> None:
        write_atomic(path, self.model_dump_json(), mode=0o644)

    @classmethod
    def load(cls, path: Path) -> "CopyManifest":
        return cls.model_validate_json(path.read_text(encoding="utf-8"))

    def link_group(self, ino: int) -> int:
        """How many names the copy gave the inode `ino` of the copy (its hard links from the real tree)."""
        if self._groups is None:
            self._groups = {}
            for entry in self.entries.values():
                if entry.copy.kind == "file":
                    self._groups[entry.copy.ino] = self._groups.get(entry.copy.ino, 0) + 1
        return self._groups.get(ino, 0)


class _Dir(NamedTuple):
    rel: bytes
    fd: int  # the copy's directory
    mode: int
    times: tuple[int, int]


def _size(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def _too_big(real: Path, err: BudgetExceeded, budget: HostBudget) -> OpenAgentsError:
    what = {
        "byte": f"more than {_size(err.limit)} of data to copy",
        "entry": f"more than {int(err.limit)} entries",
        "wall-time": "longer to copy than its time budget",
        "depth": f"a directory deeper than {int(err.limit)} levels ('{getattr(err, 'where', '')}')",
    }.get(err.what, str(err))
    return OpenAgentsError(
        ErrorType.RESOURCE_EXHAUSTED,
        f"copy mode refused the workspace {real}: {what} (stopped after {budget.entries_spent} "
        "entries); run it in bind mode "
        "(--workspace-mode bind) or from a smaller directory",
    )


class _DepthExceeded(BudgetExceeded):
    def __init__(self, rel: bytes, limit: int) -> None:
        self.where = show(rel) if len(rel) <= 200 else show(rel[:200]) + "..."
        super().__init__("depth", limit, f"'{self.where}' is deeper")


def copy_workspace(
    real: Path,
    dest: Path,
    uid: int,
    gid: int,
    budget: HostBudget | None = None,
    reflinks: bool = True,
    progress: Callable[[CopyProgress], None] | None = None,
    total_entries: int = 0,
) -> CopyManifest:
    """Make `dest` (which must not exist) a private copy of `real`, owned by uid:gid, within `budget`
    (default: COPY_MAX_* and COPY_MAX_SECONDS). Over it: RESOURCE_EXHAUSTED, and no copy is left.
    `progress` hears how far it is about twice a second (`total_entries`: what the guard counted)."""
    started = time.monotonic()
    if budget is None:
        budget = HostBudget.until(
            COPY_MAX_SECONDS, max_bytes=COPY_MAX_BYTES, max_entries=COPY_MAX_ENTRIES, max_depth=COPY_MAX_DEPTH
        )
    last = [started]

    def tick(done: bool = False) -> None:
        now = time.monotonic()
        if progress is not None and (done or now - last[0] >= 0.5):
            last[0] = now
            progress(CopyProgress(len(manifest.entries), budget.bytes_spent, total_entries, now - started, done))

    st = os.stat(real)
    manifest = CopyManifest(
        real=str(real), copy_dir=str(dest), uid=uid, gid=gid, real_uid=st.st_uid, real_gid=st.st_gid
    )
    manifest._census = CopyCensus()
    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.mkdir(dest, 0o700)
    try:
        src_fd = open_dir(real)
        try:
            _copy(src_fd, dest, uid, gid, manifest, budget, reflinks, tick if progress is not None else None)
        finally:
            os.close(src_fd)
            tick(done=True)
    except BaseException as err:
        parent = open_dir(dest.parent)
        try:
            remove_tree(parent, dest.name, HostBudget(max_bytes=None, max_entries=None))
        finally:
            os.close(parent)
        if isinstance(err, BudgetExceeded):
            raise _too_big(real, err, budget) from None
        raise
    manifest.took_s = round(time.monotonic() - started, 4)
    return manifest


def _copy(
    src_fd: int,
    dest: Path,
    uid: int,
    gid: int,
    manifest: CopyManifest,
    budget: HostBudget,
    reflinks: bool,
    tick: Callable[[], None] | None = None,
) -> None:
    links = HardLinks()
    # the copy's directories on the path being walked, innermost last: finished (moded, owned,
    # timed) when the walk leaves them, since a directory's children all come right after it
    path: list[_Dir] = [_Dir(b"", BoxDir.open(dest, budget, last_nofollow=True).detach(), 0o755, (0, 0))]
    walk = Walk(src_fd, budget, enter=lambda e: not (e.depth == 1 and e.name == b".git"), sort=True)
    try:
        for entry in walk.entries():
            if entry.depth == 1 and entry.name == b".git":
                continue  # the real one is mounted read-only over the copy
            parent = entry.rel.rpartition(b"/")[0]
            while path[-1].rel != parent:
                _finish(path.pop(), uid, gid, manifest)
            dst = path[-1].fd
            into = BoxDir.at(dst, budget)
            key = to_store(entry.rel)
            kind = kind_of(entry.st.st_mode)
            if kind == "special":
                manifest.left_out[key] = "a FIFO, socket or device file"
                continue
            mode = stat.S_IMODE(entry.st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID)
            times = (entry.st.st_atime_ns, entry.st.st_mtime_ns)
            if kind == "symlink":
                into.symlink(BoxDir.at(entry.dir_fd).readlink(entry.name), entry.name)
                into.lchown(entry.name, uid, gid)
                into.lutime(entry.name, times)
                copied = into.lstat(entry.name)
            elif kind == "dir":
                if not budget.check_depth(entry.depth + 1):
                    raise _DepthExceeded(entry.rel, budget.max_depth)
                into.mkdir(entry.name, 0o700)
                sub = into.sub(entry.name).detach()
                path.append(_Dir(entry.rel, sub, mode, times))
                copied = os.fstat(sub)  # its stamp is taken again when it is finished
            else:
                try:
                    copied = copy_regular(
                        entry.dir_fd,
                        entry.name,
                        dst,
                        budget,
                        mode=mode,
                        uid=uid,
                        gid=gid,
                        times=times,
                        links=links,
                        reflinks=reflinks,
                        rel=entry.rel,
                    )
                except OpenAgentsError as err:  # swapped for something else since the walk saw it
                    if isinstance(err, BudgetExceeded):
                        raise
                    manifest.left_out[key] = f"it changed while being copied: {err}"
                    continue
            manifest.entries[key] = ManifestEntry(Stamp.of(entry.st), Stamp.of(copied))
            if kind != "dir" and manifest._census is not None:  # a directory is counted when it is finished
                manifest._census.add(entry.rel, copied)
            if tick is not None:
                tick()
        for rel, why in walk.unreadable:
            manifest.left_out[to_store(rel)] = f"could not be read: {why}"
        while len(path) > 1:
            _finish(path.pop(), uid, gid, manifest)
        os.fchmod(path[0].fd, 0o755)
        os.fchown(path[0].fd, uid, gid)
    finally:
        links.close()
        for d in path:
            os.close(d.fd)


def _finish(d: _Dir, uid: int, gid: int, manifest: CopyManifest) -> None:
    """A copied directory its children are all in: its mode, owner and times, and its stamp."""
    try:
        os.fchmod(d.fd, d.mode | stat.S_IRWXU)
        os.fchown(d.fd, uid, gid)
        os.utime(d.fd, ns=d.times)
        key = to_store(d.rel)
        st = os.fstat(d.fd)
        manifest.entries[key] = manifest.entries[key]._replace(copy=Stamp.of(st))
        if manifest._census is not None:
            manifest._census.add(d.rel, st)
    finally:
        os.close(d.fd)
