"""The final diff per file and the checkpoints, read through the readers `changes` and
`checkpoints` use: a copy session's diff is review.render_diff over review.list_changes (bounded,
every line made visible), what the sanitiser would leave out is review.planned_changes' report
(nothing written); the checkpoints are the store's index (CheckpointStore.list), opened only when
the store exists (a report never creates state). A bind session's changes are already in the
workspace: its diff is each edit's own diff from the transcript, and its checkpoints say what else
changed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import OpenAgentsError
from ..workspace.records import SessionRecord, WorkspaceMode
from .collect import CheckpointRow, Gathered
from .limits import Budget, Limits, text

_HEADER = "diff --git a/"


@dataclass
class FileDiff:
    path: str
    lines: list[tuple[str, str]] = field(default_factory=list)  # (css class, line)
    added: int = 0
    removed: int = 0


@dataclass
class Changes:
    source: str = ""  # where the diff comes from, said on the page
    files: list[FileDiff] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (path, why), the sanitiser's
    conflicts: list[tuple[str, str]] = field(default_factory=list)
    problem: str = ""  # why there is no diff, or why it is partial
    lines_left_out: int = 0
    rows_left_out: int = 0  # of the sanitiser's lists


def _kind(line: str) -> str:
    if line.startswith(("+++", "---", "diff --git", "new file", "deleted file", "old mode", "new mode")):
        return "h"
    if line.startswith("@@"):
        return "at"
    if line.startswith("+"):
        return "add"
    if line.startswith("-"):
        return "del"
    if line.startswith("#"):
        return "note"
    return "ctx"


def _split(lines: list[str], limits: Limits) -> tuple[list[FileDiff], int]:
    """render_diff's lines into one FileDiff per `diff --git` header: a content line always starts
    with one of + - space @ \\ #, and shown() names hold no newline, so only a header starts so."""
    files: list[FileDiff] = []
    shown = left = 0
    budget = Budget(limits.diff_bytes, floor=80)
    for raw in lines:
        if raw.startswith(_HEADER) or not files:
            rest = raw[len(_HEADER) :]
            path = rest[: (len(rest) - 3) // 2] if raw.startswith(_HEADER) else ""  # the header is a/{p} b/{p}
            files.append(FileDiff(text(path, 1000)))
        if shown >= limits.max_diff_lines:
            left += 1
            continue
        kind = _kind(raw)
        current = files[-1]
        current.added += kind == "add"
        current.removed += kind == "del"
        current.lines.append((kind, budget.take(raw, 2000)))
        shown += 1
    return files, left


def copy_changes(record: SessionRecord, limits: Limits) -> Changes:
    from ..workspace.copy import CopyManifest
    from ..workspace.review import list_changes, planned_changes, render_diff, shown

    out = Changes(source=f"the copy against the real workspace, as `oa-sandbox changes {record.id}` shows it")
    if record.discarded:
        out.problem = "the session was discarded: its copy is gone"
        return out
    if record.applied:
        out.source += " (the session was applied: what is left is what changed since)"
    try:
        manifest = CopyManifest.load(record.manifest_path)
        changes = list_changes(manifest)
        files, out.lines_left_out = _split(list(render_diff(manifest, changes)), limits)
        out.files = files
        _, plan = planned_changes(manifest)
    except (OpenAgentsError, OSError, ValueError) as err:
        out.problem = text(f"the diff could not be read: {getattr(err, 'message', None) or err}", 2000)
        return out
    room = Budget(limits.checkpoint_bytes, floor=60)
    out.left_out = [
        (room.take(shown(item.path), 1000), room.take(item.reason, 2000))
        for item in plan.left_out[: limits.max_left_out]
    ]
    out.conflicts = [
        (room.take(shown(item.path), 1000), room.take(item.reason, 2000))
        for item in plan.conflicts[: limits.max_left_out]
    ]
    out.rows_left_out = max(0, len(plan.left_out) - limits.max_left_out) + max(
        0, len(plan.conflicts) - limits.max_left_out
    )
    return out


def bind_changes(gathered: Gathered, limits: Limits) -> Changes:
    out = Changes(
        source="bind mode: the changes are already in the workspace; below, each edit's own diff from the transcript "
        "(what commands changed is in the checkpoints)"
    )
    lines: list[str] = []
    for entry in gathered.entries:
        call = entry.call
        if call is None or not call.diff:
            continue
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            arguments = None
        path = text(arguments.get("path", ""), 1000) if isinstance(arguments, dict) else "?"
        lines += [f"{_HEADER}{path} b/{path}", f"# turn {entry.turn}, {call.tool}"]
        lines += call.diff.split("\n")
    out.files, out.lines_left_out = _split(lines, limits)
    return out


def final_changes(record: SessionRecord, gathered: Gathered, limits: Limits) -> Changes:
    if record.mode == WorkspaceMode.COPY:
        return copy_changes(record, limits)
    return bind_changes(gathered, limits)


def store_checkpoints(
    record: SessionRecord, gathered: Gathered, limits: Limits
) -> tuple[list[CheckpointRow], int, str]:
    """The store's checkpoints, how many more there are, and where they came from; the
    transcript's when the store is gone."""
    from ..workspace.checkpoints import CheckpointStore, shown_path

    store = Path(record.checkpoint_store)
    if not (store / "HEAD").exists() or not os.path.isdir(record.box_workspace):
        return (
            gathered.checkpoints,
            gathered.checkpoints_left_out,
            "the transcript's checkpoint records (the store is gone)",
        )
    try:
        points = CheckpointStore(store, Path(record.box_workspace)).list()
    except (OpenAgentsError, OSError, ValueError) as err:
        why = text(f"the transcript's checkpoint records (the store could not be read: {err})", 500)
        return gathered.checkpoints, gathered.checkpoints_left_out, why
    rows, room = [], Budget(limits.checkpoint_bytes, floor=60)
    for point in points[: limits.max_checkpoints]:
        names = [room.take(shown_path(p, point), 500) for p in point.files_changed[: limits.max_checkpoint_files]]
        rows.append(
            CheckpointRow(
                point.turn,
                text(point.state, 30),
                names,
                max(0, point.files_changed_count - len(names)),
                [room.take(f"{shown_path(s.path, point)} ({s.reason})", 500) for s in point.skipped[:20]],
                room.take(f"{point.error_type or ''} {point.error}".strip(), limits.max_text),
            )
        )
    return (
        rows,
        max(0, len(points) - limits.max_checkpoints),
        f"the checkpoint store (`oa-sandbox checkpoints {record.id}`)",
    )
