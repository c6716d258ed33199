"""The commands on sessions that have ended: list and prune them, see, apply or discard a copy
session's changes, list checkpoints and roll back.

These are the user's own commands on host-kept state (the box is gone, no agent or client asks), so
they are not pipeline calls: `apply` meets the ladder's landing decision (the command is the
request, a deny still refuses it) and its outcome goes to the session record; none appends to the
ended session's transcript, which ends at its session_end (README, "Every path through the one
pipeline")."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import ErrorType, OpenAgentsError
from ..ground.text import json_line
from ..loop.summary import EXIT_OK, EXIT_REFUSED, EXIT_SETUP
from .common import EXIT_TOOL_ERROR, SetupExit, setup_error

if TYPE_CHECKING:
    from ..policy.approvals import ApprovalOutcome
    from ..workspace.records import SessionRecord
    from ..workspace.review import ApplyReport

def _session(session_id: str) -> SessionRecord:
    """The caller's own record (records.open_own_record): another user's is refused, naming its owner."""
    from ..workspace.records import open_own_record

    try:
        return open_own_record(session_id)
    except OpenAgentsError as err:
        raise setup_error(err) from None


def _copy_session(session_id: str, action: str, mount: bool = True) -> SessionRecord:
    from ..workspace.copy_session import ended_copy_session

    try:
        return ended_copy_session(session_id, action, mount)
    except OpenAgentsError as err:
        raise setup_error(err) from None


def landing_permit(record: SessionRecord, requested: str) -> ApprovalOutcome:
    """The ladder's decision on landing an ended session's copy (`oa-sandbox apply`): the policies
    in force for its workspace and the session's own policy files, as a session would load them."""
    from ..policy.approvals import ApprovalGate, NonInteractiveApprover
    from ..policy.ladder import Ladder
    from ..session import load_policies

    rules, _ = load_policies(Path(record.workspace), list(record.policy_files), record)  # its user files as pinned at its start
    return ApprovalGate(Ladder(rules), NonInteractiveApprover()).decide_landing(requested)


def apply_copy(record: SessionRecord, permit: ApprovalOutcome) -> tuple[int, ApplyReport]:
    """Apply a copy session's changes if `permit` (the ladder's decision) allows it, else the typed
    refusal is raised; saying what was left out and any conflict on stderr; 0 when applied, 1 on
    conflicts (then nothing was applied)."""
    from ..boxfs import show
    from ..workspace.copy_session import apply_session
    from ..workspace.review import shown

    report = apply_session(record, permit)
    for item in report.left_out:
        click.echo(f"  left out {shown(item.path)}: {show(item.reason)}", err=True)
    if report.conflicts:
        for conflict in report.conflicts:
            click.echo(f"  conflict {shown(conflict.path)}: {show(conflict.reason)}", err=True)
        click.echo(f"nothing applied: {len(report.conflicts)} file(s) changed in {record.workspace} since the copy was taken", err=True)
        return EXIT_TOOL_ERROR, report
    click.echo(f"applied {len(report.applied)} change(s) to {record.workspace}" + (f", left out {len(report.left_out)}" if report.left_out else ""), err=True)
    return EXIT_OK, report


@click.group("sessions", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON array of the session records on stdout.")
@click.option("--all-users", is_flag=True, help="Also the sessions other users ran with this state directory.")
@click.pass_context
def sessions_(ctx: click.Context, as_json: bool, all_users: bool) -> None:
    """List your sessions, newest first, under a header: id, time, mode, status, files changed,
    workspace. `sessions prune` removes old ones. Yours are the records you own on disk (whatever a
    record says); --all-users lists the others too, only to list them."""
    if ctx.invoked_subcommand is not None:
        return
    from ..ground.text import one_line
    from ..workspace.records import HEADER, list_sessions, shown_status, summary_line

    try:
        records = list_sessions(all_users=all_users)
    except OpenAgentsError as err:
        raise setup_error(err) from None
    if as_json:
        click.echo(json_line([{**r.model_dump(mode="json"), "shown_status": shown_status(r), "dir": str(r.dir), "owner_uid": r.owner}
                              for r in records]))
        return
    click.echo(HEADER)
    for record in records:
        click.echo(one_line(summary_line(record)))  # a record another user wrote: its text stays on its line


@sessions_.command("prune")
@click.option("--older-than", "older_than", default="7d", show_default=True, metavar="DURATION",
              help="Remove sessions started longer ago than this: 30d, 12h, 90m, 45s, 2w (0: all).")
@click.option("--all", "all_", is_flag=True, help="Also copy sessions not yet applied or discarded (their copy is all there is of their work).")
@click.option("--all-users", is_flag=True, help="Also the sessions of other users of this state directory.")
def sessions_prune(older_than: str, all_: bool, all_users: bool) -> None:
    """Remove old sessions' whole state (copy, checkpoints, transcript, record). Kept: running
    sessions, and copy sessions not yet applied or discarded, unless --all."""
    from ..workspace.records import parse_duration, prune

    try:
        seconds = parse_duration(older_than)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--older-than") from None
    try:
        removed, kept = prune(seconds, all_, all_users=all_users)
    except OpenAgentsError as err:
        raise setup_error(err) from None
    except OSError as err:
        raise setup_error(OpenAgentsError(ErrorType.IO_ERROR, f"could not prune: {err}")) from None
    freed = sum(size for _, size in removed)
    click.echo(f"removed {len(removed)} session{'s' if len(removed) != 1 else ''} ({freed / (1 << 20):.1f} MiB)")
    if kept:
        click.echo(f"kept {len(kept)} copy session{'s' if len(kept) != 1 else ''} not yet applied or discarded (or still running): "
                   f"{', '.join(r.id for r in kept[:5])}{' ...' if len(kept) > 5 else ''}; `--all` removes them too")


@click.command()
@click.argument("session_id")
@click.option("--stat", "stat_only", is_flag=True, help="One line per file with counts, as git diff --stat.")
def changes(session_id: str, stat_only: bool) -> None:
    """The unified diff of a copy session's changes against the real workspace."""
    from ..workspace.copy import CopyManifest
    from ..workspace.review import list_changes, render_diff

    record = _copy_session(session_id, "show")
    manifest = CopyManifest.load(record.manifest_path)
    for line in render_diff(manifest, list_changes(manifest), stat=stat_only):
        click.echo(line)


@click.command("apply")
@click.argument("session_id")
def apply_(session_id: str) -> None:
    """Apply a copy session's changes to the real workspace (a sanitiser: regular files and dirs,
    normalised modes, nothing under .git). Any conflict: nothing is applied, exit 1."""
    record = _copy_session(session_id, "apply")
    try:
        code = apply_copy(record, landing_permit(record, f"oa-sandbox apply {record.id}"))[0]
    except OpenAgentsError as err:
        exit_code = EXIT_REFUSED if err.type in (ErrorType.REFUSED_BY_POLICY, ErrorType.REJECTED_BY_USER) else EXIT_SETUP
        raise SetupExit(setup_error(err).error, exit_code) from None
    raise click.exceptions.Exit(code)


@click.command()
@click.argument("session_id")
def discard(session_id: str) -> None:
    """Throw a copy session away: its copy, checkpoints, manifest, quarantine and transcript. Only
    its record stays, marked discarded, so `oa-sandbox sessions` still says what became of it."""
    from ..workspace.copy_session import discard_session

    record = _copy_session(session_id, "discard", mount=False)  # a fork's overlay that cannot be mounted again is still discarded
    try:
        before = discard_session(record)
    except OSError as err:
        raise setup_error(OpenAgentsError(ErrorType.IO_ERROR, f"could not discard session {record.id}: {err}")) from None
    click.echo(f"discarded session {record.id}: {before / (1 << 20):.1f} MiB removed; its record stays (`oa-sandbox sessions`)", err=True)


@click.command()
@click.argument("session_id")
def checkpoints(session_id: str) -> None:
    """A session's checkpoints: turn, files changed, what was not checkpointed; a checkpoint that
    failed or was skipped says so (what changed then is unknown)."""
    from ..ground.text import one_line
    from ..workspace.checkpoints import CheckpointStore, shown_path

    record = _session(session_id)
    for point in CheckpointStore(record.checkpoint_store, Path(record.box_workspace)).list():
        label = "start" if point.turn == 0 else f"turn {point.turn}"
        if not point.ok:
            click.echo(one_line(f"{label:<9}    ? files  checkpoint {point.state} ({point.error_type}): {point.error}"))
            continue
        names = [shown_path(p, point) for p in point.files_changed[:8]]
        more = point.files_changed_count - len(names)
        files = ", ".join(names) + (f" and {more} more" if more > 0 else "")
        click.echo(one_line(f"{label:<9} {point.files_changed_count:>4} files  {files}"))
        for skipped in point.skipped:
            click.echo(one_line(f"          not checkpointed: {shown_path(skipped.path, point)} ({skipped.reason})"))


@click.command()
@click.argument("session_id")
@click.option("--turn", required=True, type=click.IntRange(0, None), help="Restore the state after this turn; 0 is the start.")
def rollback(session_id: str, turn: int) -> None:
    """Restore a session's workspace (the copy, or the real one in bind mode) to a checkpoint.
    Any file changed since the session's last checkpoint: nothing is restored, exit 1."""
    from ..boxfs import from_store, show
    from ..ground.text import one_line
    from ..workspace.checkpoints import CheckpointStore

    record = _session(session_id)
    if record.running():
        raise setup_error(OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"session {record.id} is still running (pid {record.host_pid})"))
    if record.discarded:
        raise setup_error(OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"session {record.id} was discarded: its copy is gone"))
    store = CheckpointStore(record.checkpoint_store, Path(record.box_workspace))
    points = store.list()
    turns = [p.turn for p in points if p.ok]
    last = record.turns if record.turns is not None else max((p.turn for p in points), default=0)
    if turn > last:
        said = f"ran {last} turn{'s' if last != 1 else ''}" if record.turns is not None else f"has checkpoints up to turn {last}"
        raise setup_error(OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"session {record.id} {said}: there is no turn {turn} to restore "
                                                                        f"(`oa-sandbox checkpoints {record.id}`)"))
    if turn not in turns:
        # A turn that changed nothing (or whose checkpoint failed) has none of its own: the one before it holds.
        earlier = [t for t in turns if t <= turn]
        if not earlier:
            raise setup_error(OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"session {record.id} has no checkpoint at or before turn {turn}"))
        turn = max(earlier)
    try:
        report = store.restore(turn)
    except OpenAgentsError as err:
        raise setup_error(err) from None
    if report.conflicts:
        for conflict in report.conflicts:
            click.echo(one_line(f"  conflict {show(from_store(conflict.path))}: {conflict.reason}"), err=True)
        click.echo(f"nothing restored: {len(report.conflicts)} file(s) changed in {record.box_workspace} since the session's last checkpoint", err=True)
        raise click.exceptions.Exit(EXIT_TOOL_ERROR)
    for skipped in report.skipped:
        click.echo(one_line(f"  not restored: {show(from_store(skipped.path))} ({skipped.reason})"), err=True)
    click.echo(f"restored {record.box_workspace} to {'the start' if turn == 0 else f'turn {turn}'}: "
               f"{len(report.restored)} written, {len(report.removed)} removed", err=True)


