"""A fresh copy's integrity baseline, counted while the copy is made (issue 50).

The integrity sweep needs a baseline of what the box's workspace held before the box could write
(workspace/integrity.py). In copy mode that workspace is a copy the host has just made itself: every
entry in it was created by copy.py, which already holds each one's stat. Walking the copy again
cost a whole-tree walk on the first answer's path (16 s of a 40,000-file copy session's open at
load 17). So the copy counts, entry by entry, exactly what `Baseline._capture` would find walking
it: the entries outside `.git` entries (which the walk does not enter), their allocated bytes
(each inode once), every `.git` entry's identity, and every directory git takes for a repository
(HEAD beside objects/ and refs/, or beside `commondir`, checked by the same `git_shaped` on the
copy's directory once the copy is complete). The copy drops setuid/setgid bits, special files and
the top `.git`, so none can be in the baseline.

Only a copy that ended whole gives a baseline; a census past the walk's entry budget gives none
(the walk would refuse, and the caller then walks, and refuses, as before). A resumed session's
copy was written by a box: its baseline is always walked.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..boxfs import BoxDir, HostBudget
from .integrity import Baseline, git_shaped, is_git_name, is_head_name


class CopyCensus:
    """What `Baseline._capture` would count on the copy, fed by copy.py as it creates each entry."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.entries = 0
        self.usage = 0
        self.seen: set[int] = set()  # inodes counted (one file system: the copy's)
        self.git: dict[str, int] = {}  # .git entries outside other .git entries: path -> inode
        self.heads: list[bytes] = []  # directories with a HEAD entry (outside .git entries): checked at the end

    def add(self, rel: bytes, st: os.stat_result) -> None:
        """One entry of the copy, as it stands when the copy is complete (a directory's stat once its
        children are in: its size grows with them)."""
        parent, _, name = rel.rpartition(b"/")
        if parent and any(is_git_name(os.fsdecode(part)) for part in parent.split(b"/")):
            return  # inside a .git entry: the walk does not go there
        self.entries += 1
        if st.st_ino not in self.seen:
            self.seen.add(st.st_ino)
            self.usage += st.st_blocks * 512
        text = os.fsdecode(name)
        if is_git_name(text):
            self.git[os.fsdecode(rel)] = st.st_ino
        elif is_head_name(text):
            self.heads.append(parent)

    def baseline(self, copy: Path) -> Baseline | None:
        """The copy's baseline, or None where only a walk may say (past the walk's entry budget)."""
        limit = HostBudget().max_entries
        if limit is not None and self.entries > limit:
            return None
        with BoxDir.open(copy, HostBudget()) as root:
            dev = os.fstat(root.fd).st_dev
            git = {rel: (dev, ino) for rel, ino in self.git.items()}
            shaped: set[tuple[int, int]] = set()
            for parent in self.heads:
                key = _shaped(root, parent)
                if key is None:
                    continue
                shaped.add(key)
                if parent:  # the user's own bare repository: kept, and mounted read-only like a .git
                    git[os.fsdecode(parent)] = key
        return Baseline(
            git,
            frozenset(),  # copy.py clears every setuid/setgid bit
            False,  # the top .git is never copied (the real one is mounted read-only over the copy)
            self.usage,
            time.monotonic() - self.started,
            frozenset(shaped),
            self.entries,
        )


def _shaped(root: BoxDir, parent: bytes) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the copy's directory `parent` if git takes it for a repository, else None.
    Reached a component at a time, no link followed (as the walk reaches it)."""
    where = [root]
    try:
        for part in parent.split(b"/") if parent else []:
            where.append(where[-1].sub(part))
        if not git_shaped(where[-1].fd):
            return None
        st = os.fstat(where[-1].fd)
        return st.st_dev, st.st_ino
    finally:
        for opened in where[1:]:
            opened.close()
