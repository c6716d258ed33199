"""`oa-sandbox run --attempts N --pick 'COMMAND' TASK`: best-of-N from one start, on a terminal.

The best-of-N itself (the start's copy, the forks, each attempt in its own box, the pick command,
the choice, the discards) is orchestrator/api/attempts.py's, shared with `batch`; here is what the
terminal adds: the progress lines, Ctrl-C, `--apply` (the chosen one lands through the sanitiser
after the ladder's landing decision, `oa-sandbox apply`'s own functions), the JSON result and the
exit code. When no attempt passes, none is chosen, all are kept, and the exit code is 1.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import click

from ..errors import OpenAgentsError
from ..ground.exit_codes import EXIT_CANCELLED, EXIT_OK, EXIT_REFUSED, EXIT_STOPPED
from ..ground.text import json_line, visible
from ..workspace.fork_limits import MAX_FORKS as MAX_ATTEMPTS
from ..workspace.fork_limits import PICK_TIMEOUT_S
from .common import ignore_interrupts, setup_error
from .sessions import apply_copy

if TYPE_CHECKING:
    from ..api import SandboxOptions

F = TypeVar("F", bound=Callable[..., Any])


def best_of_options(what: str) -> Callable[[F], F]:
    """--attempts, --pick and --pick-timeout, as `run` and `batch` take them; `what`: whose attempts."""

    def add(command: F) -> F:
        for option in reversed(
            [
                click.option(
                    "--attempts",
                    default=1,
                    type=click.IntRange(1, MAX_ATTEMPTS),
                    show_default=True,
                    help=f"Best-of-N: N attempts of {what} from one copy of the "
                    "workspace, in parallel (one per core), each scored by --pick.",
                ),
                click.option(
                    "--pick",
                    default=None,
                    metavar="COMMAND",
                    help="With --attempts: run in each attempt's own box (exit 0 passes, scored 1 "
                    "or the number on its last line); the best is kept (ties: fewest changed "
                    "lines), the rest discarded.",
                ),
                click.option(
                    "--pick-timeout",
                    default=PICK_TIMEOUT_S,
                    type=click.IntRange(1, None),
                    show_default=True,
                    metavar="SECONDS",
                    help="The pick command's shell timeout (clamped to the shell's "
                    "maximum): past it the command is killed and the attempt fails.",
                ),
            ]
        ):
            command = option(command)
        return command

    return add


def run_attempts(
    options: SandboxOptions,
    workspace: Path,
    task: str,
    attempts: int,
    pick: str,
    apply_at_end: bool,
    output_format: str,
    pick_timeout: int = PICK_TIMEOUT_S,
) -> None:
    """The whole best-of-N; ends with click's Exit (0: one chosen (and applied, with --apply), 1: none
    passed or an apply conflict, 3: the landing was refused). `options`: `run`'s, for every attempt's
    Sandbox (each resumes its fork, non-interactive)."""
    from ..api.attempts import attempt_workers, finish, launch, start_forks

    try:
        forks = start_forks(options, workspace, attempts)
    except OpenAgentsError as err:
        raise setup_error(err) from None
    click.echo(
        f"oa-sandbox: {attempts} attempts from one copy of {workspace} ({attempt_workers(attempts)} at once): "
        + " ".join(f.id for f in forks),
        err=True,
    )
    out = launch(options, forks, task, pick, pick_timeout)
    try:
        finish(out)
    except KeyboardInterrupt:  # Ctrl-C: every attempt is cancelled, its box removed; all are kept
        ignore_interrupts()
        click.echo(
            "oa-sandbox: cancelling the attempts (their boxes are removed; Ctrl-C is ignored until then)", err=True
        )
        out.live.cancel()
        finish(out)
        for attempt in out.attempts:
            click.echo(f"  attempt {attempt.number}  {attempt.session_id}  {attempt.status}", err=True)
        raise click.exceptions.Exit(EXIT_CANCELLED) from None
    chosen, results = out.chosen, out.attempts
    for attempt in results:
        shown = "failed" if attempt.score is None else f"{attempt.score:g}"
        click.echo(
            visible(
                f"  attempt {attempt.number}  {attempt.session_id}  {attempt.status:<9} score {shown:<8} "
                f"{attempt.changed_lines} changed line(s)"
                + ("  <- chosen" if attempt is chosen else "")
                + (f"  ({attempt.error['type']}: {attempt.error['message']})" if attempt.error else "")
            ),
            err=True,
        )
    code = EXIT_OK
    landing: dict[str, object] | None = None
    if chosen is None:
        click.echo(
            "oa-sandbox: no attempt passed the pick command: none chosen, all kept (`oa-sandbox sessions`)", err=True
        )
        code = EXIT_STOPPED
    elif apply_at_end:
        record = out.record_of(chosen)
        try:
            applied, report = apply_copy(record, "run --attempts --apply")
            landing = {
                "applied": len(report.applied),
                "left_out": len(report.left_out),
                "conflicts": len(report.conflicts),
            }
            code = EXIT_OK if applied == EXIT_OK else EXIT_STOPPED
        except OpenAgentsError as err:
            landing = {"error": err.to_dict()}
            code = EXIT_REFUSED
    else:
        click.echo(
            f"   chosen: {chosen.session_id}: `oa-sandbox changes {chosen.session_id}`, "
            f"`oa-sandbox apply {chosen.session_id}`",
            err=True,
        )
    if output_format in ("json", "stream-json"):
        click.get_current_context().meta["oa-sandbox.json-printed"] = True
        click.echo(
            json_line(
                {
                    "session_id": chosen.session_id if chosen else None,
                    "status": "finished" if chosen else "stopped",
                    "exit_code": code,
                    "pick": pick,
                    "chosen": chosen.session_id if chosen else None,
                    "attempts": [asdict(a) for a in results],
                    "landing": landing,
                }
            )
        )
    raise click.exceptions.Exit(code)
