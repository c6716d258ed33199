"""Removing what sessions leave outside the workspace: one session's state (`discard_state`, copy
mode), whole session directories past an age (`prune`), and the frozen copy-on-write layers no
session stands on any more (`remove_unused_layers`).

Everything under a session directory may hold box-written entries, so it is removed through
boxfs.remove_tree (no link followed); a mounted file system (a copy-on-write overlay, a size-limited
copy) is unmounted first, never emptied one file at a time. Records themselves are records.py's.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from .overlay import is_mounted, layers_root, mounted_lowers, unmount
from .records import SessionRecord, WorkspaceMode, _read_records, list_sessions, sessions_root, state_bytes


def remove_entry(parent: Path, name: str) -> None:
    """parent/name and all under it, through boxfs: box-written entries, no link followed."""
    from ..boxfs import BoxDir, HostBudget

    with BoxDir.open(parent, HostBudget(max_entries=None, max_bytes=None)) as where:
        try:
            where.remove_tree(name)
        except FileNotFoundError:
            pass


def discard_state(record: SessionRecord) -> None:
    """Everything of a copy session's state but its record: the copy, the manifest, the checkpoint
    store, the quarantine, its transcript when it is in the session directory. The record stays,
    marked discarded (so `sessions` still tells what became of it); the copy goes first, as the
    biggest, and a copy outside the directory (never made by this version) is removed too. A
    copy-on-write copy is unmounted first (its upper goes with the rest), and a frozen layer no
    other session stands on goes after."""
    copy = Path(record.box_workspace)
    if record.mode == WorkspaceMode.COPY and copy.parent == record.dir and (record.cow is not None or is_mounted(copy)):
        unmount(copy)  # a fork's overlay, or a bind (the record may be an older object of it: the mount says)
    _unmount_quota_fs(record)
    if record.mode == WorkspaceMode.COPY and copy.parent == record.dir:
        remove_entry(record.dir, copy.name)
    for name in sorted(os.listdir(record.dir)):
        if name != "session.json":
            remove_entry(record.dir, name)
    if record.transcript and Path(record.transcript).parent == record.dir:
        record.transcript = None
    record.discarded = True
    record.save()
    if record.cow is not None:  # (save() took it from the file if this object was older than a freeze)
        remove_unused_layers()


def _unmount_quota_fs(record: SessionRecord) -> None:
    """The session's size-limited file systems unmounted (their loop devices go with them) before
    its directory is removed: a walk must never remove a mounted file system's files one by one."""
    for name in ("quota", "cow"):
        if is_mounted(record.dir / name):
            unmount(record.dir / name)


LAYER_GRACE_S = 30.0  # a layer younger than this is kept: a fork may be making it, its record not yet saved


def remove_unused_layers(now: float | None = None) -> list[str]:
    """Remove the frozen layers (overlay.layers_root) no session of the caller's that is not
    discarded stands on; returns their names. Box-written: through boxfs.remove_tree."""
    records, unreadable = _read_records(sessions_root())
    if unreadable:  # a record we cannot read may stand on any layer: keep them all until it is read or removed
        return []
    used = {
        layer
        for r in records
        if r.owner == os.getuid() and r.cow is not None and not r.discarded
        for layer in r.cow.lowers
    }
    used |= mounted_lowers()  # and any a mounted fork overlay stands on, whatever a record says
    root = layers_root()
    now = time.time() if now is None else now
    removed = []
    for name in sorted(os.listdir(root)):
        try:
            young = now - os.lstat(root / name).st_mtime < LAYER_GRACE_S
        except OSError:
            continue
        if young or str(root / name / "tree") in used:
            continue
        remove_entry(root, name)
        removed.append(name)
    return removed


def prune(
    older_than_s: float,
    all_: bool = False,
    now: float | None = None,
    all_users: bool = False,
    unlanded_older_than_s: float | None = None,
) -> tuple[list[tuple[SessionRecord, int]], list[tuple[SessionRecord, str]]]:
    """Remove whole session directories older than `older_than_s`: (removed with the bytes each
    held, kept with why). Kept: running sessions, other users' (unless `all_users`), and copy
    sessions neither applied nor discarded (their copy holds work not landed anywhere) until they
    are older than `unlanded_older_than_s` too (None: whatever their age; `all_`: not kept)."""
    now = time.time() if now is None else now
    removed: list[tuple[SessionRecord, int]] = []
    kept: list[tuple[SessionRecord, str]] = []
    for record in list_sessions(all_users=all_users):
        age = now - record.created
        if age < older_than_s:
            continue
        unlanded = (
            record.mode == WorkspaceMode.COPY
            and not record.applied
            and not record.discarded
            and record.status != "failed"
        )
        if record.running():
            kept.append((record, "still running"))
            continue
        if unlanded and not all_ and (unlanded_older_than_s is None or age < unlanded_older_than_s):
            kept.append((record, "a copy session not yet applied or discarded: its copy is all there is of its work"))
            continue
        size = state_bytes(record)
        copy = Path(record.box_workspace)
        if (
            record.mode == WorkspaceMode.COPY
            and copy.parent == record.dir
            and (record.cow is not None or is_mounted(copy))
        ):
            unmount(copy)
        _unmount_quota_fs(record)
        remove_entry(record.dir.parent, record.id)
        removed.append((record, size))
    remove_unused_layers()
    return removed, kept


_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw]?)\s*$")


def parse_duration(text: str) -> float:
    """'30d', '12h', '90m', '45s', '2w' (a bare number is days) -> seconds; ValueError otherwise."""
    match = _DURATION.match(text.lower())
    if not match:
        raise ValueError(f"{text!r} is not a duration such as 30d, 12h, 90m")
    number, unit = float(match.group(1)), match.group(2) or "d"
    return number * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}[unit]
