"""A copy session's life cycle once its changes are to be landed or thrown away: the checks before
acting on one (it ran in bind mode, it was discarded, it is still running), landing it (`land_copy`,
the one route every landing takes), discarding it, and what its record then says. The front-ends
reach these through the public API (api/sessions.py, Sandbox.apply) and only print what came of it:
the record's `applied` and `discarded` flags change here alone, so `oa-sandbox sessions` and
`sessions prune` read the same truth whichever front-end landed the work."""

from __future__ import annotations

from typing import Callable

from ..errors import ErrorType, OpenAgentsError
from .cleanup import discard_state
from .copy import CopyManifest
from .records import SessionRecord, WorkspaceMode, open_own_record, state_bytes
from .review import ApplyReport, Change, apply_scanned, move_on
from .review.landing import LandingGate

# What a front-end does with the landed files before the manifest moves on (ACP: the editor's writes).
WriteThrough = Callable[[CopyManifest, dict[str, Change], ApplyReport], None]


def ended_copy_session(session_id: str, action: str, mount: bool = True) -> SessionRecord:
    """The record of an ended copy session whose copy still exists; a typed refusal naming why not.
    `mount`: a copy-on-write copy is mounted again if need be (records.open_own_record); discarding
    one needs no view of it."""
    record = open_own_record(session_id, mount=mount)
    if record.mode != WorkspaceMode.COPY:
        raise OpenAgentsError(
            ErrorType.INVALID_ARGUMENTS,
            f"session {record.id} ran in bind mode: its changes are already in "
            f"{record.workspace}; nothing to {action} (`oa-sandbox rollback` undoes them)",
        )
    if record.discarded:
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"session {record.id} was discarded: its copy is gone")
    if record.running():
        raise OpenAgentsError(
            ErrorType.INVALID_ARGUMENTS, f"session {record.id} is still running (pid {record.host_pid})"
        )
    return record


def land_copy(
    record: SessionRecord, gate: LandingGate, requested: str | None = None, write_through: WriteThrough | None = None
) -> ApplyReport:
    """The one landing of a copy's changes, live or ended, whichever front-end asks: `gate` decides
    it (ApprovalGate.decide_landing, the session's policy; `requested`: the user's own request that
    answers a rule that asks), and a refusal is its typed error with nothing written. Then the
    sanitiser lands it through boxfs (review.apply_changes); a conflict lands nothing and the record
    says the work has not landed; else `write_through` (ACP's editor) sees what landed, the manifest
    moves on (a session resumed or landed again carries only its new changes) and the record says
    it was applied."""
    manifest = CopyManifest.load(record.manifest_path)
    report, scanned = apply_scanned(manifest, gate.decide_landing(requested))
    if report.conflicts:
        mark_landed(record, False)
        return report
    if write_through is not None:
        write_through(manifest, scanned, report)
    move_on(manifest, scanned, report)
    manifest.save(record.manifest_path)
    mark_landed(record)
    return report


def mark_landed(record: SessionRecord, landed: bool = True) -> None:
    """Whether everything the copy holds has reached the workspace: true after a landing without
    conflict (MCP's apply_changes, ACP's end of a prompt turn, `oa-sandbox apply`), false again once
    a call may have changed the copy or a landing met a conflict. `sessions prune` keeps a copy
    session whose work has not landed; saved at once, so a host killed later leaves it right."""
    if record.applied != landed:
        record.applied = landed
        record.save()


def note_call(record: SessionRecord, tool_name: str, ok: bool) -> bool:
    """After each call of a copy session, whichever front-end ran it: whether the call may have changed
    the copy (a mutating tool that succeeded, or a command whatever its outcome: a failed write or edit
    changed nothing, a failed command may have), and if so the record says its work has not landed.
    At once, mid-turn too: a host killed before the next landing leaves a copy `sessions prune` keeps."""
    from ..tools import catalog  # the tools' declarations (host git's libgit2 among them) only where calls run

    tool = catalog.get(tool_name)
    if tool is None or not tool.mutates or not (ok or tool.kind == "execute"):
        return False
    mark_landed(record, False)
    return True


def discard_session(record: SessionRecord) -> int:
    """Remove the copy, checkpoints, manifest, quarantine and transcript (box-written parts through
    boxfs.remove_tree); the record stays, marked discarded. Returns the bytes freed."""
    before = state_bytes(record)
    discard_state(record)
    return before
