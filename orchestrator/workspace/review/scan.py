"""What the box changed in the copy: the one scan that review, the diff and apply all start from.

The copy is walked by boxfs's iterative, budgeted Walk (no link followed, nothing under a `.git`
entered) and compared with the manifest the copy was made with; a directory the walk could not
enter is reported as such, so nothing under it reads as "deleted". Paths stay in `boxfs.to_store`
form; `shown` is the only way one reaches a person.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from ...boxfs import BoxDir, HostBudget, Walk, from_store, show, to_store
from ..copy import COPY_MAX_DEPTH, CopyManifest, Stamp

ChangeKind = Literal["added", "modified", "deleted", "type_changed", "mode_changed"]


class Change(BaseModel):
    """One entry the box changed in the copy, relative to the copy as it was made."""

    path: str  # boxfs.to_store form (from_store gives the bytes; shown() the line for a person)
    status: ChangeKind
    before: Stamp | None = None  # the copy right after it was made (None: added)
    after: Stamp | None = None  # the copy now (None: deleted)
    fmt: int = 0  # S_IFMT of the entry now: tells a FIFO from a socket from a device
    nlink: int = 1
    box_link: bool = False  # a hard link made in the box (not one the copy kept from the real tree)


def shown(path: str) -> str:
    """A path kept in to_store form, as a person sees it: boxfs.show of its bytes (one line)."""
    return show(from_store(path))


def _box_made_link(manifest: CopyManifest, path: str, ino: int, nlink: int) -> bool:
    """Whether a file with `nlink` names is a hard link made in the box: any, unless it is the
    copy's own inode at `path` with no more names than the copy gave it (a hard-linked group of the
    real tree is copied as one linked group: each of its names is carried as a file)."""
    if nlink <= 1:
        return False
    entry = manifest.entries.get(path)
    return not (
        entry is not None and entry.copy.kind == "file" and entry.copy.ino == ino and nlink <= manifest.link_group(ino)
    )


def _is_git(name: str) -> bool:
    return name.casefold() == ".git"


def _in_git(rel: str) -> bool:
    return any(_is_git(part) for part in rel.split("/"))


@dataclass
class _Scan:
    changes: list[Change]
    git_entries: list[str]  # .git entries (any case) the box added or changed: never carried
    too_deep: list[str]  # directories not entered (deeper than the budget's depth)
    depth: int
    unreadable: list[tuple[str, str]]  # directories that could not be opened or listed, and why


def _status(before: Stamp, now: Stamp) -> ChangeKind | None:
    if before.kind != now.kind:
        return "type_changed"
    if now.kind != "dir" and (before.size, before.mtime_ns) != (now.size, now.mtime_ns):
        return "modified"  # a directory's mtime moves with its entries: those are reported themselves
    if before.mode != now.mode:
        return "mode_changed"
    return None


def _scan(manifest: CopyManifest, budget: HostBudget | None = None) -> _Scan:
    changes: list[Change] = []
    git: list[str] = []
    seen: set[str] = set()
    walk = Walk(
        manifest.copy_dir,
        budget if budget is not None else HostBudget(max_depth=COPY_MAX_DEPTH),
        enter=lambda e: not _is_git(os.fsdecode(e.name)),
    )  # never enters a .git
    for found in walk.entries():
        rel, now = to_store(found.rel), Stamp.of(found.st)
        entry = manifest.entries.get(rel)
        if _is_git(os.fsdecode(found.name)):
            if entry is None or not now.same_as(entry.copy):
                if not (rel == ".git" and _empty_dir(found.dir_fd, found.name)):  # the .git mount point
                    git.append(rel)
            continue
        seen.add(rel)
        fmt, nlink = stat.S_IFMT(found.st.st_mode), found.st.st_nlink
        linked = stat.S_ISREG(found.st.st_mode) and _box_made_link(manifest, rel, found.st.st_ino, nlink)
        if entry is None:
            changes.append(Change(path=rel, status="added", after=now, fmt=fmt, nlink=nlink, box_link=linked))
        elif status := _status(entry.copy, now):
            changes.append(
                Change(path=rel, status=status, before=entry.copy, after=now, fmt=fmt, nlink=nlink, box_link=linked)
            )
    too_deep = [to_store(r) for r in walk.too_deep]
    unreadable = [(to_store(r), why) for r, why in walk.unreadable]
    unseen = tuple(
        r + "/" for r in too_deep + [u for u, _ in unreadable]
    )  # not looked into: nothing there is "deleted"
    for rel, entry in manifest.entries.items():
        if rel not in seen and not _in_git(rel) and not rel.startswith(unseen):
            changes.append(Change(path=rel, status="deleted", before=entry.copy))
    changes.sort(key=lambda c: c.path.split("/"))
    return _Scan(changes, sorted(git), too_deep, walk.budget.max_depth, unreadable)


def _empty_dir(dir_fd: int, name: bytes) -> bool:
    try:
        sub = BoxDir.at(dir_fd).sub(name)
    except OSError:
        return False
    with sub:
        return sub.is_empty()


def list_changes(manifest: CopyManifest, budget: HostBudget | None = None) -> list[Change]:
    """What the box changed in the copy since it was made, parents before children; nothing in or
    under any `.git` (any case) is ever reported or entered. The scan is bounded by `budget`
    (default: boxfs's, with the copy's depth, COPY_MAX_DEPTH); over it,
    BudgetExceeded (typed RESOURCE_EXHAUSTED), never a short list."""
    return _scan(manifest, budget).changes
