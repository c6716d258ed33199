"""A copy session's life cycle once its changes are to be landed or thrown away: the checks before
acting on one (it ran in bind mode, it was discarded, it is still running), applying it, discarding
it, and what its record then says. The CLI, the MCP server and the ACP server call these and only
print what came of it: the record's `applied` and `discarded` flags change here alone, so
`oa-sandbox sessions` and `sessions prune` read the same truth whichever front-end landed the work."""

from __future__ import annotations

from ..errors import ErrorType, OpenAgentsError
from .cleanup import discard_state
from .copy import CopyManifest
from .records import SessionRecord, WorkspaceMode, open_own_record, state_bytes
from .review import ApplyReport, apply_scanned, move_on
from .review.landing import Permit


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


def apply_session(record: SessionRecord, permit: Permit) -> ApplyReport:
    """Land the copy's changes through the sanitiser, if `permit` (the ladder's decision) allows it
    (else the typed refusal, nothing written); on a conflict nothing lands and the record is
    unchanged, else the record says it was applied and the manifest is moved on (as MCP's and
    ACP's landings do), so a session resumed after `apply` carries only its new changes next time."""
    manifest = CopyManifest.load(record.manifest_path)
    report, scanned = apply_scanned(manifest, permit)
    if not report.conflicts:
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
