"""Checkpoints: the workspace after each turn, in a shadow object store outside it, and rollback.

The store is a bare libgit2 repository in the session's state directory (as Gemini CLI keeps a
shadow repository); the workspace needs no `.git` and its own `.git` is never read or touched.
Everything in the workspace was written by the box, so the store is never steered by it:

- the workspace is walked through directory fds opened O_NOFOLLOW|O_DIRECTORY (no symlink is
  followed at any level, as in integrity.walk); files are opened O_NOFOLLOW|O_NONBLOCK through
  their parent's fd, must be regular and are size-capped; blobs are made from the bytes we read
  (libgit2 never opens a workspace path, so no filter, attribute or config of the box applies);
- symlinks are stored as links (their target is only data); FIFOs, sockets and devices, files
  over the size cap, files past the session's blob budget and names libgit2 cannot hold are
  listed as skipped, never silently left out; every `.git` entry (any case) is neither recorded
  nor touched by restore, and restore never brings back the HEAD or commondir of a directory that
  would then be a bare repository the user's git obeys (the sweep defused it at session end).

Speed: a plain lstat of every file of a 10k-file workspace costs 50-60 ms on our machine, over the
50 ms a checkpoint may take. So after the first full walk the store keeps inotify watches on
every directory it walked (added through /proc/self/fd of the O_NOFOLLOW directory fd, before the
directory is listed, so nothing between a listing and the next record is missed) and the next
record re-reads only the entries named in events; trees of untouched directories are reused by
oid. The events are hints only: every path they name is re-walked by the same rules. A full walk
(with a stat cache, so unchanged files are not re-read) replaces the hints whenever they could be
incomplete: queue overflow, a directory moved, a new hard link, no inotify, a new process.
Known limit: a write through a shared memory mapping raises no inotify event, so a box that
writes that way can keep a middle checkpoint from seeing the change until the next full walk;
turn 0 and restore always walk everything.
"""
from __future__ import annotations

import builtins
import ctypes
import os
import stat
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, TypeVar

import pygit2
from pydantic import BaseModel, Field
from pygit2.enums import RepositoryOpenFlag

from .integrity import MAX_DEPTH, is_git_name, special_kind, special_name

MODE_FILE, MODE_EXEC, MODE_LINK, MODE_TREE = 0o100644, 0o100755, 0o120000, 0o040000
INDEX_NAME = "checkpoints.json"
INDEX_CAP = 64 << 20  # the index is ours, but bounded all the same
CHANGED_LIST_CAP = 1000  # paths listed per checkpoint; files_changed_count has the whole number
SIGNATURE = ("openagents-sandbox", "checkpoints@localhost")
RACY_NS = 50_000_000  # a stat taken this close to a change may not show the next one (coarse clock)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class Skipped(BaseModel):
    path: str
    reason: str


class Checkpoint(BaseModel):
    turn: int
    commit: str
    created: float
    files_changed: list[str] = Field(default_factory=list)  # vs the previous checkpoint (or restored state)
    files_changed_count: int = 0
    skipped: list[Skipped] = Field(default_factory=list)


class RestoreReport(BaseModel):
    restored: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    skipped: list[Skipped] = Field(default_factory=list)


class _Index(BaseModel):
    version: int = 1
    head: str | None = None  # the commit the workspace was last known to equal (recorded or restored)
    used_bytes: int = 0  # blob bytes written: what the budget counts
    checkpoints: list[Checkpoint] = Field(default_factory=list)


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
_File = tuple[_Key | None, int, pygit2.Oid]  # a file's (key, mode, oid)


def _key(st: os.stat_result) -> _Key:
    return (st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(eq=False)
class _Dir:
    rel: str
    ino: int
    parent: "_Dir | None"
    wd: int = -1
    files: dict[str, _File] = field(default_factory=dict)  # name -> (key, mode, oid)
    dirs: dict[str, "_Dir"] = field(default_factory=dict)
    skipped: dict[str, tuple[_Key | None, str]] = field(default_factory=dict)  # name -> (key, reason)
    tree: pygit2.Oid | None = None

    def child_rel(self, name: str) -> str:
        return f"{self.rel}/{name}" if self.rel else name

    def all_dirs(self) -> Iterable["_Dir"]:
        yield self
        for sub in self.dirs.values():
            yield from sub.all_dirs()


class _NeedFull(Exception):
    """The hints cannot be trusted for this record: walk everything."""


class CheckpointStore:
    """Checkpoints of one workspace in the bare repository `store` (created if missing)."""

    def __init__(self, store: Path, workspace: Path, budget_bytes: int = 256 << 20, max_file_bytes: int = 16 << 20) -> None:
        self.store, self.workspace = Path(store), Path(workspace)
        real_ws, real_store = os.path.realpath(self.workspace), os.path.realpath(self.store)
        if real_store == real_ws or real_store.startswith(real_ws.rstrip("/") + "/"):
            raise ValueError("the checkpoint store must be outside the workspace (the box writes the workspace)")
        self.budget_bytes, self.max_file_bytes = budget_bytes, max_file_bytes
        if (self.store / "HEAD").exists():
            self.repo = pygit2.Repository(str(self.store), RepositoryOpenFlag.NO_SEARCH | RepositoryOpenFlag.BARE)
        else:
            self.store.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.repo = pygit2.init_repository(str(self.store), bare=True)
        self._index = self._load_index()
        self._root: _Dir | None = None
        self._wds: dict[int, _Dir] = {}
        self._linked: set[tuple[_Dir, str]] = set()  # files with other hard links: events may name the other path
        self._watcher: _Watcher | None = None
        self._scan_started_ns = 0
        self._hinted = False  # inside an incremental record: a surprise means a full walk

    # -- public API -------------------------------------------------------------------------

    def record(self, turn: int) -> Checkpoint | None:
        """Snapshot the workspace now. Turn 0 is always recorded; a later turn returns None when
        nothing (tree or skipped list) changed since the last checkpoint or restore."""
        if self._index.checkpoints and turn <= max(c.turn for c in self._index.checkpoints):
            raise ValueError(f"turn {turn} is not after the last checkpoint's turn")
        if turn < 0:
            raise ValueError("turns start at 0")
        root, hinted_changes = self._snapshot()
        skipped = sorted((Skipped(path=d.child_rel(n), reason=r) for d in root.all_dirs() for n, (_, r) in d.skipped.items()),
                         key=lambda s: s.path)
        head = _object(self.repo, pygit2.Oid(hex=self._index.head), pygit2.Commit) if self._index.head else None
        last = self._index.checkpoints[-1] if self._index.checkpoints else None
        same_skips = last is not None and [s.model_dump() for s in last.skipped] == [s.model_dump() for s in skipped]
        assert root.tree is not None  # _snapshot wrote every tree
        if turn > 0 and head is not None and head.tree_id == root.tree and same_skips:
            return None
        changed: list[str]
        if turn == 0:
            changed = []
        elif hinted_changes is not None and head is not None and self._index.checkpoints and self._index.head == self._index.checkpoints[-1].commit:
            changed = hinted_changes
        else:
            changed = self._changed(head.tree if head is not None else None, root.tree)
        sig = pygit2.Signature(*SIGNATURE)
        commit = self.repo.create_commit(None, sig, sig, f"checkpoint after turn {turn}\n", root.tree,
                                         [head.id] if head is not None else [])
        self.repo.references.create(f"refs/checkpoints/{turn}", commit, force=True)
        cp = Checkpoint(turn=turn, commit=str(commit), created=round(time.time(), 3), files_changed=changed[:CHANGED_LIST_CAP],
                        files_changed_count=len(changed), skipped=skipped)
        self._index.checkpoints.append(cp)
        self._index.head = str(commit)
        self._save_index()
        return cp

    def list(self) -> list[Checkpoint]:
        return sorted(self._load_index().checkpoints, key=lambda c: c.turn)

    def restore(self, turn: int) -> RestoreReport:
        """Make the workspace exactly the state after `turn` (no box may run meanwhile)."""
        self._index = self._load_index()
        cp = next((c for c in self._index.checkpoints if c.turn == turn), None)
        if cp is None:
            raise KeyError(f"no checkpoint for turn {turn}")
        ref = self.repo.references.get(f"refs/checkpoints/{turn}")
        if ref is None or str(ref.target) != cp.commit:
            raise ValueError(f"the store's ref for turn {turn} does not match its index")
        report = RestoreReport(skipped=list(cp.skipped))
        ws_st = os.stat(self.workspace)
        restorer = _Restorer(self.repo, {s.path for s in cp.skipped}, report, ws_st.st_uid, ws_st.st_gid)
        fd = os.open(self.workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            restorer.sync_dir(fd, "", _object(self.repo, pygit2.Oid(hex=cp.commit), pygit2.Commit).tree, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        report.restored.sort()
        report.removed.sort()
        self._index.head = cp.commit
        self._save_index()
        self._forget()  # our own writes: the next record walks everything
        return report

    def close(self) -> None:
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

    def _save_index(self) -> None:
        path = self.store / INDEX_NAME
        tmp = path.with_name(f".{INDEX_NAME}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(self._index.model_dump_json())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def _changed(self, old: pygit2.Tree | None, new_tree: pygit2.Oid) -> builtins.list[str]:
        new = _object(self.repo, new_tree, pygit2.Tree)
        if old is None:
            return sorted(_tree_files(self.repo, new, ""))
        # what repo.diff(old, new) runs for two trees, with its options
        paths = {d.new_file.path if d.status != pygit2.enums.DeltaStatus.DELETED else d.old_file.path
                 for d in old.diff_to_tree(new, interhunk_lines=0).deltas}
        return sorted(paths)

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
        if self._watcher is None or self._watcher.broken:
            if self._watcher is not None:
                self._watcher.close()
            self._watcher = _Watcher()
        else:
            self._watcher.drain()  # everything is walked anyway
        seen_wds = self._wds
        self._wds, self._linked = {}, set()
        fd = os.open(self.workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            root = self._scan_dir(fd, "", None, old, 0)
        finally:
            os.close(fd)
        for wd in set(seen_wds) - set(self._wds):
            self._watcher.remove(wd)
        self._root = root
        return root

    def _scan_dir(self, fd: int, rel: str, parent: _Dir | None, old: _Dir | None, depth: int) -> _Dir:
        """Walk one directory fully (its watch first, then its listing), reusing the stat cache of `old`."""
        st = os.fstat(fd)
        d = _Dir(rel, st.st_ino, parent)
        assert self._watcher is not None
        d.wd = self._watcher.add(fd)
        if d.wd >= 0:
            self._wds[d.wd] = d
        for name in os.listdir(fd):
            self._scan_entry(d, fd, name, old, depth)
        if old is not None and old.tree is not None and _same_entries(d, old):
            d.tree = old.tree  # an unchanged directory keeps its tree: no TreeBuilder
        else:
            self._write_tree(d)
        return d

    def _scan_entry(self, d: _Dir, fd: int, name: str, old: _Dir | None, depth: int, touched: bool = False) -> None:
        """(Re)record d/name from what is there now. `touched`: an event named it, so the stat
        cache is not trusted (a change in the same clock tick leaves the stat as it was)."""
        d.files.pop(name, None)
        d.skipped.pop(name, None)
        prev_dir = d.dirs.pop(name, None)
        if is_git_name(name):
            return
        rel = d.child_rel(name)
        try:
            st = os.lstat(name, dir_fd=fd)
        except FileNotFoundError:
            self._drop(prev_dir)
            return
        mode = st.st_mode
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            d.skipped[name] = (None, "its name is not valid UTF-8")
            self._drop(prev_dir)
            return
        if stat.S_ISDIR(mode):
            if depth + 1 >= MAX_DEPTH:
                d.skipped[name] = (None, f"deeper than {MAX_DEPTH} levels")
                self._drop(prev_dir)
                return
            reuse = prev_dir if prev_dir is not None else (old.dirs.get(name) if old is not None else None)
            if touched and prev_dir is not None and prev_dir.ino == st.st_ino:
                d.dirs[name] = prev_dir  # the same directory: its own watch reports what is inside
                return
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as err:
                d.skipped[name] = (None, f"cannot open the directory: {err.strerror}")
                self._drop(prev_dir)
                return
            try:
                if prev_dir is not None and prev_dir.ino != st.st_ino:
                    self._drop(prev_dir)
                    reuse = None
                d.dirs[name] = self._scan_dir(sub, rel, d, reuse if reuse is not None and reuse.ino == st.st_ino else None, depth + 1)
            finally:
                os.close(sub)
            return
        self._drop(prev_dir)
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            d.skipped[name] = (None, _special_reason(mode))
            return
        key = _key(st)
        cached = old.files.get(name) if old is not None else None
        if cached is not None and cached[0] == key and not touched:
            d.files[name] = cached
            if st.st_nlink > 1:
                self._linked.add((d, name))
            return
        cached_skip = old.skipped.get(name) if old is not None else None
        if cached_skip is not None and cached_skip[0] == key and not touched:
            d.skipped[name] = cached_skip
            return
        if stat.S_ISLNK(mode):
            try:
                data = os.fsencode(os.readlink(name, dir_fd=fd))
            except OSError as err:
                d.skipped[name] = (None, f"cannot read the link: {err.strerror}")
                return
            entry_mode = MODE_LINK
        else:
            got = self._read(fd, name)
            if isinstance(got, str):
                d.skipped[name] = (None if got.startswith("cannot") else key, got)
                return
            data, st = got
            key = _key(st)
            entry_mode = MODE_EXEC if st.st_mode & stat.S_IXUSR else MODE_FILE
            if st.st_nlink > 1:
                if self._hinted and (d, name) not in self._linked:
                    raise _NeedFull  # a new hard link: an event through the other name would not name this one
                self._linked.add((d, name))
        oid = pygit2.hash(data)
        if oid not in self.repo:
            if self._index.used_bytes + len(data) > self.budget_bytes:
                d.skipped[name] = (key, f"the checkpoint budget of {self.budget_bytes} bytes is spent")
                return
            self.repo.create_blob(data)
            self._index.used_bytes += len(data)
        racy = key[4] >= self._scan_started_ns - RACY_NS or key[3] >= self._scan_started_ns - RACY_NS
        d.files[name] = (None if racy else key, entry_mode, oid)

    def _read(self, fd: int, name: str) -> tuple[bytes, os.stat_result] | str:
        """The file's bytes and the fstat of what was read, or why it was not read."""
        try:
            ffd = os.open(name, _FILE_FLAGS, dir_fd=fd)
        except OSError as err:  # swapped since the lstat: ELOOP (a symlink now), ENXIO (a socket), ...
            return f"cannot open it safely: {err.strerror}"
        try:
            st = os.fstat(ffd)
            if not stat.S_ISREG(st.st_mode):
                return f"cannot checkpoint it: {_special_reason(st.st_mode)}"
            if st.st_size > self.max_file_bytes:
                return f"larger than {self.max_file_bytes} bytes ({st.st_size})"
            chunks: list[bytes] = []
            total = 0
            while total <= self.max_file_bytes:
                chunk = os.read(ffd, min(1 << 20, self.max_file_bytes + 1 - total))
                if not chunk:
                    return b"".join(chunks), st
                chunks.append(chunk)
                total += len(chunk)
            return f"larger than {self.max_file_bytes} bytes (it grew while being read)"
        except OSError as err:
            return f"cannot read it: {err.strerror}"
        finally:
            os.close(ffd)

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
        since every insert costs libgit2 an object lookup."""
        if names is None or d.tree is None:
            tb = self.repo.TreeBuilder()
            names = set(d.files) | set(d.dirs)
        else:
            tb = self.repo.TreeBuilder(d.tree)
        for name in names:
            if name in d.files:
                _, mode, oid = d.files[name]
                tb.insert(name, oid, mode)
            elif name in d.dirs:
                sub = d.dirs[name]
                assert sub.tree is not None
                tb.insert(name, sub.tree, MODE_TREE)
            elif tb.get(name) is not None:
                tb.remove(name)
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
        for d in sorted(touched, key=lambda x: x.rel.count("/") if x.rel else -1):
            if not self._attached(d):
                continue  # dropped by an earlier rescan in this record
            fd = self._open_rel(d)
            try:
                for name in sorted(touched[d]):
                    before = d.files.get(name), d.dirs.get(name)
                    self._scan_entry(d, fd, name, None, d.rel.count("/") + (1 if d.rel else 0), touched=True)
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
        for d in sorted(pending, key=lambda x: -(x.rel.count("/") + bool(x.rel))):
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
        fd = os.open(self.workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in d.rel.split("/") if d.rel else []:
                try:
                    sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
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
    """Whether one tree entry changed; the files it concerns go into `changes`."""
    (file_a, dir_a), (file_b, dir_b) = before, after
    if dir_a is not None and dir_a is dir_b:
        return False  # the same directory: its own events report what is inside
    if file_a is not None and file_b is not None and file_a[1:] == file_b[1:]:
        return False
    if file_a is None and dir_a is None and file_b is None and dir_b is None:
        return False
    for f, sub in ((file_a, dir_a), (file_b, dir_b)):
        if f is not None:
            changes.add(rel)
        if sub is not None:
            changes.update(_dir_files(sub))
    return True


def _dir_files(d: _Dir) -> Iterable[str]:
    for sub in d.all_dirs():
        yield from (sub.child_rel(n) for n in sub.files)


def _same_entries(d: _Dir, old: _Dir) -> bool:
    return (d.files.keys() == old.files.keys() and d.dirs.keys() == old.dirs.keys()
            and all(entry[1:] == old.files[n][1:] for n, entry in d.files.items())
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


def _tree_files(repo: pygit2.Repository, tree: pygit2.Tree, prefix: str) -> Iterable[str]:
    for e in tree:
        rel = f"{prefix}{e.name}"
        if e.filemode == MODE_TREE:
            yield from _tree_files(repo, _object(repo, e.id, pygit2.Tree), rel + "/")
        else:
            yield rel


# --- restore --------------------------------------------------------------------------------

class _Restorer:
    """Makes one directory (an fd) equal to one tree, through fds only; never follows a link."""

    def __init__(self, repo: pygit2.Repository, keep: set[str], report: RestoreReport, uid: int, gid: int) -> None:
        self.repo, self.keep, self.report, self.uid, self.gid = repo, keep, report, uid, gid
        self.chown = os.geteuid() == 0

    def sync_dir(self, fd: int, rel: str, tree: pygit2.Tree, depth: int) -> None:
        wanted = {e.name: e for e in tree if e.name is not None and _plain_name(e.name)}
        present = {n: os.lstat(n, dir_fd=fd) for n in os.listdir(fd)}
        staying = {n for n in present if is_git_name(n) or _join(rel, n) in self.keep}
        if _repository_shape({*wanted, *staying}):
            # The directory would come back as a bare repository (HEAD with objects/ and refs/, or
            # a commondir) that the user's git obeys: a box planted it during the session, and the
            # sweep defused it by moving HEAD out. Its HEAD and commondir are not restored.
            for name in [n for n in wanted if n.casefold() in ("head", "commondir")]:
                del wanted[name]
                self.report.skipped.append(Skipped(path=_join(rel, name), reason="it would make its directory a repository git obeys (HEAD with objects/ and refs/, or a commondir)"))
        for name, st in present.items():
            if name in wanted or is_git_name(name) or _join(rel, name) in self.keep:
                continue
            self._remove(fd, name, _join(rel, name), st, depth)
        for name, entry in wanted.items():
            child = _join(rel, name)
            if child in self.keep:
                continue
            there = present.get(name)
            if entry.filemode == MODE_TREE:
                self._sync_subdir(fd, name, child, there, entry, depth)
            elif entry.filemode in (MODE_FILE, MODE_EXEC, MODE_LINK):
                self._sync_leaf(fd, name, child, there, entry)

    def _sync_subdir(self, fd: int, name: str, rel: str, st: os.stat_result | None, entry: pygit2.Object, depth: int) -> None:
        if depth + 1 >= MAX_DEPTH:
            self.report.skipped.append(Skipped(path=rel, reason=f"deeper than {MAX_DEPTH} levels"))
            return
        if st is not None and not stat.S_ISDIR(st.st_mode):
            self._remove(fd, name, rel, st, depth)  # a symlink, file or FIFO where a directory belongs: the entry itself goes
            st = None
        if st is None:
            os.mkdir(name, 0o755, dir_fd=fd)
            if self.chown:
                os.chown(name, self.uid, self.gid, dir_fd=fd, follow_symlinks=False)
        sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
        try:
            self.sync_dir(sub, rel, _object(self.repo, entry.id, pygit2.Tree), depth + 1)
        finally:
            os.close(sub)

    def _sync_leaf(self, fd: int, name: str, rel: str, st: os.stat_result | None, entry: pygit2.Object) -> None:
        data = _object(self.repo, entry.id, pygit2.Blob).data
        if st is not None and self._same(fd, name, st, entry.filemode, data):
            return
        if st is not None and stat.S_ISDIR(st.st_mode):
            if not self._remove(fd, name, rel, st, 0):
                self.report.skipped.append(Skipped(path=rel, reason="a directory holding entries never checkpointed is in its way"))
                return
        tmp = f".oa-restore-{os.urandom(6).hex()}"
        if entry.filemode == MODE_LINK:
            os.symlink(os.fsdecode(data), tmp, dir_fd=fd)
            if self.chown:
                os.chown(tmp, self.uid, self.gid, dir_fd=fd, follow_symlinks=False)
        else:
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(out, view):]
                os.fchmod(out, 0o755 if entry.filemode == MODE_EXEC else 0o644)
                if self.chown:
                    os.fchown(out, self.uid, self.gid)
                os.fsync(out)
            finally:
                os.close(out)
        try:
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)  # replaces a file or a link itself, never through it
        except OSError:
            os.unlink(tmp, dir_fd=fd)
            raise
        self.report.restored.append(rel)

    def _same(self, fd: int, name: str, st: os.stat_result, mode: int, data: bytes) -> bool:
        if mode == MODE_LINK:
            return stat.S_ISLNK(st.st_mode) and os.fsencode(os.readlink(name, dir_fd=fd)) == data
        if not stat.S_ISREG(st.st_mode) or st.st_size != len(data) or st.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX):
            return False
        if bool(st.st_mode & stat.S_IXUSR) != (mode == MODE_EXEC):
            return False
        try:
            ffd = os.open(name, _FILE_FLAGS, dir_fd=fd)
        except OSError:
            return False
        try:
            got = os.fstat(ffd)
            if not stat.S_ISREG(got.st_mode) or got.st_ino != st.st_ino:
                return False
            chunks, total = [], 0
            while total <= len(data):
                chunk = os.read(ffd, min(1 << 20, len(data) + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            return b"".join(chunks) == data
        finally:
            os.close(ffd)

    def _remove(self, fd: int, name: str, rel: str, st: os.stat_result, depth: int) -> bool:
        """Remove the entry itself (a link is unlinked, never followed). A directory keeps what
        must stay (.git entries, never-checkpointed paths); False when anything stayed."""
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=fd)
            self.report.removed.append(rel)
            return True
        if depth + 1 >= MAX_DEPTH:
            return False
        sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
        complete = True
        try:
            for child in os.listdir(sub):
                child_rel = _join(rel, child)
                if is_git_name(child) or child_rel in self.keep:
                    complete = False
                    continue
                complete = self._remove(sub, child, child_rel, os.lstat(child, dir_fd=sub), depth + 1) and complete
        finally:
            os.close(sub)
        if complete:
            os.rmdir(name, dir_fd=fd)
            self.report.removed.append(rel + "/")
        return complete


def _repository_shape(names: Iterable[str]) -> bool:
    """Names that make git take a directory for a repository (integrity.git_shaped, by names)."""
    folded = {n.casefold() for n in names}
    return "head" in folded and ("commondir" in folded or {"objects", "refs"} <= folded)


def _join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def _plain_name(name: str) -> bool:
    """Our own trees hold nothing else; a tampered store must not make restore write elsewhere."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name and not is_git_name(name)
