"""`oa-sandbox fork ID -n N`: an ended copy session forked into N independent copy sessions
(workspace/fork.py); each new id on its own line on stdout (`--output json`: one JSON object)."""

from __future__ import annotations

import click

from ..errors import OpenAgentsError
from ..ground.text import json_line
from ..workspace.fork_limits import MAX_FORKS
from .common import setup_error


@click.command("fork")
@click.argument("session_id")
@click.option(
    "-n",
    "count",
    type=click.IntRange(1, MAX_FORKS),
    default=1,
    show_default=True,
    help=f"How many forks (at most {MAX_FORKS}).",
)
@click.option(
    "--turn",
    type=click.IntRange(0, None),
    default=None,
    help="Fork the state after this checkpoint turn (0: the start) "
    "instead of the latest; its conversation starts afresh.",
)
@click.option("--output", "output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def fork(session_id: str, count: int, turn: int | None, output: str) -> None:
    """Fork an ended copy session into N copy sessions, each with its own copy, record and (when run)
    box: `run --resume FORK`, `changes`, `apply`, `discard` work on each; `sessions` names its parent."""
    from ..api.sessions import fork as fork_by_id

    try:
        forks = fork_by_id(session_id, count, turn)
    except OpenAgentsError as err:
        if output == "json":
            click.echo(
                json_line(
                    {"ok": False, "parent": session_id, "error": {"type": err.type.value, "message": err.message}}
                )
            )
        raise setup_error(err) from None
    if output == "json":
        click.echo(json_line({"ok": True, "parent": session_id, "turn": turn, "forks": forks}))
        return
    for fork_id in forks:
        click.echo(fork_id)
    click.echo(
        f"forked session {session_id}{f' at turn {turn}' if turn is not None else ''} into {len(forks)}: "
        "`oa-sandbox run --resume ID TASK` goes on in one, `changes`/`apply`/`discard ID` as for any copy session",
        err=True,
    )
