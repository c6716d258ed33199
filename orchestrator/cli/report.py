"""`oa-sandbox report ID`: a session's self-contained HTML page (orchestrator/report)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

import click

from ..errors import OpenAgentsError
from .common import setup_error

if TYPE_CHECKING:
    from ..workspace.records import SessionRecord


@click.command()
@click.argument("session_id")
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the page (default: report-ID.html in the current directory); - for stdout.",
)
def report(session_id: str, output: Path | None) -> None:
    """One self-contained HTML page of a session, for review and audit: summary, every tool call
    with its approval and who decided, the gate's egress audit, checkpoints and the final diff.
    No script, nothing fetched; everything the box wrote is shown as text."""
    from ..api.sessions import report as report_of

    try:  # the caller's own session: another user's is refused, naming its owner
        if output is not None and str(output) == "-":
            click.echo(report_of(session_id), nl=False)
            return
        written = output or Path(f"report-{session_id}.html")
        report_of(session_id, written)
    except OpenAgentsError as err:
        raise setup_error(err) from None
    click.echo(f"wrote {written}", err=True)


_META = "oa_report_file"


def _remember(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    if value is not None:
        ctx.meta[_META] = value


report_option = click.option(
    "--report",
    "report_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    expose_value=False,
    callback=_remember,
    help="At the end, write the session's HTML report here (as `oa-sandbox report ID -o FILE`).",
)


def write_requested_report(record: SessionRecord, say: Callable[[str], None]) -> None:
    """The report `--report FILE` asked for, written before any apply (so its diff is the session's);
    a report that cannot be written is said, and the session's exit code stays what it was."""
    out = click.get_current_context().meta.get(_META)
    if out is None:
        return
    from ..ground.text import visible
    from ..report import write

    try:
        write(record, out)
    except (OpenAgentsError, OSError) as err:
        say(visible(f"   the report could not be written to {out}: {getattr(err, 'message', None) or err}"))
        return
    say(visible(f"   report: {out}"))
