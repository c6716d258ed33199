"""The in-memory picture of the last walk: one _Dir a directory, each file's stat key and blob.

It is both the stat cache of a full walk (an unchanged file is not read again) and what the
inotify hints are applied to, so a directory nobody touched keeps its tree by oid.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterable

import pygit2

from ...boxfs import to_store
from .ignore import Rule

_Meta = tuple[int, int, int]  # (permission bits, uid, gid)
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
    ignore: tuple[Rule, ...] = ()  # the .gitignore rules in force here (its parents' and its own: ignore.py)

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


def _entry_changed(
    before: tuple[_File | None, _Dir | None], after: tuple[_File | None, _Dir | None], rel: str, changes: set[str]
) -> bool:
    """Whether one tree entry (or a file's mode or owner) changed;
    the files it concerns go into `changes` (to_store form)."""
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
    return (
        d.files.keys() == old.files.keys()
        and d.dirs.keys() == old.dirs.keys()
        and all(entry[1:3] == old.files[n][1:3] for n, entry in d.files.items())
        and all(sub.tree == old.dirs[n].tree for n, sub in d.dirs.items())
    )


def _under(d: _Dir, top: _Dir) -> bool:
    node: _Dir | None = d
    while node is not None:
        if node is top:
            return True
        node = node.parent
    return False
