"""Turn 0 of a copy session, recorded from the user's real workspace instead of the box's copy.

In copy mode the real workspace is untouched until `apply`: the box writes only its copy. So the
session's first checkpoint can be read from the real tree while the box already works on the
copy, and no call waits for it. What is recorded is the copy as it was made, checked entry by
entry against the copy's manifest (workspace/copy.py), which holds how each entry looked in the
real tree when it was copied and how its copy looked right after:

- an entry the manifest does not name (made in the real tree since, or left out of the copy: a
  FIFO, an unreadable file; the manifest lists those) was never in the box's workspace: it is not
  part of turn 0;
- an entry whose real file no longer looks as it did when copied (kind, size, mtime, mode: the
  same check `apply` makes), before or after it is read, or that is gone from the real tree, is
  listed as skipped with CHANGED_SINCE_COPY: turn 0 does not know its content, so rollback to
  turn 0 says it cannot restore it, never that nothing changed;
- modes, owners and the stat-cache keys are the copy's, from the manifest (the copy belongs to
  the sandbox user; setuid bits were dropped), so the next record's full walk of the copy reads
  again only what changed since the copy was made (its ctime, which the box cannot set back, is
  in the key).

Every walk and read of the real tree goes through boxfs as for the copy (no link followed,
bounded). The store keeps no inotify watch on the real tree: the record after turn 0 walks the
copy in full, once, and sets its watches then.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ...boxfs import from_store, to_store

CHANGED_SINCE_COPY = "changed in the real workspace since the copy was taken: its state at the start is not known"
GONE_SINCE_COPY = "gone from the real workspace since the copy was taken: its state at the start is not known"
_TYPE = {"file": stat.S_IFREG, "dir": stat.S_IFDIR, "symlink": stat.S_IFLNK}


class _Stamp(Protocol):
    kind: str
    mode: int
    size: int
    mtime_ns: int
    ino: int
    ctime_ns: int

    def same_as(self, other: "_Stamp | None") -> bool: ...


class _Entry(Protocol):
    real: _Stamp
    copy: _Stamp


@dataclass
class CopyBaseline:
    """The real workspace `real` and the copy's manifest (read from `manifest_path` when first
    needed, on the record's own thread). One use: the store drops it after turn 0."""

    real: Path
    manifest_path: Path
    owner: tuple[int, int] = (-1, -1)
    entries: dict[str, _Entry] | None = None
    met: set[str] = field(default_factory=set)

    def load(self) -> None:
        if self.entries is None:
            from ..copy import CopyManifest

            manifest = CopyManifest.load(self.manifest_path)
            self.entries = dict(manifest.entries)  # type: ignore[arg-type]
            self.owner = (manifest.uid, manifest.gid)

    def look(self, rel: str, st: os.stat_result) -> tuple[os.stat_result | None, str | None] | None:
        """For the real entry `rel` (its lstat `st`): None when it was not copied; else (the copy's
        stat as made, None) or (None, why turn 0 does not know it)."""
        assert self.entries is not None
        key = to_store(rel)
        entry = self.entries.get(key)
        if entry is None:
            return None
        self.met.add(key)
        if entry.real.kind != _kind(st.st_mode) or (entry.real.kind != "dir" and not self.unchanged(rel, st)):
            return None, CHANGED_SINCE_COPY
        return self.copy_stat(entry.copy), None

    def unchanged(self, rel: str, st: os.stat_result | None) -> bool:
        """Whether the real entry still looks as when it was copied (as `apply` checks it)."""
        assert self.entries is not None
        entry = self.entries.get(to_store(rel))
        if entry is None or st is None:
            return False
        return entry.real.kind == _kind(st.st_mode) and (
            entry.real.kind == "dir"
            or (
                entry.real.size == st.st_size
                and entry.real.mtime_ns == st.st_mtime_ns
                and entry.real.mode == stat.S_IMODE(st.st_mode)
            )
        )

    def copy_stat(self, copy: _Stamp) -> os.stat_result:
        """The copy's entry as the copy made it, as a stat: type and mode, inode, size, times, owner."""
        uid, gid = self.owner
        mode = _TYPE.get(copy.kind, 0) | copy.mode
        return os.stat_result(
            (mode, copy.ino, 0, 1, uid, gid, copy.size, copy.mtime_ns // 10**9, copy.mtime_ns // 10**9, 0),
            {"st_mtime_ns": copy.mtime_ns, "st_ctime_ns": copy.ctime_ns},
        )

    def missing(self) -> list[tuple[list[str], str]]:
        """The copied entries the walk never met (gone from the real tree): their path as fsdecode'd
        components, outermost first, so a gone directory is named once, not with all it held."""
        assert self.entries is not None
        out: list[tuple[list[str], str]] = []
        for key in sorted(set(self.entries) - self.met):
            parts = [os.fsdecode(p) for p in from_store(key).split(b"/")]
            out.append((parts, GONE_SINCE_COPY))
        return out


def _kind(mode: int) -> str:
    for kind, bits in _TYPE.items():
        if stat.S_IFMT(mode) == bits:
            return kind
    return "special"
