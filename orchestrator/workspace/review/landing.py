"""Landing a live copy more than once (MCP's apply_changes, ACP's end of every prompt turn).

The copy keeps changing after a landing, so the manifest must move on with it: otherwise the
user's landed file reads as the user's own later change (a false conflict) on the next landing.
"""
from __future__ import annotations

from ...boxfs import from_store, lstat_workspace
from ...errors import OpenAgentsError
from ..copy import CopyManifest, ManifestEntry, Stamp
from .apply import apply_changes
from .report import ApplyReport
from .scan import Change, list_changes


def apply_scanned(manifest: CopyManifest) -> tuple[ApplyReport, dict[str, Change]]:
    """apply_changes, with the copy's changes as scanned just before: what `move_on` needs."""
    scanned = {c.path: c for c in list_changes(manifest)}
    return apply_changes(manifest), scanned


def move_on(manifest: CopyManifest, scanned: dict[str, Change], report: ApplyReport) -> None:
    """After a landing without conflicts, each landed entry's stamps become the real file as it is
    now and the copy as it was scanned before the landing, so the next landing carries only what is
    new: the user's landed file is not taken for their own later change (a false conflict), and a
    change the box made during the landing is seen again. A landed deletion drops its subtree."""
    for rel in [*report.applied, *report.already]:
        change = scanned.get(rel)
        if change is None:
            continue  # made by the box during the landing: judged on its content next time
        if change.after is None:
            below = rel + "/"
            for key in [k for k in manifest.entries if k == rel or k.startswith(below)]:
                del manifest.entries[key]
            continue
        try:
            now = lstat_workspace(manifest.real, from_store(rel))
        except OpenAgentsError:
            now = None
        if now is not None:
            manifest.entries[rel] = ManifestEntry(Stamp.of(now), change.after)
