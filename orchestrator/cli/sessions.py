"""The commands on sessions that have ended: list and prune them, see, apply or discard a copy
session's changes, list checkpoints and roll back. Each is the public API's function by id
(orchestrator/api/sessions.py), printed: a program does the same from Python.

These are the user's own commands on host-kept state (the box is gone, no agent or client asks), so
they are not pipeline calls: `apply` meets the ladder's landing decision (the command is the
request, a deny still refuses it) and its outcome goes to the session record; none appends to the
ended session's transcript, which ends at its session_end (docs/policy.md, "Every path through the
one pipeline")."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ..errors import ErrorType, OpenAgentsError
from ..ground.exit_codes import EXIT_OK, EXIT_REFUSED, EXIT_SETUP
from ..ground.text import json_line
from .common import EXIT_TOOL_ERROR, SetupExit, setup_error

if TYPE_CHECKING:
    from ..workspace.records import SessionRecord
    from ..workspace.review import ApplyReport
    from ..workspace.review.landing import LandingGate


def _copy_session(session_id: str, action: str, mount: bool = True) -> SessionRecord:
    from ..workspace.copy_session import ended_copy_session

    try:
        return ended_copy_session(session_id, action, mount)
    except OpenAgentsError as err:
        raise setup_error(err) from None


def apply_copy(record: SessionRecord, requested: str, gate: LandingGate | None = None) -> tuple[int, ApplyReport]:
    """Land a copy session's changes by the API's one route (api/sessions.py land: `gate` decides,
    the ended session's own when None; a refusal is raised, typed), saying what was left out and
    any conflict on stderr; 0 when applied, 1 on conflicts (then nothing was applied)."""
    from ..api.sessions import land
    from ..boxfs import show
    from ..workspace.review import shown

    report = land(record, requested, gate)
    for item in report.left_out:
        click.echo(f"  left out {shown(item.path)}: {show(item.reason)}", err=True)
    if report.conflicts:
        for conflict in report.conflicts:
            click.echo(f"  conflict {shown(conflict.path)}: {show(conflict.reason)}", err=True)
        click.echo(
            f"nothing applied: {len(report.conflicts)} file(s) changed in {record.workspace} since the copy was taken",
            err=True,
        )
        return EXIT_TOOL_ERROR, report
    click.echo(
        f"applied {len(report.applied)} change(s) to {record.workspace}"
        + (f", left out {len(report.left_out)}" if report.left_out else ""),
        err=True,
    )
    return EXIT_OK, report


@click.group("sessions", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON array of the session records on stdout.")
@click.option("--all-users", is_flag=True, help="Also the sessions other users ran with this state directory.")
@click.option(
    "--label",
    "labels",
    multiple=True,
    metavar="NAME=VALUE",
    help="Only sessions with this label (the API's labels=; repeatable).",
)
@click.pass_context
def sessions_(ctx: click.Context, as_json: bool, all_users: bool, labels: tuple[str, ...]) -> None:
    """List your sessions, newest first, under a header: id, time, mode, status, files changed,
    workspace. `sessions prune` removes old ones. Yours are the records you own on disk (whatever a
    record says); --all-users lists the others too, only to list them."""
    if ctx.invoked_subcommand is not None:
        return
    from ..api.sessions import list_sessions
    from ..ground.text import one_line
    from ..workspace.records import HEADER, shown_status, summary_line

    wanted = dict(item.partition("=")[::2] for item in labels)
    if any("=" not in item for item in labels):
        raise click.BadParameter("a label is NAME=VALUE", param_hint="--label")
    try:
        records = list_sessions(wanted, all_users=all_users)
    except OpenAgentsError as err:
        raise setup_error(err) from None
    if as_json:
        click.echo(
            json_line(
                [
                    {
                        **r.model_dump(mode="json"),
                        "shown_status": shown_status(r),
                        "dir": str(r.dir),
                        "owner_uid": r.owner,
                    }
                    for r in records
                ]
            )
        )
        return
    click.echo(HEADER)
    for record in records:
        click.echo(one_line(summary_line(record)))  # a record another user wrote: its text stays on its line


@sessions_.command("prune")
@click.option(
    "--older-than",
    "older_than",
    default="7d",
    show_default=True,
    metavar="DURATION",
    help="Remove sessions started longer ago than this: 30d, 12h, 90m, 45s, 2w (0: all).",
)
@click.option(
    "--keep-unapplied",
    "keep_unapplied",
    default="30d",
    show_default=True,
    metavar="DURATION",
    help="Copy sessions not yet applied or discarded (their copy "
    "is all there is of their work) are kept until this old.",
)
@click.option(
    "--all",
    "all_",
    is_flag=True,
    help="Also copy sessions not yet applied or discarded, whatever their age (--keep-unapplied 0).",
)
@click.option("--all-users", is_flag=True, help="Also the sessions of other users of this state directory.")
def sessions_prune(older_than: str, keep_unapplied: str, all_: bool, all_users: bool) -> None:
    """Remove old sessions' whole state (copy, checkpoints, transcript, record). Kept, and said why:
    running sessions, and copy sessions not yet applied or discarded until --keep-unapplied (30
    days) old, unless --all."""
    from ..api.sessions import prune
    from ..workspace.cleanup import parse_duration

    try:
        seconds = parse_duration(older_than)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--older-than") from None
    try:
        unlanded = 0.0 if all_ else parse_duration(keep_unapplied)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--keep-unapplied") from None
    try:
        pruned = prune(seconds, unlanded, all_users=all_users)
    except OpenAgentsError as err:
        raise setup_error(err) from None
    except OSError as err:
        raise setup_error(OpenAgentsError(ErrorType.IO_ERROR, f"could not prune: {err}")) from None
    removed = pruned.removed
    click.echo(f"removed {len(removed)} session{'s' if len(removed) != 1 else ''} ({pruned.freed / (1 << 20):.1f} MiB)")
    reasons: dict[str, list[str]] = {}
    for record, why in pruned.kept:
        reasons.setdefault(why, []).append(record.id)
    for why, ids in reasons.items():
        more = "; `--all` removes them too (or --keep-unapplied DURATION)" if why.startswith("a copy session") else ""
        click.echo(
            f"kept {len(ids)} ({why}{f', younger than {keep_unapplied}' if more else ''}): "
            f"{', '.join(ids[:5])}{' ...' if len(ids) > 5 else ''}{more}"
        )


@click.command()
@click.argument("session_id")
@click.option("--stat", "stat_only", is_flag=True, help="One line per file with counts, as git diff --stat.")
def changes(session_id: str, stat_only: bool) -> None:
    """The unified diff of a copy session's changes against the real workspace."""
    from ..api.sessions import changes as changes_of

    try:
        found = changes_of(session_id)
    except OpenAgentsError as err:
        raise setup_error(err) from None
    text = found.stat if stat_only else found.diff
    if text:
        click.echo(text)


@click.command("apply")
@click.argument("session_id")
def apply_(session_id: str) -> None:
    """Apply a copy session's changes to the real workspace (a sanitiser: regular files and dirs,
    normalised modes, nothing under .git). Any conflict: nothing is applied, exit 1."""
    record = _copy_session(session_id, "apply")
    try:
        code = apply_copy(record, f"oa-sandbox apply {record.id}")[0]
    except OpenAgentsError as err:
        exit_code = (
            EXIT_REFUSED if err.type in (ErrorType.REFUSED_BY_POLICY, ErrorType.REJECTED_BY_USER) else EXIT_SETUP
        )
        raise SetupExit(setup_error(err).error, exit_code) from None
    raise click.exceptions.Exit(code)


@click.command()
@click.argument("session_id")
def discard(session_id: str) -> None:
    """Throw a copy session away: its copy, checkpoints, manifest, quarantine and transcript. Only
    its record stays, marked discarded, so `oa-sandbox sessions` still says what became of it."""
    from ..api.sessions import discard as discard_by_id

    try:
        before = discard_by_id(session_id)
    except OpenAgentsError as err:
        raise setup_error(err) from None
    click.echo(
        f"discarded session {session_id}: {before / (1 << 20):.1f} MiB removed; "
        "its record stays (`oa-sandbox sessions`)",
        err=True,
    )


@click.command()
@click.argument("session_id")
def checkpoints(session_id: str) -> None:
    """A session's checkpoints: turn, files changed, what was not checkpointed; a checkpoint that
    failed or was skipped says so (what changed then is unknown)."""
    from ..api.sessions import checkpoints as checkpoints_of
    from ..ground.text import one_line
    from ..workspace.checkpoints import shown_path

    try:
        points = checkpoints_of(session_id)
    except OpenAgentsError as err:
        raise setup_error(err) from None
    for point in points:
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
@click.option(
    "--turn", required=True, type=click.IntRange(0, None), help="Restore the state after this turn; 0 is the start."
)
def rollback(session_id: str, turn: int) -> None:
    """Restore a session's workspace (the copy, or the real one in bind mode) to a checkpoint.
    Any file changed since the session's last checkpoint: nothing is restored, exit 1."""
    from ..api.sessions import restorable_turn, restore_at, session
    from ..boxfs import from_store, show
    from ..ground.text import one_line

    try:
        record = session(session_id)
        turn = restorable_turn(record, turn)
        report = restore_at(record, turn)
    except OpenAgentsError as err:
        raise setup_error(err) from None
    if report.conflicts:
        for conflict in report.conflicts:
            click.echo(one_line(f"  conflict {show(from_store(conflict.path))}: {conflict.reason}"), err=True)
        click.echo(
            f"nothing restored: {len(report.conflicts)} file(s) changed in "
            f"{record.box_workspace} since the session's last checkpoint",
            err=True,
        )
        raise click.exceptions.Exit(EXIT_TOOL_ERROR)
    for skipped in report.skipped:
        click.echo(one_line(f"  not restored: {show(from_store(skipped.path))} ({skipped.reason})"), err=True)
    click.echo(
        f"restored {record.box_workspace} to {'the start' if turn == 0 else f'turn {turn}'}: "
        f"{len(report.restored)} written, {len(report.removed)} removed",
        err=True,
    )
