"""Walking a box-written tree: iterative, fd-relative, no link followed, bounded.

A stack of open directory descriptors replaces recursion, so a 100,000-deep chain costs no
Python frames; each directory is entered through its parent's descriptor with O_NOFOLLOW, so a
directory swapped for a symlink mid-walk is refused by the kernel, not followed. Names are bytes.
Every entry is charged to the budget before it is yielded; a directory deeper than the budget's
depth is yielded but not entered, and named in `too_deep`; one that cannot be opened or listed is
named in `unreadable`. A walk that met either is not `complete`: a caller that counts, compares or
snapshots must say so rather than report "no change".
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from .budget import HostBudget
from .read import DIR_FLAGS, open_dir

_KINDS = ((stat.S_ISREG, "file"), (stat.S_ISDIR, "dir"), (stat.S_ISLNK, "symlink"))


def kind_of(mode: int) -> str:
    """file, dir, symlink, or special (FIFO, socket, device: nothing the host ever opens)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "special"


class Entry:
    """One entry met by the walk: its parent's descriptor (valid only while the entry is being
    handled), its name and path (bytes), its lstat and its depth (the root's children are at 1).
    Acting through (dir_fd, name) means a parent swapped for a link cannot redirect the act."""

    __slots__ = ("dir_fd", "name", "rel", "st", "depth")

    def __init__(self, dir_fd: int, name: bytes, rel: bytes, st: os.stat_result, depth: int) -> None:
        self.dir_fd, self.name, self.rel, self.st, self.depth = dir_fd, name, rel, st, depth

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.st.st_mode)

    @property
    def key(self) -> tuple[int, int]:
        return self.st.st_dev, self.st.st_ino

    @property
    def text(self) -> str:
        """The path as str (os.fsdecode: undecodable bytes as lone surrogates; round-trips exactly)."""
        return os.fsdecode(self.rel)

    @property
    def name_text(self) -> str:
        return os.fsdecode(self.name)


@dataclass
class Walk:
    """One walk of the tree under `root` (a path or a directory descriptor, which is not closed).

    `enter(entry)` says whether a directory is entered (default: all). Iterate `entries()` once.
    """

    root: Path | str | int
    budget: HostBudget = field(default_factory=HostBudget)
    enter: Callable[[Entry], bool] = lambda entry: True
    sort: bool = False
    too_deep: list[bytes] = field(default_factory=list)
    unreadable: list[tuple[bytes, str]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.too_deep and not self.unreadable

    def entries(self) -> Iterator[Entry]:
        root_fd = os.dup(self.root) if isinstance(self.root, int) else open_dir(self.root)
        # (descriptor, its path, its depth, its names left to visit), innermost last
        stack: list[tuple[int, bytes, int, list[bytes]]] = []
        try:
            names = self._list(root_fd, b"")
            stack.append((root_fd, b"", 0, names))
            root_fd = -1
            while stack:
                fd, rel_dir, depth, names = stack[-1]
                if not names:
                    os.close(stack.pop()[0])
                    continue
                name = names.pop()
                self.budget.check_time()
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue  # gone since the listing
                self.budget.charge_entries()
                entry = Entry(fd, name, rel_dir + b"/" + name if rel_dir else name, st, depth + 1)
                yield entry
                if not stat.S_ISDIR(st.st_mode) or not self.enter(entry):
                    continue
                if not self.budget.check_depth(depth + 2):
                    self.too_deep.append(entry.rel)
                    continue
                try:
                    sub = os.open(name, DIR_FLAGS, dir_fd=fd)
                except OSError as err:  # swapped for a link (ELOOP) or a file, or unreadable
                    self.unreadable.append((entry.rel, err.strerror or str(err)))
                    continue
                try:
                    if (os.fstat(sub).st_dev, os.fstat(sub).st_ino) != entry.key:
                        self.unreadable.append((entry.rel, "it changed while being walked"))
                        os.close(sub)
                        continue
                    sub_names = self._list(sub, entry.rel)
                except BaseException:
                    os.close(sub)
                    raise
                stack.append((sub, entry.rel, depth + 1, sub_names))
        finally:
            if root_fd >= 0:
                os.close(root_fd)
            for fd, *_ in stack:
                os.close(fd)

    def _list(self, fd: int, rel: bytes) -> list[bytes]:
        """The names in one directory, streamed so a directory of millions of names is refused at the
        entry budget, not held in memory first. Reversed when sorted, since the walk pops from the end."""
        names: list[bytes] = []
        remaining = self.budget.max_entries
        try:
            with os.scandir(fd) as it:
                for item in it:
                    names.append(os.fsencode(item.name))
                    if remaining is not None and len(names) > remaining - self.budget.entries_spent:
                        self.budget.charge_entries(len(names))  # raises: over the budget before any is visited
                    if len(names) & 0xFFF == 0:
                        self.budget.check_time()
        except OSError as err:
            self.unreadable.append((rel, err.strerror or str(err)))
            return []
        if self.sort:
            names.sort(reverse=True)
        return names
