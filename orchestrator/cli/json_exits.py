"""`run --output json` and `--output stream-json`: every exit prints exactly one JSON object (or ends
the stream with it as its session_end line), set-up and usage errors included."""

from __future__ import annotations

from typing import Any, Iterable

import click

from ..errors import ErrorType, OpenAgentsError
from ..ground.exit_codes import EXIT_CANCELLED, EXIT_OK, EXIT_SETUP, EXIT_STOPPED
from ..ground.text import json_line
from .common import SetupExit

JSON_FORMATS = ("json", "stream-json")


def wants_json(args: Iterable[str]) -> str | None:
    """The JSON format a command line asks for with `--output` (read before click has parsed it)."""
    items = list(args)
    for i, arg in enumerate(items):
        if arg == "--":
            break
        for wanted in JSON_FORMATS:
            if arg == f"--output={wanted}" or (arg == "--output" and items[i + 1 : i + 2] == [wanted]):
                return wanted
    return None


def exit_line(output_format: str, code: int, status: str, error: OpenAgentsError | None) -> str:
    from .stream_json import end_line

    summary = exit_json(code, status, error)
    return end_line(summary) if output_format == "stream-json" else json_line(summary)


def exit_json(code: int, status: str, error: OpenAgentsError | None) -> dict[str, Any]:
    """The object `run --output json` prints when it ends before a session result exists: the same
    keys as a session's, empty, with the exit code, a status and the typed error."""
    from ..loop.summary import APPLY_KEYS

    return {
        "session_id": None,
        "status": status,
        "reason": error.message if error else status,
        "exit_code": code,
        "turns": 0,
        "final_text": "",
        "calls": {},
        "refused_calls": [],
        "failed_calls": [],
        "changed_files": [],
        "changed_files_total": 0,
        "changed_files_file": None,
        "changed_files_unknown": None,
        "tokens": {"input": 0, "output": 0},
        "wall_s": 0.0,
        "error": error.to_dict() if error else None,
        "workspace_mode": None,
        "transcript": None,
        "session_status": None,
        **dict.fromkeys(APPLY_KEYS),
    }


JSON_PRINTED = "oa-sandbox.json-printed"


def landing_said(summary: dict[str, Any], refused: OpenAgentsError | None) -> dict[str, Any]:
    """`--apply` refused by the ladder: the typed refusal is the summary's error (nothing was applied)."""
    if refused is not None:
        summary["error"], summary["applied"] = refused.to_dict(), []
    return summary


class JsonExits(click.Command):
    """`run --output json`: every exit prints exactly one JSON object on stdout, set-up errors and
    usage errors included (a CI script's json.load never meets an empty stdout); stderr still gets
    the one line a person reads. `--output stream-json`: every exit ends the stream with that
    object as its session_end line."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        wants = wants_json(args)
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as err:
            if wants:
                click.echo(
                    exit_line(
                        wants,
                        EXIT_SETUP,
                        "setup_error",
                        OpenAgentsError(ErrorType.INVALID_ARGUMENTS, err.format_message()),
                    )
                )
            raise

    def invoke(self, ctx: click.Context) -> Any:
        wants = ctx.params.get("output_format")
        if wants not in JSON_FORMATS:
            return super().invoke(ctx)
        try:
            return super().invoke(ctx)
        except SetupExit as exc:
            click.echo(exit_line(wants, exc.exit_code, "setup_error", exc.error))
            raise
        except click.UsageError as err:  # raised by an option's own check (--env, --egress, sizes)
            click.echo(
                exit_line(
                    wants, EXIT_SETUP, "setup_error", OpenAgentsError(ErrorType.INVALID_ARGUMENTS, err.format_message())
                )
            )
            raise
        except click.exceptions.Exit as exc:
            if not ctx.meta.get(JSON_PRINTED):
                status = (
                    "cancelled"
                    if exc.exit_code == EXIT_CANCELLED
                    else "finished"
                    if exc.exit_code == EXIT_OK
                    else "stopped"
                )
                click.echo(exit_line(wants, exc.exit_code, status, None))
            raise
        except Exception as err:
            click.echo(
                exit_line(
                    wants,
                    EXIT_STOPPED,
                    "failed",
                    OpenAgentsError(ErrorType.INTERNAL_ERROR, f"{type(err).__name__}: {err}"[:500]),
                )
            )
            raise
