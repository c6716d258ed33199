"""`oa-sandbox run` and `oa-sandbox exec`: a session with a model, and one tool call. With `--output
json` every exit prints exactly one JSON object; with `--output stream-json` every exit ends the
stream with one session_end line holding that object."""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import click

from ..config import DEFAULT_MAX_TURNS, SandboxConfig
from ..errors import ErrorType, OpenAgentsError
from ..ground.exit_codes import EXIT_CANCELLED, EXIT_CODES_HELP, EXIT_OK, EXIT_REFUSED, EXIT_STOPPED
from ..ground.text import json_line
from ..models.dialects import MODEL_FORMS
from .attempts import best_of_options
from .common import (
    EXIT_TOOL_ERROR,
    copy_options,
    copy_progress,
    ignore_interrupts,
    interrupt_once,
    load_defaults,
    new_transcript_path,
    sandbox_options,
    setup_error,
    terminate_as_interrupt,
)
from .json_exits import JSON_PRINTED, JsonExits, landing_said
from .report import report_option, write_requested_report
from .sessions import apply_copy

if TYPE_CHECKING:
    from ..terminal.live import LiveView
    from ..tools.mcp.client import McpHost
    from ..workspace.copy import CopyLimits
    from ..workspace.records import SessionRecord, WorkspaceMode


@click.command("exec")
@click.option(
    "--workspace", required=True, type=click.Path(exists=True, file_okay=False), help="Directory mounted at /workspace."
)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Policy file, TOML or YAML (repeatable): its deny refuses the call, as in `run`.",
)
@sandbox_options
@click.argument("tool")
@click.argument("json_args", default="{}")
def exec_(
    workspace: str,
    policies: tuple[str, ...],
    config: SandboxConfig,
    mode: WorkspaceMode,
    copy_limits: CopyLimits,
    tool: str,
    json_args: str,
) -> None:
    """Run one TOOL with JSON_ARGS in a fresh sandbox; print one JSON result (a set-up error too: a
    script's json.load never meets an empty stdout). The call goes through the policy ladder as a
    model's does in `run`: you asked for it, so what would ask runs, but a policy's deny (admin, the
    workspace's .openagents/policy.*, --policy) refuses it (refused_by_policy, exit 3). In copy mode
    the change stays in the session's copy: `oa-sandbox changes ID`, `oa-sandbox apply ID`."""
    from ..api import Sandbox, SandboxOptions
    from ..ground.text import visible
    from ..protocol import ToolResult
    from ..tools.args import validate_arguments
    from ..workspace.records import WorkspaceMode

    terminate_as_interrupt()
    try:
        args = validate_arguments(tool, json_args).model_dump(exclude_none=True)
    except OpenAgentsError as err:
        result = ToolResult.failure(err)
    else:
        from ..sandbox import handoff
        from ..tools.catalog import reads_only

        if reads_only(tool):  # the box cannot write the workspace, and its removal is not waited for
            config = config.model_copy(update={"workspace_read_only": True})
            handoff.enable()
        limits = copy_progress(copy_limits)
        options = SandboxOptions(
            config=config,
            mode=mode.value,
            copy_max_bytes=limits.max_bytes,
            copy_max_entries=limits.max_entries,
            on_copy_progress=limits.progress,
            policy_files=[Path(p) for p in policies],
            auto_approve=True,
        )
        box = Sandbox(Path(workspace).resolve(), options, kind="exec")
        try:
            box.open()
        except OpenAgentsError as err:
            click.echo(ToolResult.failure(err).model_dump_json())
            raise setup_error(err) from None
        gc.freeze()  # what the start made stays; the collector (paused by the group) resumes for the call
        gc.enable()
        with box:
            result = box.call(tool, args)
            swept = box.close(
                status="finished" if result.ok else "stopped", reason=result.error.message if result.error else ""
            )
        for line in swept:
            click.echo(visible(f"oa-sandbox: integrity sweep: {line}"), err=True)
        record = box.record
        if record.mode == WorkspaceMode.COPY:
            click.echo(
                f"oa-sandbox: session {record.id} (copy mode): review with `oa-sandbox changes {record.id}`, "
                f"apply with `oa-sandbox apply {record.id}`",
                err=True,
            )
    click.echo(result.model_dump_json())
    if result.error is not None and result.error.type in _NO_SANDBOX:
        raise setup_error(OpenAgentsError(result.error.type, result.error.message))
    refused = result.error is not None and result.error.type in (
        ErrorType.REFUSED_BY_POLICY,
        ErrorType.REJECTED_BY_USER,
    )
    raise click.exceptions.Exit(EXIT_OK if result.ok else EXIT_REFUSED if refused else EXIT_TOOL_ERROR)


# A call that failed because the sandbox itself did (its daemon went away mid-call, it could not be
# replaced): the same set-up error, exit 2, as when the sandbox fails before the call.
_NO_SANDBOX = frozenset({ErrorType.DOCKER_UNAVAILABLE, ErrorType.SANDBOX_START_FAILED, ErrorType.IMAGE_MISSING})


@click.command(cls=JsonExits, epilog=EXIT_CODES_HELP)
@click.option(
    "--workspace",
    default=".",
    show_default=True,
    type=click.Path(exists=True, file_okay=False),
    help="Directory mounted at /workspace.",
)
@click.option("--model", "model_spec", default=None, help=f"{MODEL_FORMS} (default: `model` in the config file).")
@click.option(
    "--base-url",
    default=None,
    help="API base URL, e.g. http://127.0.0.1:8000/v1 for a local server (no key needed on loopback "
    "or a private address); default OPENAI_BASE_URL for openai: models, ANTHROPIC_BASE_URL for anthropic: models.",
)
@click.option(
    "--api-key-env",
    default=None,
    metavar="VAR",
    help="Read the model key from VAR (default OPENAI_API_KEY / GEMINI_API_KEY / ANTHROPIC_API_KEY).",
)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Policy file, TOML or YAML (repeatable).",
)
@click.option(
    "--non-interactive", is_flag=True, help="Never prompt: refuse whatever would ask, unless a policy allows it."
)
@click.option(
    "--auto-approve",
    is_flag=True,
    help="Everything that runs inside the sandbox proceeds without asking; host-side git and MCP "
    "tools still ask, and a policy's deny still wins.",
)
@click.option(
    "--transcript",
    "transcript_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Where to write the JSONL transcript: a new file (an existing one is refused, never appended to).",
)
@click.option(
    "--max-turns",
    default=None,
    type=click.IntRange(1, 10_000),
    help=f"Stop after N turns (default {DEFAULT_MAX_TURNS}).",
)
@click.option(
    "--max-tokens",
    default=None,
    type=click.IntRange(1, None),
    help="Stop once the model has used N tokens, input and output summed.",
)
@click.option(
    "--max-wall",
    default=None,
    type=click.FloatRange(0, None, min_open=True),
    metavar="SECONDS",
    help="Stop after this much wall time.",
)
@click.option(
    "--model-timeout",
    default=None,
    type=click.FloatRange(0, None, min_open=True),
    metavar="SECONDS",
    help="The longest the model server may stay silent (before its answer starts, or between two pieces of it); "
    "then the session stops with model_api_error (default 300).",
)
@click.option(
    "--context-window",
    default=None,
    type=click.IntRange(256, None),
    metavar="TOKENS",
    help="The model's context window (default: known per model family); "
    "older tool outputs are elided as the conversation nears it.",
)
@click.option(
    "--output",
    "output_format",
    type=click.Choice(["text", "json", "stream-json"]),
    default="text",
    show_default=True,
    help="json: one JSON object on stdout at every exit, set-up errors included (exit_code, status, error, "
    "session_id, turns, final_text, refused_calls, applied, left_out, conflicts, ...). stream-json: "
    "the session's events on stdout, one JSON object a line with a `type`, as they happen, ending "
    "with a session_end line holding that object; never prompts (as --non-interactive).",
)
@click.option("--disable", "disabled", multiple=True, help="Switch a tool off for this session (repeatable).")
@click.option("--no-git", is_flag=True, help="Do not offer the host-side git tool.")
@click.option(
    "--apply",
    "apply_at_end",
    is_flag=True,
    help="Copy mode: apply the session's changes to the workspace at the end, without asking (CI).",
)
@click.option(
    "--resume",
    "resume_id",
    default=None,
    metavar="ID",
    help="Continue session ID: its workspace (its copy, in copy mode), its "
    "conversation, its transcript; its model and policy files unless --model, --policy.",
)
@click.option(
    "--continue",
    "continue_",
    is_flag=True,
    help="Continue the newest session of this workspace (the cwd, or --workspace), as --resume.",
)
@best_of_options("TASK")
@report_option
@sandbox_options
@click.argument("task")
def run(
    workspace: str,
    model_spec: str | None,
    base_url: str | None,
    api_key_env: str | None,
    policies: tuple[str, ...],
    non_interactive: bool,
    auto_approve: bool,
    transcript_path: str | None,
    max_turns: int | None,
    max_tokens: int | None,
    max_wall: float | None,
    model_timeout: float | None,
    context_window: int | None,
    output_format: str,
    disabled: tuple[str, ...],
    no_git: bool,
    apply_at_end: bool,
    resume_id: str | None,
    continue_: bool,
    attempts: int,
    pick: str | None,
    pick_timeout: int,
    config: SandboxConfig,
    mode: WorkspaceMode,
    copy_limits: CopyLimits,
    task: str,
) -> None:
    """Run TASK with a model, tools in the sandbox, approvals by the ladder. TASK `-` reads the task
    from standard input (the session is then non-interactive: stdin is spent).

    Defaults come from $XDG_CONFIG_HOME/openagents-sandbox/config.toml (model, base_url, api_key_env,
    policy, runtime, image, max_turns, max_tokens, max_wall, model_timeout, context_window); flags override them."""
    from ..api import Sandbox, SandboxOptions
    from ..ground.text import visible
    from ..loop import SessionStatus
    from ..loop.summary import changed_files, exit_code, summary_json, summary_lines
    from ..policy.approvals import NonInteractiveApprover, TerminalApprover
    from ..terminal.live import LiveView
    from ..terminal.painter import Line
    from .user_config import session_fields

    defaults = load_defaults(workspace or ".")
    _check_attempts(attempts, pick, resume_id or continue_, mode)
    resumed = _resumed(resume_id, continue_, workspace, transcript_path, mode) if resume_id or continue_ else None
    if resumed is not None:  # what the session ran with, unless a flag says otherwise
        same_model = model_spec is None or model_spec == resumed.model_spec
        base_url = base_url or (resumed.base_url if same_model else None)
        api_key_env = api_key_env or (resumed.api_key_env if same_model else None)
        model_spec = model_spec or resumed.model_spec
        policies = policies or tuple(resumed.policy_files)
        workspace = resumed.workspace
    model_spec = model_spec or defaults.model
    if not model_spec:
        raise setup_error(
            OpenAgentsError(
                ErrorType.CONFIG_INVALID, f"no model: pass --model ({MODEL_FORMS}) or set model in the config file"
            )
        )
    if output_format == "stream-json":
        non_interactive = True  # a script reads stdout: nobody is at a prompt
    if task == "-":
        task = sys.stdin.read()
        non_interactive = True
        if not task.strip():
            raise setup_error(OpenAgentsError(ErrorType.CONFIG_INVALID, "the task read from standard input is empty"))
    try:
        path = new_transcript_path(transcript_path)
    except OpenAgentsError as err:
        raise setup_error(err) from None
    view = LiveView()
    on_event: Callable[[dict[str, Any]], None] = view.on_event
    stream = None
    if output_format == "stream-json":
        from .stream_json import StreamJson

        stream = StreamJson()
        on_event = _both(view.on_event, stream.on_event)
    interrupt_once()
    interactive = not non_interactive and sys.stdin.isatty()
    approver = TerminalApprover(show_diff=view.show_diff) if interactive else NonInteractiveApprover()
    if auto_approve:
        view.header_notes.append(
            "  auto-approve: on (everything inside the sandbox runs without "
            "asking; host git and MCP tools still ask; a deny still wins)"
        )
    if interactive:
        view.header_notes.append("  (at a prompt, `n REASON` rejects and tells the model why; Ctrl-C ends the session)")
    host_tools = None
    try:
        options = SandboxOptions(
            config=config,
            mode=mode.value,
            **copy_options(copy_progress(copy_limits)),
            **session_fields(  # the config file's keys under the flags, as SandboxOptions names them
                defaults,
                model=model_spec,
                base_url=base_url,
                api_key_env=api_key_env,
                policy_files=list(policies),
                max_turns=max_turns,
                max_tokens=max_tokens,
                max_wall_s=max_wall,
                model_timeout_s=model_timeout,
                context_window=context_window,
            ),
            disabled_tools=frozenset(disabled),
            git=not no_git,
            auto_approve=auto_approve,
            approver=approver,
            transcript=path,
            on_record=on_event,
        )
        if pick is not None:
            from .attempts import run_attempts

            view.close()
            run_attempts(options, Path(workspace), task, attempts, pick, apply_at_end, output_format, pick_timeout)
        host_tools = _start_mcp_servers(defaults.mcp_servers, view, Path(workspace))
        box = Sandbox(
            Path(workspace),
            options,
            kind="run",
            host_tools=host_tools,
            resume=resumed.id if resumed is not None else None,
        ).open()
    except OpenAgentsError as err:
        if host_tools is not None:
            host_tools.close()
        raise setup_error(err) from None
    except ValueError as err:
        raise setup_error(OpenAgentsError(ErrorType.CONFIG_INVALID, str(err))) from None
    except OSError as err:  # the transcript's file could not be made after all (a race), the state directory
        if host_tools is not None:
            host_tools.close()
        raise setup_error(
            OpenAgentsError(ErrorType.IO_ERROR, f"{err.filename or 'the session'}: {err.strerror or err}")
        ) from None
    except KeyboardInterrupt:  # while the box started: the Sandbox removed it
        ignore_interrupts()
        click.echo("oa-sandbox: cancelled while the sandbox started", err=True)
        raise click.exceptions.Exit(EXIT_CANCELLED) from None
    result = None
    try:
        try:
            result = box.run_turns(task)
        except KeyboardInterrupt:  # a second press while the loop itself was ending the session
            result = None
        ignore_interrupts()  # from here on, clean-up runs to its end
        if result is None:
            from ..loop import SessionResult

            result = SessionResult(status=SessionStatus.CANCELLED, reason="interrupted (Ctrl-C)")
        box.record.turns = result.last_turn  # saved by close(); `rollback --turn` past it is refused
    finally:
        ignore_interrupts()
        view.close()
        if result is not None and result.status == SessionStatus.CANCELLED:
            view.note("cancelling: removing the sandbox (Ctrl-C is ignored until it is gone)")
        swept = box.close(**({"status": result.status.value, "reason": result.reason} if result is not None else {}))
        if host_tools is not None:
            host_tools.close()  # the user's MCP servers end with the session
    record = box.record
    for line in swept:
        view.note(visible(f"integrity sweep: {line}"))
    changes = changed_files(record)
    code = exit_code(result)
    view.print([Line(text) for text in summary_lines(result, changes)])
    view.note(f"   transcript: {record.transcript}")
    view.note(f"   session: {record.id} ({record.mode.value} mode)")
    write_requested_report(record, view.note)
    report = landing_refused = None
    if record.mode.value == "copy":
        if apply_at_end:
            try:
                applied, report = apply_copy(record, "run --apply", box)  # the session's gate decides
            except OpenAgentsError as err:  # the ladder refused the landing (a deny rule, copy-only, read-only): typed
                landing_refused = err
                view.note(visible(f"oa-sandbox: {err.type.value}: {err.message}"))
                code = EXIT_REFUSED if code == EXIT_OK else code
            else:
                if applied != EXIT_OK and code in (EXIT_OK, EXIT_REFUSED):
                    code = EXIT_STOPPED  # an apply conflict: nothing reached the workspace
        else:
            view.note(
                f"   the changes are in a copy: `oa-sandbox changes {record.id}` "
                f"to review, `oa-sandbox apply {record.id}` to apply"
            )
    if output_format == "json":
        click.get_current_context().meta[JSON_PRINTED] = True
        click.echo(
            json_line(landing_said(summary_json(result, record, changes, code, report), landing_refused))
        )  # bounded: at most MAX_LINE_BYTES
    elif stream is not None:
        click.get_current_context().meta[JSON_PRINTED] = True
        stream.end(landing_said(summary_json(result, record, changes, code, report), landing_refused))
    elif result.final_text:
        click.echo(visible(result.final_text))  # the model's text: no raw escape reaches the terminal
    raise click.exceptions.Exit(code)


def _check_attempts(attempts: int, pick: str | None, resuming: object, mode: WorkspaceMode) -> None:
    """--attempts/--pick: both or neither, on a new copy session."""
    refuse = None
    if (attempts > 1) != (pick is not None):
        refuse = "--attempts N (2 or more) and --pick COMMAND go together"
    elif pick is not None and resuming:
        refuse = "--attempts starts from a fresh copy of the workspace: not with --resume or --continue"
    elif pick is not None and mode.value == "bind":
        refuse = "--attempts works on copies of the workspace: not in bind mode"
    elif pick is not None and not pick.strip():
        refuse = "--pick needs a command"
    if refuse:
        raise setup_error(OpenAgentsError(ErrorType.INVALID_ARGUMENTS, refuse))


def _both(
    first: Callable[[dict[str, Any]], None], second: Callable[[dict[str, Any]], None]
) -> Callable[[dict[str, Any]], None]:
    def both(record: dict[str, Any]) -> None:
        first(record)
        second(record)

    return both


def _resumed(
    resume_id: str | None, continue_: bool, workspace: str, transcript_path: str | None, mode: WorkspaceMode
) -> SessionRecord:
    """The record of the session `--resume ID` or `--continue` names, if it can be continued; a
    set-up error naming why not (running, discarded, no transcript, options that contradict it)."""
    from ..transcript.resume import find, newest
    from ..workspace.records import WorkspaceMode

    ctx = click.get_current_context()
    refuse = None
    if resume_id and continue_:
        refuse = "--resume and --continue: give one"
    elif transcript_path is not None:
        refuse = "--transcript: a resumed session appends to its own transcript"
    if refuse:
        raise setup_error(OpenAgentsError(ErrorType.INVALID_ARGUMENTS, refuse))
    try:
        record = find(resume_id) if resume_id else newest(Path(workspace))
    except OpenAgentsError as err:
        raise setup_error(err) from None
    explicit = ctx.get_parameter_source("workspace") == click.core.ParameterSource.COMMANDLINE
    if resume_id and explicit and str(Path(workspace).resolve()) != record.workspace:
        refuse = f"session {record.id} worked on {record.workspace}, not {Path(workspace).resolve()}"
    elif mode not in (WorkspaceMode.AUTO, record.mode):
        refuse = f"session {record.id} ran in {record.mode.value} mode: it goes on in it"
    if refuse:
        raise setup_error(OpenAgentsError(ErrorType.INVALID_ARGUMENTS, refuse))
    return record


def _start_mcp_servers(servers: list[dict[str, Any]], view: LiveView, workspace: Path) -> McpHost | None:
    """The config file's stdio MCP servers, started on the host (their tools ask every time unless a
    policy says otherwise), each from outside every place the box of `workspace` writes
    (tools/mcp/launch.py); each one that could not start or was refused is named, and the session goes on."""
    if not servers:
        return None
    from ..tools.mcp.client import McpHost

    host = McpHost(servers, workspace=workspace).start()
    for problem in host.problems:
        view.note(f"oa-sandbox: {problem}")
    return host
