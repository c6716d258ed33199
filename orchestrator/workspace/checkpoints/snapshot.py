"""Walking the workspace into trees: all of it, or only what the inotify hints name.

Every byte is the box's, so the walk is boxfs's (iterative, fd-relative, no link followed,
bounded): blobs are made from the bytes boxfs read, and what the sandbox user could not read, a
FIFO, socket or device, or a file over the size cap is listed as skipped, never stored.

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
import os
import stat
import threading
import time
from pathlib import Path

from ...boxfs import BoxDir, HostBudget, Walk, open_dir, show
from ...errors import ErrorType, OpenAgentsError
from ..integrity import is_git_name, special_kind, special_name
from .baseline import CHANGED_SINCE_COPY, CopyBaseline
from .dirs import _Dir, _entry_changed, _key, _meta, _same_entries, _ts, _under
from .ignore import IGNORE_FILE, IGNORED, MAX_DEPTH_RULES, ignored, read_rules
from .index import _Index
from .objects import MODE_EXEC, MODE_FILE, MODE_LINK, MODE_TREE, _ObjectStore
from .packwrite import OBJ_TREE, tree_data
from .watcher import IN_IGNORED, IN_ISDIR, IN_MOVE_SELF, IN_MOVED_FROM, IN_MOVED_TO, IN_Q_OVERFLOW, _Watcher

IGNORE_NAME = IGNORE_FILE.decode()
RACY_NS = 50_000_000  # a stat taken this close to a change may not show the next one (coarse clock)
NOT_READABLE = "not readable by the sandbox user (never stored)"


class _NeedFull(Exception):
    """The hints cannot be trusted for this record: walk everything."""


class _Snapshots(_ObjectStore):
    """The walk's state across records: the picture of the last walk, the watches, this record's
    budget. CheckpointStore is one: its __init__ sets these (and says what each holds)."""

    workspace: Path
    box_user: tuple[int, int]
    max_file_bytes: int
    _budget: HostBudget
    _root: _Dir | None
    _wds: dict[int, _Dir]
    _linked: set[tuple[_Dir, str]]
    _watcher: _Watcher | None
    _scan_started_ns: int
    _hinted: bool
    _index: _Index
    _cancel: threading.Event  # set: the background record (on the thread `_first`) stops
    _first: threading.Thread | None
    baseline: CopyBaseline | None  # copy mode: turn 0 from the real workspace (baseline.py), once
    _from: CopyBaseline | None  # during that walk only

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
        base, self.baseline = self.baseline, None
        if base is not None and (old is not None or any(c.ok for c in self._index.checkpoints)):
            base = None  # only ever the first record of a new session
        if base is not None:
            if self._watcher is not None:
                self._watcher.close()
            self._watcher = None  # no watch on the real tree: the next record walks the copy in full
        elif self._watcher is None or self._watcher.broken:
            if self._watcher is not None:
                self._watcher.close()
            self._watcher = _Watcher()
        else:
            self._watcher.drain()  # everything is walked anyway
        seen_wds = self._wds
        self._wds, self._linked = {}, set()
        if old is None:  # a workspace this process never walked: every object is new, into one pack
            self._direct_begin(fresh=not any(c.ok for c in self._index.checkpoints))
        if base is not None:
            base.load()
        fd = open_dir(base.real if base is not None else self.workspace)
        try:
            st = os.fstat(fd)
            if base is not None:  # the copy's root: its inode, made 0755 and the sandbox user's by the copy
                st = os.stat_result(
                    (stat.S_IFDIR | 0o755, os.stat(self.workspace).st_ino, 0, 1, *base.owner, 0, 0, 0, 0)
                )
            root = _Dir("", st.st_ino, None, _meta(st), old=old)
            root.ignore = tuple(read_rules(fd, ""))
            self._watch(root, fd)
            self._from = base
            try:
                self._fill(root, fd)
            finally:
                self._from = None
            if base is not None:
                self._gone(root, base)
        finally:
            os.close(fd)
        self._direct_end()
        if self._watcher is not None:
            for wd in set(seen_wds) - set(self._wds):
                self._watcher.remove(wd)
        self._root = root
        return root

    def _gone(self, root: _Dir, base: CopyBaseline) -> None:
        """Copied entries the walk of the real tree never met: listed as skipped where their parent
        was walked (a gone directory once, not what it held; one under a skipped one is not named)."""
        for parts, why in base.missing():
            node: _Dir | None = root
            for part in parts[:-1]:
                node = node.dirs.get(part) if node is not None else None
            name = parts[-1]
            if node is None or is_git_name(name) or name in node.files or name in node.dirs or name in node.skipped:
                continue
            node.skipped[name] = (None, why)
            node.odd = None

    def _watch(self, d: _Dir, fd: int) -> None:
        if self._watcher is None:  # turn 0 read from the real workspace: nothing of it is watched
            return
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
            if self._cancel.is_set() and threading.current_thread() is self._first:
                raise OpenAgentsError(
                    ErrorType.CANCELLED, "cancelled: the session ended before this checkpoint was complete"
                )
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

    def _entry(
        self, d: _Dir, fd: int, name: str, st: os.stat_result, old: _Dir | None, touched: bool
    ) -> tuple[_Dir, int] | None:
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
        real_st, base = st, self._from
        if base is not None:
            found = base.look(rel, st)
            if found is None:  # not in the copy (made since, or left out of it): never in the box's workspace
                self._drop(prev_dir)
                return None
            if found[1] is not None:
                if not (d.ignore and ignored(d.ignore, rel, stat.S_ISDIR(mode))):
                    d.skipped[name] = (None, found[1])
                    self._drop(prev_dir)
                    return None
            else:
                assert found[0] is not None
                st = found[0]  # the copy's: its mode, owner, inode, times (the stat cache's key for the next walk)
        if d.ignore and ignored(d.ignore, rel, stat.S_ISDIR(mode)):
            d.skipped[name] = (None, IGNORED)  # listed, never silently left out; an ignored directory is not walked
            self._drop(prev_dir)
            return None
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
                sub_fd = BoxDir.at(fd).sub(raw).detach()
            except OSError as err:
                d.skipped[name] = (None, f"cannot open the directory: {err.strerror}")
                return None
            if os.fstat(sub_fd).st_ino != real_st.st_ino:
                os.close(sub_fd)
                d.skipped[name] = (None, "it changed while being walked")
                return None
            sub = _Dir(
                rel, st.st_ino, d, _meta(st), old=reuse if reuse is not None and reuse.ino == st.st_ino else None
            )
            sub.ignore = (d.ignore + tuple(read_rules(sub_fd, rel)))[-MAX_DEPTH_RULES:]
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
                data = BoxDir.at(fd).readlink(raw)
            except OSError as err:
                d.skipped[name] = (None, f"cannot read the link: {err.strerror}")
                return None
            if base is not None and (
                len(data) != st.st_size or not base.unchanged(rel, BoxDir.at(fd).lstat_or_none(raw))
            ):
                d.skipped[name] = (None, CHANGED_SINCE_COPY)
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
                data, read_st = BoxDir.at(fd).read(raw, self.max_file_bytes, os.fsencode(rel))
            except OpenAgentsError as err:  # swapped since the lstat, grew past the cap, unreadable
                d.skipped[name] = (None, f"cannot checkpoint it: {err.message}")
                return None
            self._budget.charge_bytes(len(data))
            if base is None:
                st = read_st
            elif (
                len(data) != st.st_size
                or read_st.st_ino != real_st.st_ino
                or not base.unchanged(rel, read_st)
                or not base.unchanged(rel, BoxDir.at(fd).lstat_or_none(raw))
            ):  # the user changed it while it was read: what was copied is not known
                d.skipped[name] = (None, CHANGED_SINCE_COPY)
                return None
            if not self._box_reads(st, False):  # swapped for another inode since the lstat
                d.skipped[name] = (None, NOT_READABLE)
                return None
            key = _key(st)
            entry_mode = MODE_EXEC if st.st_mode & stat.S_IXUSR else MODE_FILE
            if st.st_nlink > 1 and base is None:
                if self._hinted and (d, name) not in self._linked:
                    raise _NeedFull  # a new hard link: an event through the other name would not name this one
                self._linked.add((d, name))
        oid = self._put_blob(data)
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
        if self._packer is not None and names is None:  # a first record's tree: written by us into its pack
            entries = [(_ts(n), f[1], f[2]) for n, f in d.files.items()]
            for n, sub in d.dirs.items():
                assert sub.tree is not None  # deepest first
                entries.append((_ts(n), MODE_TREE, sub.tree))
            d.tree = self._put_packed(OBJ_TREE, tree_data(entries))
            return
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
            if (
                mask & IN_Q_OVERFLOW
                or mask & IN_MOVE_SELF
                or (mask & IN_ISDIR and mask & (IN_MOVED_FROM | IN_MOVED_TO))
            ):
                raise _NeedFull  # a moved directory makes our wd -> path map stale
            d = self._wds.get(wd)
            if d is None:
                continue
            if mask & IN_IGNORED:
                del self._wds[wd]
                continue
            if name == IGNORE_NAME:
                raise _NeedFull  # what is ignored below may have changed
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
                        st = BoxDir.at(fd).lstat(os.fsencode(name))
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
                    sub = BoxDir.at(fd).sub(os.fsencode(part)).detach()
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


def _special_reason(mode: int) -> str:
    if special_kind(mode):
        return f"{special_name(mode)} (not checkpointed)"
    return "not a regular file, directory or symlink"
