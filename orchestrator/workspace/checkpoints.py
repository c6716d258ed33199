"""Checkpoints: the workspace after each turn, in a shadow object store outside it, and rollback.

The store is a bare libgit2 repository in the session's state directory (as Gemini CLI keeps a
shadow repository); the workspace needs no `.git` and its own `.git` is never read or touched.
Everything in the workspace was written by the box, so the store is never steered by it, and
every walk, read and write of the workspace goes through `boxfs` (iterative, fd-relative, no
link followed, bounded by a `HostBudget`):

- blobs are made from the bytes boxfs read (libgit2 never opens a workspace path, so no filter,
  attribute or config of the box applies); symlinks are stored as links (their target is data);
  FIFOs, sockets, devices, files over the size cap and files or directories the sandbox user
  could not read by their mode and owner are listed as skipped, never silently left out (and a
  file the box could not read is never put into the store);
- names are kept in trees in `boxfs.to_store` form, so a name with invalid UTF-8 is stored and
  restored exactly; each file's and directory's exact permission bits and owner are kept beside
  the tree (a JSON blob named by the checkpoint) and restored exactly, never wider;
- every `.git` entry (any case) is neither recorded nor touched by restore, and restore never
  brings back the HEAD or commondir of a directory that would then be a bare repository the
  user's git obeys (the sweep defused it at session end);
- the store's real growth on disk (blobs, trees, commits, each loose object's blocks) is bounded:
  objects written are charged as they are written, loose objects are packed after each record and
  the store's allocated bytes are measured; past `budget_bytes` the checkpoint is skipped, typed
  (state "skipped", resource_exhausted), never silently;
- a checkpoint that fails (any error) is kept in the index as state "failed" with its error type:
  what changed since the last good checkpoint is then unknown, and summary, `sessions` and
  `checkpoints` say so instead of "no files changed"; the next record walks everything;
- restore refuses to overwrite what changed since the store last knew the workspace (the last
  record or restore): every conflict is listed and nothing is changed; files are written
  atomically, holes kept, with the recorded mode and owner.

Thread-safe: record, restore and close hold one lock; turns are assigned when the record runs,
strictly increasing (a turn number not after the last is moved past it).

Speed: a plain lstat of every file of a 10k-file workspace costs 50-60 ms on our machine, over the
50 ms a checkpoint may take. So after the first full walk the store keeps inotify watches on
every directory it walked (added through /proc/self/fd of an O_NOFOLLOW directory fd, before the
directory is listed, so nothing between a listing and the next record is missed) and the next
record re-reads only the entries named in events; trees of untouched directories are reused by
oid. The events are hints only: every path they name is re-walked by the same rules. A full walk
(with a stat cache, so unchanged files are not re-read) replaces the hints whenever they could be
incomplete: queue overflow, a directory moved, a new hard link, no inotify, a new process, a
failed record. Known limit: a write through a shared memory mapping raises no inotify event, so a
box that writes that way can keep a middle checkpoint from seeing the change until the next full
walk; turn 0 and restore always walk everything.
"""
from __future__ import annotations

import builtins
import ctypes
import errno
import json
import os
import stat
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Literal, TypeVar

import pygit2
from pydantic import BaseModel, Field
from pygit2.enums import RepositoryOpenFlag

from ..boxfs import BudgetExceeded, HostBudget, Walk, from_store, lstat_at, open_dir, read_at, show, to_store, write_atomic
from ..boxfs.copy import temp_name
from ..boxfs.read import DIR_FLAGS
from ..errors import ErrorType, OpenAgentsError
from .integrity import is_git_name, special_kind, special_name

MODE_FILE, MODE_EXEC, MODE_LINK, MODE_TREE = 0o100644, 0o100755, 0o120000, 0o040000
INDEX_NAME = "checkpoints.json"
INDEX_CAP = 64 << 20  # the index is ours, but bounded all the same
CHANGED_LIST_CAP = 1000  # paths listed per checkpoint; files_changed_count has the whole number
SIGNATURE = ("openagents-sandbox", "checkpoints@localhost")
RACY_NS = 50_000_000  # a stat taken this close to a change may not show the next one (coarse clock)
BLOCK = 4096  # what one loose object costs at least on disk
OBJECT_OVERHEAD = 64  # header and compression framing of one object, counted generously
PACKS_BEFORE_REPACK = 32
SMALL_LOOSE = 64 << 10  # blobs of this size or more are never packed: they stay loose files
PACK_EVERY = 32 << 20  # loose bytes a record may have at once before they are packed (at most a quarter of the budget)
NOT_READABLE = "not readable by the sandbox user (never stored)"

_Meta = tuple[int, int, int]  # (permission bits, uid, gid)


class Skipped(BaseModel):
    path: str  # boxfs.to_store form (lossless); show(from_store(path)) for people
    reason: str


class Conflict(BaseModel):
    path: str
    reason: str


class Checkpoint(BaseModel):
    turn: int
    commit: str = ""  # empty unless state is "ok"
    created: float
    state: Literal["ok", "skipped", "failed"] = "ok"  # skipped: over the store budget; failed: an error
    error_type: str | None = None  # an ErrorType value when not ok
    error: str = ""
    files_changed: list[str] = Field(default_factory=list)  # vs the previous good checkpoint (or restored state)
    files_changed_count: int = 0
    skipped: list[Skipped] = Field(default_factory=list)
    meta: str | None = None  # the blob of exact modes and owners; None: an older checkpoint (0644/0755, workspace owner)
    names: Literal["raw", "store"] = "raw"  # how names are kept in the tree (store: boxfs.to_store)

    @property
    def ok(self) -> bool:
        return self.state == "ok"


class RestoreReport(BaseModel):
    restored: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    skipped: list[Skipped] = Field(default_factory=list)
    conflicts: list[Conflict] = Field(default_factory=list)  # any: nothing was changed


class _Index(BaseModel):
    version: int = 2
    head: str | None = None  # the commit the workspace was last known to equal (recorded or restored)
    used_bytes: int = 0  # the store's allocated bytes on disk after the last record: what the budget counts
    checkpoints: list[Checkpoint] = Field(default_factory=list)


def unknown_changes(points: list[Checkpoint]) -> str | None:
    """Why what the session changed is unknown (its last checkpoint is not a good one), or None."""
    if points and not points[-1].ok:
        last = points[-1]
        what = "skipped" if last.state == "skipped" else "failed"
        return f"the checkpoint after turn {last.turn} {what} ({last.error_type}): {last.error}"
    return None


def shown_path(path: str, point: Checkpoint) -> str:
    """A path of a checkpoint's lists, for people (escaped by boxfs.show)."""
    return show(from_store(path)) if point.names == "store" else show(path)


def store_unknown(store: Path) -> str | None:
    """unknown_changes() of the store at `store`, read from its index alone (None: no index)."""
    path = Path(store) / INDEX_NAME
    try:
        with open(path, "rb") as fh:
            raw = fh.read(INDEX_CAP + 1)
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"the checkpoint index cannot be read: {err.strerror}"
    try:
        return unknown_changes(_Index.model_validate_json(raw[:INDEX_CAP]).checkpoints)
    except ValueError:
        return "the checkpoint index is not valid"


class _StoreFull(Exception):
    def __init__(self, budget: int, used: int) -> None:
        super().__init__(f"the checkpoint store's budget of {budget} bytes on disk is spent ({used} bytes with this checkpoint)")


# --- inotify (hints only) -------------------------------------------------------------------

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_Q_OVERFLOW, IN_IGNORED = 0x400, 0x800, 0x4000, 0x8000
IN_ONLYDIR, IN_EXCL_UNLINK, IN_ISDIR = 0x01000000, 0x04000000, 0x40000000
_WATCH_MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
               | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_EXCL_UNLINK)
_EVENT = struct.Struct("iIII")


class _Watcher:
    """One inotify instance. `broken` once anything was or may have been lost: then a full walk."""

    def __init__(self) -> None:
        self.fd = -1
        self.broken = False
        try:
            self._libc = ctypes.CDLL(None, use_errno=True)
            self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):
            self.fd = -1
        if self.fd < 0:
            self.fd, self.broken = -1, True

    def add(self, dir_fd: int) -> int:
        """Watch the directory open as dir_fd (its inode, not a path the box could swap)."""
        if self.fd < 0:
            return -1
        wd: int = self._libc.inotify_add_watch(self.fd, f"/proc/self/fd/{dir_fd}".encode(), _WATCH_MASK)
        if wd < 0:
            self.broken = True  # ENOSPC (watch limit) and the like: no hints for this directory
        return wd

    def remove(self, wd: int) -> None:
        if self.fd >= 0 and wd >= 0:
            self._libc.inotify_rm_watch(self.fd, wd)

    def drain(self) -> list[tuple[int, int, str]]:
        out: list[tuple[int, int, str]] = []
        while self.fd >= 0:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError:
                self.broken = True
                break
            off = 0
            while off + _EVENT.size <= len(buf):
                wd, mask, _cookie, size = _EVENT.unpack_from(buf, off)
                raw = buf[off + _EVENT.size: off + _EVENT.size + size].split(b"\0", 1)[0]
                off += _EVENT.size + size
                if mask & IN_Q_OVERFLOW:
                    self.broken = True
                out.append((wd, mask, os.fsdecode(raw)))
        return out

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# --- the in-memory picture of the last walk ----------------------------------------------------

_Key = tuple[int, int, int, int, int]  # (st_mode, st_ino, st_size, st_mtime_ns, st_ctime_ns): the stat cache's key
_File = tuple[_Key | None, int, pygit2.Oid, _Meta]  # a file's (key, git mode, oid, exact mode and owner)


def _ts(name: str) -> str:
    """boxfs.to_store of an os.fsdecode name, with a fast path for the plain ASCII ones."""
    return name if name.isascii() and "\\" not in name else to_store(name)


def _key(st: os.stat_result) -> _Key:
    return (st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _meta(st: os.stat_result) -> _Meta:
    return (st.st_mode & 0o777, st.st_uid, st.st_gid)


@dataclass(eq=False)
class _Dir:
    rel: str  # os.fsdecode form (lone surrogates for invalid bytes): round-trips exactly
    ino: int
    parent: "_Dir | None"
    meta: _Meta = (0o755, -1, -1)
    wd: int = -1
    files: dict[str, _File] = field(default_factory=dict)  # name -> (key, mode, oid, meta)
    dirs: dict[str, "_Dir"] = field(default_factory=dict)
    skipped: dict[str, tuple[_Key | None, str]] = field(default_factory=dict)  # name -> (key, reason)
    tree: pygit2.Oid | None = None
    old: "_Dir | None" = None  # during a walk only: the same directory's last picture (the stat cache)
    odd: dict[str, list[int]] | None = None  # this directory's part of the modes blob, until it changes

    def child_rel(self, name: str) -> str:
        return f"{self.rel}/{name}" if self.rel else name

    @property
    def depth(self) -> int:
        return self.rel.count("/") + 1 if self.rel else 0

    def all_dirs(self) -> Iterable["_Dir"]:
        stack = [self]
        while stack:
            d = stack.pop()
            yield d
            stack.extend(d.dirs.values())


class _NeedFull(Exception):
    """The hints cannot be trusted for this record: walk everything."""


class CheckpointStore:
    """Checkpoints of one workspace in the bare repository `store` (created if missing).

    `budget_bytes` bounds the store's real size on disk; `max_file_bytes` a file's. `box_user`
    (uid, gid) is the sandbox user: a file or directory it could not read by its mode and owner is
    never stored (default: the workspace's owner, which is the box's user in both modes).
    `budget` (optional) is the session's HostBudget: each record and restore takes a slice of it
    (entries walked, bytes read and written, its deadline); without one each takes its own default.
    """

    def __init__(self, store: Path, workspace: Path, budget_bytes: int = 256 << 20, max_file_bytes: int = 16 << 20,
                 box_user: tuple[int, int] | None = None, budget: HostBudget | None = None) -> None:
        self.store, self.workspace = Path(store), Path(workspace)
        real_ws, real_store = os.path.realpath(self.workspace), os.path.realpath(self.store)
        if real_store == real_ws or real_store.startswith(real_ws.rstrip("/") + "/"):
            raise ValueError("the checkpoint store must be outside the workspace (the box writes the workspace)")
        self.budget_bytes, self.max_file_bytes = budget_bytes, max_file_bytes
        self.host_budget = budget
        if box_user is None:
            ws_st = os.stat(self.workspace)
            box_user = (ws_st.st_uid, ws_st.st_gid)
        self.box_user = box_user
        self._lock = threading.RLock()
        if (self.store / "HEAD").exists():
            self.repo = self._open_repo()
        else:
            self.store.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.repo = pygit2.init_repository(str(self.store), bare=True)
            # Packing our own objects: a small delta window (the blobs are rarely alike), 2x faster.
            self.repo.config["pack.windowMemory"] = "1"
            # Only small objects are packed (_pack_loose): a big blob's loose file wastes less than a
            # block, while packing it costs a delta search and a second compression (100 similar 1 MiB
            # files took 17 s to pack, 0.6 s to store loose).
        self._index = self._load_index()
        self._root: _Dir | None = None
        self._wds: dict[int, _Dir] = {}
        self._linked: set[tuple[_Dir, str]] = set()  # files with other hard links: events may name the other path
        self._watcher: _Watcher | None = None
        self._scan_started_ns = 0
        self._hinted = False  # inside an incremental record: a surprise means a full walk
        self._pending = 0  # bytes on disk the loose objects written by this record cost at most
        self._base = 0  # the store's size on disk before them
        self._record_packs: set[Path] = set()  # packs made during this record (dropped if it is not kept)
        self._loose_at_start: set[Path] = set()  # loose objects (big blobs) of kept records, when a record began
        self._big_blobs: set[pygit2.Oid] = set()  # blobs of this record too big to pack: they stay loose
        self._budget = HostBudget()

    def _open_repo(self) -> pygit2.Repository:
        return pygit2.Repository(str(self.store), RepositoryOpenFlag.NO_SEARCH | RepositoryOpenFlag.BARE)

    def _work_budget(self) -> HostBudget:
        return self.host_budget.slice() if self.host_budget is not None else HostBudget()

    # -- public API -------------------------------------------------------------------------

    def record(self, turn: int) -> Checkpoint | None:
        """Snapshot the workspace now. Turn 0 is always recorded; a later turn returns None when
        nothing (tree, modes, skipped list) changed since the last good checkpoint or restore. A
        turn not after the last recorded one is moved just past it (parallel callers). A record
        that fails or passes the store budget returns a checkpoint whose state says so (kept in
        the index: what changed is then unknown), never None."""
        if turn < 0:
            raise ValueError("turns start at 0")
        with self._lock:
            if self._index.checkpoints:
                turn = max(turn, max(c.turn for c in self._index.checkpoints) + 1)
            self._pending, self._base, self._record_packs = 0, self._index.used_bytes, set()
            self._loose_at_start = {path for _, path, _ in self._loose()}  # big blobs of kept records
            self._big_blobs = set()
            self._budget = self._work_budget()
            try:
                return self._record(turn)
            except Exception as err:  # noqa: BLE001 - typed into the index, never "no change"
                self._forget()
                try:
                    self._drop_loose()
                    self._unlink_packs(self._record_packs & self._packs())
                    if self.repo.references.get(f"refs/checkpoints/{turn}") is not None:
                        self.repo.references.delete(f"refs/checkpoints/{turn}")
                except (OSError, pygit2.GitError):
                    pass
                state: Literal["skipped", "failed"]
                if isinstance(err, _StoreFull):
                    state, kind = "skipped", ErrorType.RESOURCE_EXHAUSTED.value
                elif isinstance(err, OpenAgentsError):
                    state, kind = "failed", err.type.value
                elif isinstance(err, OSError):
                    state, kind = "failed", ErrorType.IO_ERROR.value
                else:
                    state, kind = "failed", ErrorType.INTERNAL_ERROR.value
                message = getattr(err, "message", None) or str(err) or type(err).__name__
                cp = Checkpoint(turn=turn, created=round(time.time(), 3), state=state, error_type=kind, error=show(message[:500]))
                self._append(cp, None)
                return cp

    def list(self) -> list[Checkpoint]:
        return sorted(self._load_index().checkpoints, key=lambda c: c.turn)

    def restore(self, turn: int) -> RestoreReport:
        """Make the workspace exactly the state after `turn` (no box may run meanwhile). When any
        path restore would touch differs from the state the store last knew (the last record or
        restore), nothing is changed and the report lists the conflicts."""
        with self._lock:
            self._index = self._load_index()
            cp = next((c for c in self._index.checkpoints if c.turn == turn), None)
            if cp is None:
                raise KeyError(f"no checkpoint for turn {turn}")
            if not cp.ok:
                raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"the checkpoint after turn {turn} {cp.state}: {cp.error}")
            ref = self.repo.references.get(f"refs/checkpoints/{turn}")
            if ref is None or str(ref.target) != cp.commit:
                raise ValueError(f"the store's ref for turn {turn} does not match its index")
            head = next((c for c in self._index.checkpoints if c.ok and c.commit == self._index.head), None)
            if head is None:
                raise OpenAgentsError(ErrorType.INTERNAL_ERROR, "the checkpoint store does not know the workspace's last state")
            self._forget()  # our own writes: the next record walks everything
            restorer = _Restorer(self, cp, head, self._work_budget())
            report = restorer.run()
            if not report.conflicts:
                self._index.head = cp.commit
                self._save_index(self._index)
            return report

    def close(self) -> None:
        with self._lock:
            self._forget()

    def __enter__(self) -> "CheckpointStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._forget()
        except Exception:
            pass

    # -- the index ---------------------------------------------------------------------------

    def _load_index(self) -> _Index:
        path = self.store / INDEX_NAME
        try:
            with open(path, "rb") as fh:
                raw = fh.read(INDEX_CAP + 1)
        except FileNotFoundError:
            return _Index()
        if len(raw) > INDEX_CAP:
            raise ValueError(f"checkpoint index {path} is over {INDEX_CAP} bytes")
        return _Index.model_validate_json(raw)

    def _save_index(self, index: _Index) -> None:
        path = self.store / INDEX_NAME
        tmp = path.with_name(os.fsdecode(temp_name()))  # unique: two writers never share one
        try:
            with open(tmp, "x", encoding="utf-8") as fh:
                fh.write(index.model_dump_json())
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def _append(self, cp: Checkpoint, head: str | None, used: int | None = None) -> None:
        """The index with `cp`, saved; the in-memory index changes only once the save succeeded."""
        new = self._index.model_copy(update={"checkpoints": [*self._index.checkpoints, cp]})
        if head is not None:
            new.head = head
        if used is not None:
            new.used_bytes = used
        self._save_index(new)
        self._index = new

    # -- one record ----------------------------------------------------------------------------

    def _record(self, turn: int) -> Checkpoint | None:
        root, hinted_changes = self._snapshot()
        skipped = sorted((Skipped(path=to_store(d.child_rel(n)), reason=r) for d in root.all_dirs() for n, (_, r) in d.skipped.items()),
                         key=lambda s: s.path)
        meta = self._write_meta(root)
        head_cp = next((c for c in self._index.checkpoints if c.ok and c.commit == self._index.head), None) if self._index.head else None
        head = _object(self.repo, pygit2.Oid(hex=self._index.head), pygit2.Commit) if self._index.head else None
        last = self._index.checkpoints[-1] if self._index.checkpoints else None
        same_skips = last is not None and last.ok and [s.model_dump() for s in last.skipped] == [s.model_dump() for s in skipped]
        assert root.tree is not None  # _snapshot wrote every tree
        if (turn > 0 and head is not None and head.tree_id == root.tree and same_skips and head_cp is not None
                and head_cp.meta == meta and head_cp.names == "store"):
            self._drop_loose()  # a meta blob nobody names
            return None
        changed: list[str]
        if turn == 0:
            changed = []
        elif (hinted_changes is not None and head is not None and last is not None and last.ok
              and self._index.head == last.commit and head_cp is not None and head_cp.names == "store"):
            changed = hinted_changes
        else:
            changed = self._changed(head.tree if head is not None else None, root.tree)
        sig = pygit2.Signature(*SIGNATURE)
        self._charge_object(256)
        commit = self.repo.create_commit(None, sig, sig, f"checkpoint after turn {turn}\n", root.tree,
                                         [head.id] if head is not None else [])
        self._record_packs |= self._pack_loose()
        used = self._measure()
        if used > self.budget_bytes:
            # Packed, the store is still over: this checkpoint is not kept, nor the packs of its objects.
            raise _StoreFull(self.budget_bytes, used)
        self.repo.references.create(f"refs/checkpoints/{turn}", commit, force=True)
        cp = Checkpoint(turn=turn, commit=str(commit), created=round(time.time(), 3), files_changed=changed[:CHANGED_LIST_CAP],
                        files_changed_count=len(changed), skipped=skipped, meta=meta, names="store")
        self._append(cp.model_copy(), str(commit), used)
        self._merge_packs()
        self._index.used_bytes = self._measure()
        return cp

    def _write_meta(self, root: _Dir) -> str:
        """The blob of every entry whose mode or owner is not the default (0644 files, 0755
        executables and directories, the sandbox user): JSON keyed by to_store paths."""
        owner = self.box_user
        odd: dict[str, list[int]] = {}
        for d in root.all_dirs():
            if d.odd is None:
                d.odd = {}
                if d is not root and (d.meta[0] != 0o755 or d.meta[1:] != owner):
                    d.odd[to_store(d.rel)] = list(d.meta)
                for name, (_, mode, _, m) in d.files.items():
                    default = 0o777 if mode == MODE_LINK else (0o755 if mode == MODE_EXEC else 0o644)
                    if m[0] != default or m[1:] != owner:
                        d.odd[to_store(d.child_rel(name))] = list(m)
            odd.update(d.odd)
        data = json.dumps({"owner": list(owner), "modes": odd}, sort_keys=True, separators=(",", ":")).encode()
        oid = pygit2.hash(data)
        if oid not in self.repo:
            self._charge_object(len(data))
            self.repo.create_blob(data)
        return str(oid)

    def _changed(self, old: pygit2.Tree | None, new_tree: pygit2.Oid) -> builtins.list[str]:
        new = _object(self.repo, new_tree, pygit2.Tree)
        if old is None:
            return sorted(_tree_files(self.repo, new))
        # what repo.diff(old, new) runs for two trees, with its options
        paths = {d.new_file.path if d.status != pygit2.enums.DeltaStatus.DELETED else d.old_file.path
                 for d in old.diff_to_tree(new, interhunk_lines=0).deltas}
        return sorted(paths)

    # -- the store on disk -----------------------------------------------------------------------

    def _charge_object(self, size: int) -> None:
        """An object about to be written: its worst cost on disk as a loose file, against the budget.
        Many loose objects are packed mid-record, so their 4 KiB blocks do not add up."""
        cost = (size + OBJECT_OVERHEAD + BLOCK - 1) // BLOCK * BLOCK
        if self._pending + cost > min(PACK_EVERY, self.budget_bytes // 4) and self._pending:
            self._record_packs |= self._pack_loose()
            self._pending, self._base = 0, self._measure()
        self._pending += cost
        if self._base + self._pending > self.budget_bytes:
            raise _StoreFull(self.budget_bytes, self._base + self._pending)

    def _loose(self) -> builtins.list[tuple[pygit2.Oid, Path, int]]:
        """Every loose object: its id, its file and that file's size."""
        objects = self.store / "objects"
        out = []
        with os.scandir(objects) as fans:
            for fan in fans:
                if len(fan.name) != 2 or not fan.is_dir(follow_symlinks=False):
                    continue
                with os.scandir(fan.path) as items:
                    for item in items:
                        if len(item.name) == 38 and not item.name.startswith("."):
                            out.append((pygit2.Oid(hex=fan.name + item.name), Path(item.path), item.stat(follow_symlinks=False).st_size))
        return out

    def _remove_loose(self, loose: Iterable[tuple[pygit2.Oid, Path, int]]) -> None:
        fans = set()
        for _, path, _ in loose:
            os.unlink(path)
            fans.add(path.parent)
        for fan in fans:
            try:
                os.rmdir(fan)
            except OSError:
                pass

    def _drop_loose(self) -> None:
        """The loose objects of a record that is not kept: those that were not there when it began
        (the kept records' small objects are packed; their big blobs stay loose and stay)."""
        self._remove_loose([item for item in self._loose() if item[1] not in self._loose_at_start])

    def _packs(self) -> set[Path]:
        pack_dir = self.store / "objects" / "pack"
        return {p for p in pack_dir.iterdir() if p.suffix == ".pack"} if pack_dir.is_dir() else set()

    def _unlink_packs(self, packs: Iterable[Path]) -> None:
        for pack in packs:
            for suffix in (".pack", ".idx", ".rev"):
                try:
                    os.unlink(pack.with_suffix(suffix))
                except FileNotFoundError:
                    pass
        self.repo = self._open_repo()

    def _pack_loose(self) -> set[Path]:
        """The loose objects written so far into one pack, then the loose files go. Returns the
        new pack (none when nothing was loose). Every kept record ends packed, so a record starts
        with no loose object, and the loose objects of a record not kept are all its own."""
        loose = [item for item in self._loose() if item[1] not in self._loose_at_start and item[0] not in self._big_blobs]
        if not loose:
            return set()
        before = self._packs()
        builder = pygit2.PackBuilder(self.repo)
        if len(loose) > 1000:
            builder.set_threads(0)  # the deltas of a big record on every core
        for oid, _, _ in loose:
            builder.add(oid)
        builder.write()
        self._remove_loose(loose)
        return self._packs() - before

    def _merge_packs(self) -> None:
        """Many packs into one (only after a record was kept: every object is then named)."""
        before = self._packs()
        if len(before) <= PACKS_BEFORE_REPACK:
            return
        self.repo.pack()
        if self._packs() - before:
            self._unlink_packs(before)

    def _measure(self) -> int:
        """The store's allocated bytes on disk (it is ours: a plain iterative walk)."""
        total = 0
        stack = [str(self.store)]
        while stack:
            with os.scandir(stack.pop()) as items:
                for item in items:
                    st = item.stat(follow_symlinks=False)
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(item.path)
        return total

    # -- snapshots ----------------------------------------------------------------------------

    def _forget(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
        self._watcher, self._root, self._wds, self._linked = None, None, {}, set()

    def _snapshot(self) -> tuple[_Dir, builtins.list[str] | None]:
        """The walked root and, from the hints, the changed paths (None: ask a tree diff)."""
        self._scan_started_ns = time.time_ns()
        if self._root is not None and self._watcher is not None and not self._watcher.broken:
            self._hinted = True
            try:
                return self._incremental()
            except _NeedFull:
                pass
            finally:
                self._hinted = False
        return self._full(), None

    def _full(self) -> _Dir:
        old = self._root
        self._root = None
        if self._watcher is None or self._watcher.broken:
            if self._watcher is not None:
                self._watcher.close()
            self._watcher = _Watcher()
        else:
            self._watcher.drain()  # everything is walked anyway
        seen_wds = self._wds
        self._wds, self._linked = {}, set()
        fd = open_dir(self.workspace)
        try:
            st = os.fstat(fd)
            root = _Dir("", st.st_ino, None, _meta(st), old=old)
            self._watch(root, fd)
            self._fill(root, fd)
        finally:
            os.close(fd)
        for wd in set(seen_wds) - set(self._wds):
            self._watcher.remove(wd)
        self._root = root
        return root

    def _watch(self, d: _Dir, fd: int) -> None:
        assert self._watcher is not None
        d.wd = self._watcher.add(fd)
        if d.wd >= 0:
            self._wds[d.wd] = d

    def _fill(self, top: _Dir, fd: int) -> None:
        """Walk everything under the directory `top` (open as fd, already watched) through
        boxfs.Walk, iteratively; then its trees, deepest first, reusing those of unchanged
        directories."""
        by_rel: dict[bytes, _Dir] = {b"": top}
        walk = Walk(fd, self._budget, enter=lambda entry: entry.rel in by_rel)
        for entry in walk.entries():
            parent = by_rel.get(entry.rel.rpartition(b"/")[0])
            if parent is None:
                continue
            sub = self._entry(parent, entry.dir_fd, os.fsdecode(entry.name), entry.st, parent.old, touched=False)
            if sub is not None:
                os.close(sub[1])  # the walk opens it again, O_NOFOLLOW, and checks it is the same inode
                by_rel[entry.rel] = sub[0]
        for rel, why in [(r, f"deeper than {self._budget.max_depth} levels") for r in walk.too_deep] + walk.unreadable:
            d = by_rel.pop(rel, None)
            if d is top or rel == b"":
                raise OpenAgentsError(ErrorType.IO_ERROR, f"cannot list the directory '{show(top.rel) or '.'}': {why}")
            if d is not None and d.parent is not None:
                name = os.fsdecode(rel.rpartition(b"/")[2])
                d.parent.dirs.pop(name, None)
                d.parent.odd = None
                d.parent.skipped[name] = (None, f"cannot walk the directory: {why}")
                self._drop(d)
        for d in sorted(by_rel.values(), key=lambda x: -x.depth):
            old = d.old
            if old is not None and old.tree is not None and _same_entries(d, old):
                d.tree = old.tree  # an unchanged directory keeps its tree: no TreeBuilder
            else:
                self._write_tree(d)
            d.old = None

    def _box_reads(self, st: os.stat_result, directory: bool) -> bool:
        """Whether the sandbox user could read (and, a directory, enter) this by mode and owner."""
        uid, gid = self.box_user
        if uid == 0:
            return True
        need = 0o5 if directory else 0o4
        if st.st_uid == uid:
            bits = (st.st_mode >> 6) & 0o7
        elif st.st_gid == gid:
            bits = (st.st_mode >> 3) & 0o7
        else:
            bits = st.st_mode & 0o7
        return bits & need == need

    def _entry(self, d: _Dir, fd: int, name: str, st: os.stat_result, old: _Dir | None, touched: bool) -> tuple[_Dir, int] | None:
        """(Re)record d/name from what is there now (`st`, its lstat). A directory to walk comes
        back with its descriptor (watched before any listing). `touched`: an event named it, so
        the stat cache is not trusted (a change in the same clock tick leaves the stat as it was)."""
        d.files.pop(name, None)
        d.skipped.pop(name, None)
        d.odd = None
        prev_dir = d.dirs.pop(name, None)
        if is_git_name(name):
            self._drop(prev_dir)
            return None
        raw = os.fsencode(name)
        rel = d.child_rel(name)
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            if not self._box_reads(st, True):
                d.skipped[name] = (None, NOT_READABLE)
                self._drop(prev_dir)
                return None
            if touched and prev_dir is not None and prev_dir.ino == st.st_ino:
                prev_dir.meta, prev_dir.odd = _meta(st), None
                d.dirs[name] = prev_dir  # the same directory: its own watch reports what is inside
                return None
            if d.depth + 2 > self._budget.max_depth:
                d.skipped[name] = (None, f"deeper than {self._budget.max_depth} levels")
                self._drop(prev_dir)
                return None
            reuse = prev_dir if prev_dir is not None else (old.dirs.get(name) if old is not None else None)
            if prev_dir is not None and prev_dir.ino != st.st_ino:
                self._drop(prev_dir)
            try:
                sub_fd = os.open(raw, DIR_FLAGS, dir_fd=fd)
            except OSError as err:
                d.skipped[name] = (None, f"cannot open the directory: {err.strerror}")
                return None
            if os.fstat(sub_fd).st_ino != st.st_ino:
                os.close(sub_fd)
                d.skipped[name] = (None, "it changed while being walked")
                return None
            sub = _Dir(rel, st.st_ino, d, _meta(st), old=reuse if reuse is not None and reuse.ino == st.st_ino else None)
            self._watch(sub, sub_fd)
            d.dirs[name] = sub
            return sub, sub_fd
        self._drop(prev_dir)
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            d.skipped[name] = (None, _special_reason(mode))
            return None
        key = _key(st)
        cached = old.files.get(name) if old is not None else None
        if cached is not None and cached[0] == key and not touched:
            d.files[name] = cached
            if st.st_nlink > 1:
                self._linked.add((d, name))
            return None
        cached_skip = old.skipped.get(name) if old is not None else None
        if cached_skip is not None and cached_skip[0] == key and not touched:
            d.skipped[name] = cached_skip
            return None
        if stat.S_ISLNK(mode):
            try:
                data = os.readlink(raw, dir_fd=fd)
            except OSError as err:
                d.skipped[name] = (None, f"cannot read the link: {err.strerror}")
                return None
            entry_mode = MODE_LINK
        else:
            if not self._box_reads(st, False):
                d.skipped[name] = (key, NOT_READABLE)
                return None
            if st.st_size > self.max_file_bytes:
                d.skipped[name] = (key, f"larger than {self.max_file_bytes} bytes ({st.st_size})")
                return None
            try:
                data, st = read_at(fd, raw, self.max_file_bytes, os.fsencode(rel))
            except OpenAgentsError as err:  # swapped since the lstat, grew past the cap, unreadable
                d.skipped[name] = (None, f"cannot checkpoint it: {err.message}")
                return None
            self._budget.charge_bytes(len(data))
            if not self._box_reads(st, False):  # swapped for another inode since the lstat
                d.skipped[name] = (None, NOT_READABLE)
                return None
            key = _key(st)
            entry_mode = MODE_EXEC if st.st_mode & stat.S_IXUSR else MODE_FILE
            if st.st_nlink > 1:
                if self._hinted and (d, name) not in self._linked:
                    raise _NeedFull  # a new hard link: an event through the other name would not name this one
                self._linked.add((d, name))
        oid = pygit2.hash(data)
        if oid not in self.repo:
            self._charge_object(len(data))
            self.repo.create_blob(data)
            if len(data) >= SMALL_LOOSE:
                self._big_blobs.add(oid)
        racy = key[4] >= self._scan_started_ns - RACY_NS or key[3] >= self._scan_started_ns - RACY_NS
        d.files[name] = (None if racy else key, entry_mode, oid, _meta(st))
        return None

    def _drop(self, gone: _Dir | None) -> None:
        if gone is None:
            return
        for sub in gone.all_dirs():
            if sub.wd >= 0 and self._wds.get(sub.wd) is sub:
                del self._wds[sub.wd]
                assert self._watcher is not None
                self._watcher.remove(sub.wd)
        self._linked = {(d, n) for d, n in self._linked if not _under(d, gone)}

    def _write_tree(self, d: _Dir, names: set[str] | None = None) -> None:
        """d's tree: from scratch, or (`names`) its previous tree with only those entries redone,
        since every insert costs libgit2 an object lookup. Names in to_store form."""
        if names is None or d.tree is None:
            tb = self.repo.TreeBuilder()
            names = set(d.files) | set(d.dirs)
        else:
            tb = self.repo.TreeBuilder(d.tree)
        for name in names:
            tree_name = _ts(name)
            if name in d.files:
                _, mode, oid, _ = d.files[name]
                tb.insert(tree_name, oid, mode)
            elif name in d.dirs:
                sub = d.dirs[name]
                assert sub.tree is not None
                tb.insert(tree_name, sub.tree, MODE_TREE)
            elif tb.get(tree_name) is not None:
                tb.remove(tree_name)
        size = sum(4 * len(n) + 28 for n in (*d.files, *d.dirs))  # a name in to_store form: at most 4 bytes a character
        self._charge_object(size)
        d.tree = tb.write()

    def _incremental(self) -> tuple[_Dir, builtins.list[str]]:
        """Only the entries inotify named since the last record, plus every hard-linked file.
        Returns the root and the paths whose tree entry changed."""
        assert self._watcher is not None and self._root is not None
        touched: dict[_Dir, set[str]] = {}
        for wd, mask, name in self._watcher.drain():
            if mask & IN_Q_OVERFLOW or mask & IN_MOVE_SELF or (mask & IN_ISDIR and mask & (IN_MOVED_FROM | IN_MOVED_TO)):
                raise _NeedFull  # a moved directory makes our wd -> path map stale
            d = self._wds.get(wd)
            if d is None:
                continue
            if mask & IN_IGNORED:
                del self._wds[wd]
                continue
            if name:
                touched.setdefault(d, set()).add(name)
        if self._watcher.broken:
            raise _NeedFull
        for d, name in list(self._linked):
            touched.setdefault(d, set()).add(name)
        pending: dict[_Dir, set[str]] = {}
        changes: set[str] = set()
        for d in sorted(touched, key=lambda x: x.depth):
            if not self._attached(d):
                continue  # dropped by an earlier rescan in this record
            fd = self._open_rel(d)
            try:
                for name in sorted(touched[d]):
                    before = d.files.get(name), d.dirs.get(name)
                    self._budget.charge_entries()
                    try:
                        st = os.stat(os.fsencode(name), dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError:
                        d.odd = None
                        d.files.pop(name, None)
                        d.skipped.pop(name, None)
                        self._drop(d.dirs.pop(name, None))
                    else:
                        sub = self._entry(d, fd, name, st, None, touched=True)
                        if sub is not None:
                            try:
                                self._fill(sub[0], sub[1])
                            finally:
                                os.close(sub[1])
                    after = d.files.get(name), d.dirs.get(name)
                    if _entry_changed(before, after, d.child_rel(name), changes):
                        pending.setdefault(d, set()).add(name)
            finally:
                os.close(fd)
        for d in list(pending):
            node = d
            while node.parent is not None:  # each ancestor takes its child's new tree id
                pending.setdefault(node.parent, set()).add(node.rel.rsplit("/", 1)[-1])
                node = node.parent
        for d in sorted(pending, key=lambda x: -x.depth):
            self._write_tree(d, pending[d])  # deepest first
        return self._root, sorted(changes)

    def _attached(self, d: _Dir) -> bool:
        node = d
        while node.parent is not None:
            if node.parent.dirs.get(node.rel.rsplit("/", 1)[-1]) is not node:
                return False
            node = node.parent
        return node is self._root

    def _open_rel(self, d: _Dir) -> int:
        """d's directory, reached from the root without following anything; the same inode as walked."""
        fd = open_dir(self.workspace)
        try:
            for part in d.rel.split("/") if d.rel else []:
                try:
                    sub = os.open(os.fsencode(part), DIR_FLAGS, dir_fd=fd)
                except OSError:
                    raise _NeedFull from None
                os.close(fd)
                fd = sub
            if os.fstat(fd).st_ino != d.ino:
                raise _NeedFull
        except BaseException:
            os.close(fd)
            raise
        return fd


def _entry_changed(before: tuple[_File | None, _Dir | None], after: tuple[_File | None, _Dir | None], rel: str,
                   changes: set[str]) -> bool:
    """Whether one tree entry (or a file's mode or owner) changed; the files it concerns go into `changes` (to_store form)."""
    (file_a, dir_a), (file_b, dir_b) = before, after
    if dir_a is not None and dir_a is dir_b:
        return False  # the same directory: its own events report what is inside
    if file_a is not None and file_b is not None and file_a[1:] == file_b[1:]:
        return False
    if file_a is None and dir_a is None and file_b is None and dir_b is None:
        return False
    for f, sub in ((file_a, dir_a), (file_b, dir_b)):
        if f is not None:
            changes.add(to_store(rel))
        if sub is not None:
            changes.update(to_store(p) for p in _dir_files(sub))
    return True


def _dir_files(d: _Dir) -> Iterable[str]:
    for sub in d.all_dirs():
        yield from (sub.child_rel(n) for n in sub.files)


def _same_entries(d: _Dir, old: _Dir) -> bool:
    return (d.files.keys() == old.files.keys() and d.dirs.keys() == old.dirs.keys()
            and all(entry[1:3] == old.files[n][1:3] for n, entry in d.files.items())
            and all(sub.tree == old.dirs[n].tree for n, sub in d.dirs.items()))


def _under(d: _Dir, top: _Dir) -> bool:
    node: _Dir | None = d
    while node is not None:
        if node is top:
            return True
        node = node.parent
    return False


def _special_reason(mode: int) -> str:
    if special_kind(mode):
        return f"{special_name(mode)} (not checkpointed)"
    return "not a regular file, directory or symlink"


_Kind = TypeVar("_Kind", pygit2.Commit, pygit2.Tree, pygit2.Blob)


def _object(repo: pygit2.Repository, oid: pygit2.Oid, kind: type[_Kind]) -> _Kind:
    """The object `oid` in our store, which must be of `kind` (the store is ours: anything else is corruption)."""
    obj = repo[oid]
    if not isinstance(obj, kind):
        raise ValueError(f"checkpoint store object {oid} is a {obj.type_str}, not a {kind.__name__.lower()}")
    return obj


def _tree_files(repo: pygit2.Repository, tree: pygit2.Tree) -> Iterable[str]:
    stack: list[tuple[str, pygit2.Tree]] = [("", tree)]
    while stack:
        prefix, t = stack.pop()
        for e in t:
            rel = f"{prefix}{e.name}"
            if e.filemode == MODE_TREE:
                stack.append((rel + "/", _object(repo, e.id, pygit2.Tree)))
            else:
                yield rel


# --- restore --------------------------------------------------------------------------------

_State = tuple[object, ...]  # what a path is: ("file", perm, oid[, uid, gid]), ("link", target), ("dir", perm[, uid, gid]), ("special",)


class _Picture:
    """One checkpoint as paths (workspace bytes) -> what each is, with its exact mode and owner."""

    def __init__(self, store: CheckpointStore, cp: Checkpoint, owners: bool) -> None:
        repo = store.repo
        self.blobs: dict[bytes, pygit2.Oid] = {}
        self.states: dict[bytes, _State] = {}
        modes: dict[bytes, tuple[int, int, int]] = {}
        owner: tuple[int, int]
        if cp.meta is not None:
            doc = json.loads(_object(repo, pygit2.Oid(hex=cp.meta), pygit2.Blob).data)
            owner = (int(doc["owner"][0]), int(doc["owner"][1]))
            modes = {from_store(k): (int(v[0]), int(v[1]), int(v[2])) for k, v in doc["modes"].items()}
        else:  # an older checkpoint: 0644/0755 and the workspace's owner, as it was restored then
            ws_st = os.stat(store.workspace)
            owner = (ws_st.st_uid, ws_st.st_gid)
        self.owner = owner
        name_of = from_store if cp.names == "store" else os.fsencode
        self.skipped = {name_of(s.path) for s in cp.skipped}
        stack: list[tuple[bytes, pygit2.Tree]] = [(b"", _object(repo, pygit2.Oid(hex=cp.commit), pygit2.Commit).tree)]
        while stack:
            prefix, tree = stack.pop()
            for e in tree:
                if e.name is None:
                    continue
                name = name_of(e.name)
                if not _plain_name(name):
                    continue  # our own trees hold nothing else; a tampered store must not make restore write elsewhere
                rel = prefix + b"/" + name if prefix else name
                m = modes.get(rel)
                if e.filemode == MODE_TREE:
                    perm, uid, gid = m if m is not None else (0o755, *owner)
                    self.states[rel] = ("dir", perm, uid, gid) if owners else ("dir", perm)
                    stack.append((rel, _object(repo, e.id, pygit2.Tree)))
                elif e.filemode == MODE_LINK:
                    self.states[rel] = ("link", _object(repo, e.id, pygit2.Blob).data)
                    self.blobs[rel] = e.id
                elif e.filemode in (MODE_FILE, MODE_EXEC):
                    perm, uid, gid = m if m is not None else (0o755 if e.filemode == MODE_EXEC else 0o644, *owner)
                    self.states[rel] = ("file", perm, str(e.id), uid, gid) if owners else ("file", perm, str(e.id))
                    self.blobs[rel] = e.id


class _Opener:
    """Descriptors of directories by workspace path, each component opened O_NOFOLLOW from its
    parent; the chain last used is kept, so paths in order cost one open each."""

    def __init__(self, root_fd: int) -> None:
        self.stack: list[tuple[bytes, int]] = [(b"", root_fd)]

    def dir(self, rel: bytes) -> int:
        while len(self.stack) > 1 and not (rel == self.stack[-1][0] or rel.startswith(self.stack[-1][0] + b"/")):
            os.close(self.stack.pop()[1])
        path, fd = self.stack[-1]
        rest = rel[len(path):].lstrip(b"/")
        for part in rest.split(b"/") if rest else []:
            sub = os.open(part, DIR_FLAGS, dir_fd=fd)
            path = path + b"/" + part if path else part
            self.stack.append((path, sub))
            fd = sub
        return fd

    def forget(self, rel: bytes) -> None:
        """rel was removed or replaced: no descriptor of it (or under it) is used again."""
        for i, (path, _) in enumerate(self.stack):
            if i and (path == rel or path.startswith(rel + b"/")):
                for _, fd in self.stack[i:]:
                    os.close(fd)
                del self.stack[i:]
                return

    def close(self) -> None:
        while len(self.stack) > 1:
            os.close(self.stack.pop()[1])


def _parent_name(rel: bytes) -> tuple[bytes, bytes]:
    parent, _, name = rel.rpartition(b"/")
    return parent, name


class _Restorer:
    """Makes the workspace equal to one checkpoint, after checking nothing it would touch changed
    since the state the store last knew (`head`). Iterative, through boxfs."""

    def __init__(self, store: CheckpointStore, cp: Checkpoint, head: Checkpoint, budget: HostBudget) -> None:
        self.store, self.budget = store, budget
        self.owners = os.geteuid() == 0  # only root can give a file another owner
        self.target = _Picture(store, cp, self.owners)
        self.head = self.target if head.commit == cp.commit and head.turn == cp.turn else _Picture(store, head, self.owners)
        self.report = RestoreReport(skipped=list(cp.skipped))
        self.keep = self.target.skipped

    def _kept(self, rel: bytes) -> bool:
        """Never touched: .git entries anywhere on the path, and paths this checkpoint skipped (and what is under them)."""
        parts = rel.split(b"/")
        if any(is_git_name(os.fsdecode(p)) for p in parts):
            return True
        return any(b"/".join(parts[:i]) in self.keep for i in range(1, len(parts) + 1))

    def _current(self, root_fd: int) -> dict[bytes, _State]:
        cur: dict[bytes, _State] = {}
        walk = Walk(root_fd, self.budget, enter=lambda e: not self._kept(e.rel), sort=True)
        for e in walk.entries():
            if self._kept(e.rel):
                continue
            st = e.st
            if stat.S_ISDIR(st.st_mode):
                cur[e.rel] = ("dir", st.st_mode & 0o777, st.st_uid, st.st_gid) if self.owners else ("dir", st.st_mode & 0o777)
            elif stat.S_ISLNK(st.st_mode):
                try:
                    cur[e.rel] = ("link", os.readlink(e.name, dir_fd=e.dir_fd))
                except OSError:
                    cur[e.rel] = ("special",)
            elif stat.S_ISREG(st.st_mode):
                try:
                    data, st = read_at(e.dir_fd, e.name, max(self.store.max_file_bytes, 1), e.rel)
                    self.budget.charge_bytes(len(data))
                    oid: str | None = str(pygit2.hash(data))
                except OpenAgentsError:
                    oid = None  # unreadable or over the cap: equal to nothing
                perm = st.st_mode & 0o777 | (st.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX))
                cur[e.rel] = ("file", perm, oid, st.st_uid, st.st_gid) if self.owners else ("file", perm, oid)
            else:
                cur[e.rel] = ("special",)
        for rel, why in [(r, "too deep to walk") for r in walk.too_deep] + walk.unreadable:
            if rel == b"":
                raise OpenAgentsError(ErrorType.IO_ERROR, f"cannot list the workspace: {why}")
            self.keep.add(rel)  # not seen whole: neither compared nor touched
            self.report.skipped.append(Skipped(path=to_store(rel), reason=f"not restored: {why}"))
        return cur

    def run(self) -> RestoreReport:
        root_fd = open_dir(self.store.workspace)
        try:
            cur = self._current(root_fd)
            cur = {p: s for p, s in cur.items() if not self._kept(p)}
            want = {p: s for p, s in self.target.states.items() if not self._kept(p)}
            self._defuse(want, cur)
            touched = sorted(p for p in set(cur) | set(want) if cur.get(p) != want.get(p))
            for p in touched:
                if p in self.head.skipped or any(p.startswith(s + b"/") for s in self.head.skipped):
                    continue  # the store never knew it: nothing to compare with
                if cur.get(p) != self.head.states.get(p):
                    if p not in self.head.states:
                        why = "created in the workspace since the session's last checkpoint"
                    elif p not in cur:
                        why = "removed from the workspace since the session's last checkpoint"
                    else:
                        why = "changed in the workspace since the session's last checkpoint"
                    self.report.conflicts.append(Conflict(path=to_store(p), reason=why))
            if self.report.conflicts:
                return self.report
            self._preflight(want, touched)
            self._apply(root_fd, cur, want, touched)
            os.fsync(root_fd)
        finally:
            os.close(root_fd)
        self.report.restored.sort()
        self.report.removed.sort()
        return self.report

    def _preflight(self, want: dict[bytes, _State], touched: builtins.list[bytes]) -> None:
        """Refuse, before anything changes, a restore whose writes would pass the byte budget
        (so a budget stops it whole, not half-way)."""
        need = 0
        for p in touched:
            if p in want and want[p][0] == "file":
                need += int(self.store.repo.odb.read_header(self.target.blobs[p])[1])
        limit = self.budget.max_bytes
        if limit is not None and self.budget.bytes_spent + need > limit:
            raise BudgetExceeded("byte", limit, f"the restore would write {need} bytes; nothing was changed")

    def _defuse(self, want: dict[bytes, _State], cur: dict[bytes, _State]) -> None:
        """A directory must not come back as a bare repository (HEAD with objects/ and refs/, or a
        commondir) that the user's git obeys: a box planted it during the session, and the sweep
        defused it by moving HEAD out. Its HEAD and commondir are not restored."""
        children: dict[bytes, set[bytes]] = {}
        for p in want:
            parent, name = _parent_name(p)
            children.setdefault(parent, set()).add(name)
        for parent, names in children.items():
            staying = set()
            for p in self.keep:
                pp, name = _parent_name(p)
                if pp == parent:
                    staying.add(name)
            if _repository_shape(os.fsdecode(n) for n in names | staying):
                for name in [n for n in names if n.lower() in (b"head", b"commondir")]:
                    rel = parent + b"/" + name if parent else name
                    want.pop(rel, None)
                    self.keep.add(rel)
                    cur.pop(rel, None)
                    self.report.skipped.append(Skipped(path=to_store(rel), reason="it would make its directory a repository git obeys (HEAD with objects/ and refs/, or a commondir)"))

    def _apply(self, root_fd: int, cur: dict[bytes, _State], want: dict[bytes, _State], touched: builtins.list[bytes]) -> None:
        opener = _Opener(root_fd)
        try:
            # 1. what must go (or be replaced by another kind), deepest first
            for p in sorted((p for p in touched if p in cur and (p not in want or cur[p][0] != want[p][0] or cur[p][0] == "special")),
                            key=lambda x: (-x.count(b"/"), x)):
                parent, name = _parent_name(p)
                try:
                    fd = opener.dir(parent)
                    if cur[p][0] == "dir":
                        opener.forget(p)
                        os.rmdir(name, dir_fd=fd)
                        self.report.removed.append(to_store(p) + "/")
                    else:
                        os.unlink(name, dir_fd=fd)
                        self.report.removed.append(to_store(p))
                except OSError as err:
                    if err.errno in (errno.ENOTEMPTY, errno.EEXIST):
                        reason = "a directory holding entries never checkpointed is in its way"
                    else:
                        reason = f"cannot remove it: {err.strerror}"
                    self.report.skipped.append(Skipped(path=to_store(p), reason=reason))
            # 2. directories, files and links that must be (re)written, shallowest first
            dirs_done: builtins.list[bytes] = []
            for p in sorted((p for p in touched if p in want), key=lambda x: (x.count(b"/"), x)):
                parent, name = _parent_name(p)
                state = want[p]
                try:
                    fd = opener.dir(parent)
                    there = lstat_at(fd, name)
                    if there is not None and state[0] != "dir" and stat.S_ISDIR(there.st_mode):
                        continue  # could not be removed above: already listed
                    if state[0] == "dir":
                        if there is None or not stat.S_ISDIR(there.st_mode):
                            if there is not None:
                                continue
                            os.mkdir(name, 0o700, dir_fd=fd)
                        dirs_done.append(p)
                    elif state[0] == "link":
                        self._link(fd, name, p)
                    else:
                        self._file(fd, name, p)
                except OSError as err:
                    self.report.skipped.append(Skipped(path=to_store(p), reason=f"cannot restore it: {err.strerror}"))
            # 3. directory modes and owners, deepest first (a 0500 directory is filled before it is closed)
            for p in sorted(dirs_done, key=lambda x: (-x.count(b"/"), x)):
                state = want[p]
                parent, name = _parent_name(p)
                try:
                    sub = os.open(name, DIR_FLAGS, dir_fd=opener.dir(parent))
                    try:
                        if self.owners:
                            os.fchown(sub, int(state[2]), int(state[3]))  # type: ignore[call-overload]
                        os.fchmod(sub, int(state[1]) & 0o777)  # type: ignore[call-overload]
                    finally:
                        os.close(sub)
                except OSError as err:
                    self.report.skipped.append(Skipped(path=to_store(p), reason=f"cannot set its mode: {err.strerror}"))
        finally:
            opener.close()

    def _file(self, fd: int, name: bytes, rel: bytes) -> None:
        state = self.target.states[rel]
        data = _object(self.store.repo, self.target.blobs[rel], pygit2.Blob).data
        uid = gid = None
        if self.owners:
            uid, gid = int(state[3]), int(state[4])  # type: ignore[call-overload]
        write_atomic(fd, name, data, self.budget, mode=int(state[1]), uid=uid, gid=gid)  # type: ignore[call-overload]
        self.report.restored.append(to_store(rel))

    def _link(self, fd: int, name: bytes, rel: bytes) -> None:
        target = _object(self.store.repo, self.target.blobs[rel], pygit2.Blob).data
        tmp = temp_name()
        os.symlink(target, tmp, dir_fd=fd)
        try:
            if self.owners:
                os.chown(tmp, *self.target.owner, dir_fd=fd, follow_symlinks=False)
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)  # replaces a file or a link itself, never through it
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=fd)
            except OSError:
                pass
            raise
        self.report.restored.append(to_store(rel))


def _repository_shape(names: Iterable[str]) -> bool:
    """Names that make git take a directory for a repository (integrity.git_shaped, by names)."""
    folded = {n.casefold() for n in names}
    return "head" in folded and ("commondir" in folded or {"objects", "refs"} <= folded)


def _plain_name(name: bytes) -> bool:
    """Our own trees hold nothing else; a tampered store must not make restore write elsewhere."""
    return bool(name) and name not in (b".", b"..") and b"/" not in name and b"\0" not in name and not is_git_name(os.fsdecode(name))
