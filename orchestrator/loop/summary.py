"""The end of a run: what happened, in a few lines for a person and one JSON object for a script,
and the exit code that says it without reading either.

Exit codes: 0 finished with no refused call; 3 finished but at least one call was refused;
1 stopped (max turns, a loop, a budget, the model API, a fatal tool error); 2 a set-up error;
130 cancelled (Ctrl-C).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

# The codes live in ground/exit_codes.py (the command line reads them without importing the loop); named here too.
from ..ground.exit_codes import EXIT_CANCELLED as EXIT_CANCELLED
from ..ground.exit_codes import EXIT_CODES_HELP as EXIT_CODES_HELP
from ..ground.exit_codes import EXIT_OK as EXIT_OK
from ..ground.exit_codes import EXIT_REFUSED as EXIT_REFUSED
from ..ground.exit_codes import EXIT_SETUP as EXIT_SETUP
from ..ground.exit_codes import EXIT_STOPPED as EXIT_STOPPED
from ..ground.text import visible
from ..workspace.records import SessionRecord
from . import SessionResult, SessionStatus

if TYPE_CHECKING:
    from ..workspace.review import ApplyReport


class FileChange(BaseModel):
    path: str
    added: int = 0
    removed: int = 0


def exit_code(result: SessionResult) -> int:
    if result.status == SessionStatus.CANCELLED:
        return EXIT_CANCELLED
    if result.status == SessionStatus.STOPPED:
        return EXIT_STOPPED
    return EXIT_REFUSED if result.refused else EXIT_OK


class ChangedFiles(list[FileChange]):
    """The files a session changed; `unknown` says why the list may be incomplete (the session's
    last checkpoint failed or was skipped), so it never reads as "no files changed"."""

    unknown: str | None = None


def changed_files(record: SessionRecord) -> ChangedFiles:
    """Every file that differs between the first and the last good checkpoint, with lines added
    and removed (the checkpoint store is ours, outside the workspace: nothing of the box's is
    read). Paths are in boxfs.to_store form (lossless)."""
    import pygit2
    from pygit2.enums import RepositoryOpenFlag

    from ..workspace.checkpoints import CheckpointStore, unknown_changes

    def fallback(unknown: str | None) -> ChangedFiles:
        out = ChangedFiles(FileChange(path=p) for p in record.files_changed)
        out.unknown = unknown
        return out

    store = Path(record.checkpoint_store)
    if not (store / "HEAD").exists():
        return fallback(None)
    try:
        listed = CheckpointStore(store, Path(record.box_workspace)).list()
    except Exception as err:  # noqa: BLE001 - a summary without counts beats none
        return fallback(f"the checkpoints cannot be read: {str(err)[:200]}")
    unknown = unknown_changes(listed)
    points = [p for p in listed if p.ok]
    out = ChangedFiles()
    out.unknown = unknown
    if len(points) < 2:
        return out
    try:
        repo = pygit2.Repository(str(store), RepositoryOpenFlag.NO_SEARCH | RepositoryOpenFlag.BARE)
        diff = repo.diff(pygit2.Oid(hex=points[0].commit), pygit2.Oid(hex=points[-1].commit))  # the two commits' trees
        for patch in diff:
            assert patch is not None  # None only for an unmodified delta, which a diff of two trees never lists
            delta = patch.delta
            path = delta.new_file.path if delta.status != pygit2.enums.DeltaStatus.DELETED else delta.old_file.path
            _, added, removed = patch.line_stats
            out.append(FileChange(path=path, added=added, removed=removed))
        out.sort(key=lambda c: c.path)
        return out
    except Exception:  # noqa: BLE001 - a summary without counts beats none
        return fallback(unknown)


MAX_FINAL_TEXT = 256 << 10  # bytes of the model's final text in the JSON object (the transcript has all of it)
# The keys beside each list of names (terminal/machine.py); null when no apply was tried.
APPLY_KEYS = (
    "applied",
    "applied_shown",
    "applied_total",
    "applied_file",
    "left_out",
    "left_out_total",
    "left_out_file",
    "conflicts",
    "conflicts_total",
    "conflicts_file",
)


def summary_json(
    result: SessionResult,
    record: SessionRecord,
    changes: list[FileChange],
    code: int,
    applied: ApplyReport | None = None,
) -> dict[str, Any]:
    """`run --output json`. `applied`, `left_out` and `conflicts` are null unless `--apply` applied (or
    tried to apply) a copy; after a conflict (nothing applied) `status` is `stopped`, `reason` and
    the typed `error` (stale_content) say so, and `session_status` keeps how the session itself ended.
    Names are exact (boxfs.exact) with `_shown` forms beside them; each list is bounded
    (terminal/machine.py: at most MAX_LISTED inline, `_total`, `_file`), the object at MAX_LINE_BYTES."""
    from ..boxfs import show
    from ..boxfs.names import stored_shown
    from ..terminal.machine import Bounded, name_item, named

    out: dict[str, Any] = {
        "session_id": record.id,
        "status": result.status.value,
        "reason": result.reason,
        "exit_code": code,
        "turns": result.turns,
        "final_text": result.final_text,
        "calls": result.calls,
        "refused_calls": [c.model_dump(mode="json") for c in result.refused_calls],
        "failed_calls": [c.model_dump(mode="json") for c in result.failed_calls],
        "changed_files": [],
        "changed_files_total": 0,
        "changed_files_file": None,
        "changed_files_unknown": getattr(
            changes, "unknown", None
        ),  # why the list may be incomplete (a failed checkpoint)
        "tokens": dict(result.tokens),
        "wall_s": result.wall_s,
        "error": result.error.model_dump(mode="json") if result.error else None,
        "workspace_mode": record.mode.value,
        "transcript": record.transcript,
        "session_status": result.status.value,
        **dict.fromkeys(APPLY_KEYS),
        "egress": result.egress,  # the audit: one record per request (no credential value, no query)
        "egress_omitted": result.egress_omitted,
    }
    bounded = Bounded(out, Path(record.dir) / "lists", "run")
    bounded.text("final_text", MAX_FINAL_TEXT, f" [cut at {MAX_FINAL_TEXT >> 10} KiB: the transcript has all of it]")
    bounded.put("changed_files", changes, lambda c: named(c.path, added=c.added, removed=c.removed))
    if applied is not None:
        bounded.put("applied", applied.applied, name_item, stored_shown)
        bounded.put("left_out", applied.left_out, lambda lo: named(lo.path, reason=show(lo.reason)))
        bounded.put("conflicts", applied.conflicts, lambda c: named(c.path, reason=show(c.reason)))
        if applied.conflicts:
            message = (
                f"apply conflict: nothing applied: {len(applied.conflicts)} file(s) changed in {record.workspace} "
                "since the copy was taken"
            )
            out["status"], out["reason"] = "stopped", message
            if out["error"] is None:
                out["error"] = {"type": "stale_content", "message": message, "recoverable": False}
    return bounded.value()


def summary_lines(result: SessionResult, changes: list[FileChange]) -> list[str]:
    """A few lines for a person; every string the model or the box wrote made visible."""
    counts = ", ".join(f"{n} {what}" for what, n in result.calls.items() if n) or "no tool calls"
    lines = [
        f"── {result.status.value}: {visible(result.reason)}",
        f"   {result.turns} turn{'s' if result.turns != 1 else ''}; calls: {counts}",
    ]
    for call in result.refused_calls:
        lines.append(visible(f"   refused  {call.action or call.tool} [{call.executor.value}]: {call.reason}"))
    for call in result.failed_calls:
        lines.append(visible(f"   failed   {call.action or call.tool}: {call.reason}"))
    unknown = getattr(changes, "unknown", None)
    if unknown:
        lines.append(visible(f"   changed files unknown: {unknown}"))
    if changes:
        from ..boxfs.names import stored_shown

        width = max(len(stored_shown(c.path)) for c in changes[:50])
        lines.append(f"   {len(changes)} file{'s' if len(changes) != 1 else ''} changed:")
        for change in changes[:50]:  # a name on one line: a newline in it never reaches the left margin
            lines.append(f"     {stored_shown(change.path):<{width}}  +{change.added} -{change.removed}")
        if len(changes) > 50:
            lines.append(f"     and {len(changes) - 50} more")
    elif not unknown:
        lines.append("   no files changed")
    lines.append(
        f"   tokens: {result.tokens.get('input', 0)} in, "
        f"{result.tokens.get('output', 0)} out; wall time {result.wall_s:.1f} s"
    )
    return lines
