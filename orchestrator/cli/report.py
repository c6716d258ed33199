"""`oa-sandbox report ID`: a session's self-contained HTML page (orchestrator/report)."""
from __future__ import annotations

from pathlib import Path

import click

from ..errors import ErrorType, OpenAgentsError
from .common import setup_error


@click.command()
@click.argument("session_id")
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the page (default: report-ID.html in the current directory); - for stdout.")
def report(session_id: str, output: Path | None) -> None:
    """One self-contained HTML page of a session, for review and audit: summary, every tool call
    with its approval and who decided, the gate's egress audit, checkpoints and the final diff.
    No script, nothing fetched; everything the box wrote is shown as text."""
    from ..report import build, write
    from ..workspace.records import load

    try:
        record = load(session_id)
        if output is not None and str(output) == "-":
            click.echo(build(record), nl=False)
            return
        written = write(record, output or Path(f"report-{record.id}.html"))
    except OpenAgentsError as err:
        raise setup_error(err) from None
    except OSError as err:
        raise setup_error(OpenAgentsError(ErrorType.IO_ERROR, f"could not write the report: {err}")) from None
    click.echo(f"wrote {written}", err=True)
