"""The object store on disk: what each object costs, the store's budget, packing.

The store's real growth is what the budget bounds, so every object is charged before it is
written, small loose objects are packed during and after each record, and the store's allocated
bytes are measured; a record that would pass the budget raises _StoreFull. The store is ours, so
its own files are walked plainly; nothing here touches the workspace.
"""

from __future__ import annotations

import builtins
import os
import stat
from pathlib import Path
from typing import Iterable, TypeVar

import pygit2
from pygit2.enums import RepositoryOpenFlag

from .packwrite import OBJ_BLOB, PackWriter, object_id

MODE_FILE, MODE_EXEC, MODE_LINK, MODE_TREE = 0o100644, 0o100755, 0o120000, 0o040000
BLOCK = 4096  # what one loose object costs at least on disk
OBJECT_OVERHEAD = 64  # header and compression framing of one object, counted generously
PACKS_BEFORE_REPACK = 32
SMALL_LOOSE = 64 << 10  # blobs of this size or more are never packed: they stay loose files
PACK_EVERY = 32 << 20  # loose bytes a record may have at once before they are packed (at most a quarter of the budget)


class _StoreFull(Exception):
    def __init__(self, budget: int, used: int) -> None:
        super().__init__(
            f"the checkpoint store's budget of {budget} bytes on disk is spent ({used} bytes with this checkpoint)"
        )


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


class _ObjectStore:
    """The bare repository and its accounting. CheckpointStore is one: its __init__ sets these
    (and says what each holds), its record resets them."""

    store: Path
    repo: pygit2.Repository
    budget_bytes: int
    _pending: int
    _base: int
    _record_packs: set[Path]
    _loose_at_start: set[Path]
    _big_blobs: set[pygit2.Oid]
    _packer: PackWriter | None  # a first record's objects go straight into this pack (packwrite.py)
    _packer_fresh: bool  # the store held no object when it began: no lookup before each write

    def _open_repo(self) -> pygit2.Repository:
        return pygit2.Repository(str(self.store), RepositoryOpenFlag.NO_SEARCH | RepositoryOpenFlag.BARE)

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

    def _direct_begin(self, fresh: bool) -> None:
        """From now until _direct_end, objects go straight into one new pack."""
        self._packer, self._packer_fresh = PackWriter(self.store / "objects" / "pack"), fresh

    def _direct_end(self) -> None:
        packer, self._packer = self._packer, None
        if packer is None:
            return
        try:
            path = packer.finish()
        except BaseException:
            packer.abort()
            raise
        if path is not None:
            self._record_packs.add(path)
            self.repo = self._open_repo()  # the new pack is seen at once

    def _direct_abort(self) -> None:
        packer, self._packer = self._packer, None
        if packer is not None:
            packer.abort()

    def _put_blob(self, data: bytes) -> pygit2.Oid:
        """A blob of `data` in the store (written only when it is not there yet): its id."""
        packer = self._packer
        if packer is None:
            oid = pygit2.hash(data)
            if oid not in self.repo:
                self._charge_object(len(data))
                self.repo.create_blob(data)
                if len(data) >= SMALL_LOOSE:
                    self._big_blobs.add(oid)
            return oid
        return self._put_packed(OBJ_BLOB, data)

    def _put_packed(self, kind: int, data: bytes) -> pygit2.Oid:
        """`data` as an object of `kind` into this record's pack; charged as what the pack grew by."""
        packer = self._packer
        assert packer is not None
        raw = object_id(kind, data)
        oid = pygit2.Oid(raw=raw)
        if raw in packer or (not self._packer_fresh and oid in self.repo):
            return oid
        before = packer.written
        packer.add(kind, data, raw)
        self._pending += packer.written - before
        if self._base + self._pending > self.budget_bytes:
            raise _StoreFull(self.budget_bytes, self._base + self._pending)
        return oid

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
                            out.append(
                                (
                                    pygit2.Oid(hex=fan.name + item.name),
                                    Path(item.path),
                                    item.stat(follow_symlinks=False).st_size,
                                )
                            )
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
        loose = [
            item for item in self._loose() if item[1] not in self._loose_at_start and item[0] not in self._big_blobs
        ]
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
