"""`oa-sandbox`: the command line. Exit codes of `run`: 0 finished with no refused call, 3 finished
but a call was refused, 1 stopped (max turns, a loop, a budget, the model API), 2 a usage or set-up
error (no Docker daemon, missing image, bad config), 130 cancelled (Ctrl-C). Other commands: 0 done,
1 a typed tool error, 2 a set-up error."""
from __future__ import annotations

import functools
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

import click

from ..config import SandboxConfig
from ..errors import ErrorType, OpenAgentsError
from ..terminal.painter import Line
from ..protocol import ToolResult
from ..terminal.render import json_line
from ..terminal.summary import EXIT_CANCELLED, EXIT_CODES_HELP, EXIT_OK, EXIT_REFUSED, EXIT_SETUP, EXIT_STOPPED

if TYPE_CHECKING:  # for annotations only: each command imports what it runs, so `oa-sandbox --help` stays quick
    from ..acp.server import AcpApprover
    from ..terminal.live import LiveView
    from ..mcp.client import McpHost
    from ..workspace.review import ApplyReport
    from ..sandbox.pool import PoolEvent
    from ..session import OpenSession
    from ..workspace.records import SessionRecord, WorkspaceMode
    from ..tools.registry import HostTools
    from .user_config import UserConfig
    from ..workspace.copy import CopyLimits, CopyProgress

EXIT_TOOL_ERROR = EXIT_STOPPED


class SetupExit(click.exceptions.Exit):
    """A set-up error, said on stderr in one line; it carries the typed error for `--output json`."""

    def __init__(self, error: OpenAgentsError, code: int = EXIT_SETUP) -> None:
        super().__init__(code)
        self.error = error


def _setup_error(err: OpenAgentsError) -> SetupExit:
    from ..terminal.render import visible

    click.echo(visible(f"oa-sandbox: {err.type.value}: {err.message}"), err=True)  # messages may name box paths
    return SetupExit(err)


# A closed terminal (SIGHUP) ends a command as SIGTERM does: unwound, its box removed (issue 16).
_ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _terminate_as_interrupt() -> None:
    """SIGTERM and SIGHUP unwind like Ctrl-C, so context managers remove their containers."""
    for signum in _ENDING_SIGNALS:
        signal.signal(signum, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))


def _interrupt_once() -> None:
    """The first Ctrl-C (or SIGTERM, SIGHUP) unwinds the session as a KeyboardInterrupt; from then on
    all are ignored, so the clean-up that follows (killing the call, removing the container, the
    sweep) runs to its end however often the key is pressed."""

    def first(*_: object) -> None:
        _ignore_interrupts()
        raise KeyboardInterrupt()

    for signum in (signal.SIGINT, *_ENDING_SIGNALS):
        signal.signal(signum, first)


def _ignore_interrupts() -> None:
    for signum in (signal.SIGINT, *_ENDING_SIGNALS):
        signal.signal(signum, signal.SIG_IGN)


def _user_config() -> UserConfig:
    from .user_config import load_user_config

    try:
        return load_user_config()
    except OpenAgentsError as err:
        raise _setup_error(err) from None


def sandbox_options(fn: Callable[..., None]) -> Callable[..., None]:
    """The sandbox's knobs, shared by every command that starts one; the command gets `config`."""
    options = [
        click.option("--image", default=None, help="Sandbox image (default openagents-sandbox:latest)."),
        click.option("--memory", default=None, help="Memory limit, e.g. 1g."),
        click.option("--pids", type=int, default=None, help="Most processes in the box."),
        click.option("--cpus", type=float, default=None, help="CPU share, e.g. 1.5."),
        click.option("--env", "env", multiple=True, metavar="NAME=VALUE", help="An explicit extra variable for the box (repeatable)."),
        click.option("--runtime", default=None, help="Docker runtime, e.g. runsc (gVisor)."),
        click.option("--user", default=None, metavar="UID:GID", help="Run the box as this user (default: the workspace owner)."),
        click.option("--egress", default=None, metavar="allow:HOST[,HOST...]", help="Opt-in egress through the allow-listing proxy (default: no network)."),
        click.option("--write-quota", default=None, metavar="SIZE", help="How much the session may grow the workspace, e.g. 4g (default), 500m."),
        click.option("--entry-quota", type=click.IntRange(100), default=None, metavar="N",
                     help="How many new files, directories and links the session may create in the workspace (default 200000)."),
        click.option("--start-concurrency", type=click.IntRange(1, 256), default=None, metavar="N",
                     help="Sandbox starts this process runs at once; the rest wait in line, shown as they wait (default 4, OA_START_CONCURRENCY)."),
        click.option("--workspace-mode", type=click.Choice(["auto", "bind", "copy"]), default="auto", show_default=True,
                     help="bind: the box writes the workspace; copy: it works on a private copy you review and apply; "
                          "auto: copy for a root-owned workspace, else bind."),
        click.option("--copy-max-bytes", default=None, metavar="SIZE",
                     help="Copy mode: refuse, before copying anything, a workspace holding more data than this (default 2g; copy_max_bytes in config.toml)."),
        click.option("--copy-max-entries", type=click.IntRange(1, None), default=None, metavar="N",
                     help="Copy mode: refuse, before copying anything, a workspace of more entries than this (default 200000; copy_max_entries in config.toml)."),
    ]

    @functools.wraps(fn)
    def wrapper(*args: Any, image: str | None, memory: str | None, pids: int | None, cpus: float | None, env: tuple[str, ...],
                runtime: str | None, user: str | None, egress: str | None, write_quota: str | None, start_concurrency: int | None,
                workspace_mode: str, entry_quota: int | None = None, copy_max_bytes: str | None = None, copy_max_entries: int | None = None,
                **kwargs: Any) -> None:
        from ..workspace.records import WorkspaceMode
        from ..workspace.copy import CopyLimits

        defaults = _user_config()  # the config file's values; a flag given wins
        config = build_config(image or defaults.image, memory or defaults.memory, pids or defaults.pids, cpus or defaults.cpus, env,
                              runtime or defaults.runtime, user, egress, write_quota, start_concurrency or defaults.start_concurrency,
                              entry_quota)
        limits = CopyLimits()
        max_bytes = copy_max_bytes or defaults.copy_max_bytes
        if max_bytes is not None:
            limits = CopyLimits(max_bytes=parse_size(str(max_bytes), "--copy-max-bytes"), max_entries=limits.max_entries)
        if copy_max_entries or defaults.copy_max_entries:
            limits = CopyLimits(max_bytes=limits.max_bytes, max_entries=copy_max_entries or defaults.copy_max_entries or 0)
        return fn(*args, config=config, mode=WorkspaceMode(workspace_mode), copy_limits=limits, **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def build_config(image: str | None, memory: str | None, pids: int | None, cpus: float | None, env: Iterable[str], runtime: str | None,
                 user: str | None, egress: str | None = None, write_quota: str | None = None,
                 start_concurrency: int | None = None, entry_quota: int | None = None) -> SandboxConfig:
    values: dict[str, Any] = {k: v for k, v in dict(image=image, memory=memory, pids=pids, cpus=cpus, runtime=runtime, user=user,
                                                    start_concurrency=start_concurrency, entry_quota=entry_quota).items() if v is not None}
    if write_quota is not None:
        values["write_quota"] = parse_size(write_quota)
    extras = {}
    for item in env:
        name, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--env")
        extras[name] = value
    if egress is not None:
        kind, sep, hosts = egress.partition(":")
        if kind != "allow" or not sep or not hosts:
            raise click.BadParameter("use allow:HOST[,HOST...]", param_hint="--egress")
        values["egress"] = {"allow": [h.strip() for h in hosts.split(",") if h.strip()]}
    try:
        return SandboxConfig(**values, env=extras)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def parse_size(text: str, flag: str = "--write-quota") -> int:
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    number, unit = text.strip().lower().rstrip("ib").rstrip(), ""
    if number and number[-1] in units:
        number, unit = number[:-1], number[-1]
    try:
        value = int(float(number) * units[unit])
    except ValueError:
        value = -1
    if value <= 0:
        raise click.BadParameter(f"{text!r} is not a size such as 500m or 4g", param_hint=flag) from None
    return value


def _copy_progress(limits: CopyLimits) -> CopyLimits:
    """The limits, with a progress line on stderr while a long copy runs, when stderr is a terminal
    (and only then: a log or a CI job gets no carriage returns)."""
    if not sys.stderr.isatty():
        return limits
    import dataclasses

    shown = [False]

    def progress(p: CopyProgress) -> None:
        if p.done:
            if shown[0]:
                click.echo("\r\x1b[K", nl=False, err=True)
            return
        if p.elapsed_s < 1.0:
            return
        shown[0] = True
        of = f" of {p.total_entries:,} ({100 * p.entries // max(1, p.total_entries)}%)" if p.total_entries else ""
        click.echo(f"\r\x1b[K⧗ copying the workspace for copy mode: {p.entries:,}{of} entries, {p.bytes / (1 << 20):.0f} MiB written, "
                   f"{p.elapsed_s:.0f} s", nl=False, err=True)

    return dataclasses.replace(limits, progress=progress)


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log what the host does.")
@click.version_option(package_name="openagents-sandbox")
def main(verbose: bool) -> None:
    """Run an AI coding agent's tools in a hardened Docker sandbox."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, format="oa-sandbox: %(message)s")
    from ..host_memory import tune_allocator

    tune_allocator()  # a long `acp` server's RSS follows its sessions (host_memory.py)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_OnceFilter())
    _complete_pending_sweeps()


def _complete_pending_sweeps() -> None:
    """Before anything else, every command finishes the integrity sweeps that host processes which
    ended (OOM, SIGKILL, power loss) left journaled (sweep_journal.py): their boxes are reaped first,
    so no box of theirs still writes while the sweep runs. Never fatal; one that cannot finish is
    said, and no session starts on that workspace until it does."""
    from ..workspace import sweep_journal
    from ..terminal.render import visible

    try:
        if not any(entry.owner_gone() for entry in sweep_journal.pending()):
            return
        try:
            from ..sandbox.docker import docker_client

            docker_client(timeout=30).close()  # its first client reaps the boxes of owners that are gone
        except OpenAgentsError as err:
            logging.getLogger(__name__).warning("could not reap the boxes of ended sessions before their sweep: %s", err.message)
        for entry, report in sweep_journal.complete_gone():
            for line in report.lines():
                click.echo(visible(f"oa-sandbox: integrity sweep left by an ended session (pid {entry.owner_pid()}) of {entry.workspace}: {line}"),
                           err=True)
    except Exception as err:  # noqa: BLE001 - a command is never stopped by another session's leftovers
        logging.getLogger(__name__).warning("could not complete the pending integrity sweeps: %s", str(err)[:300])


class _OnceFilter(logging.Filter):
    """Each warning once per process: the same warning on every command is noise that hides the next one."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = record.getMessage()
        if key in self._seen:
            return False
        self._seen.add(key)
        return True


@main.group()
def image() -> None:
    """The sandbox image."""


@image.command("build")
@click.option("--base", default="python:3.12-slim", show_default=True, help="Base image, or 'debootstrap' to make one from Debian's packages.")
@click.option("--tag", default=None, help="Image tag (default openagents-sandbox:latest).")
@click.option("--rebuild-base", is_flag=True, help="Run debootstrap again even if the base exists.")
@click.option("--if-needed", is_flag=True, help="Only build when the image is missing or was built from other agent code.")
def image_build(base: str, tag: str | None, rebuild_base: bool, if_needed: bool) -> None:
    """Build the sandbox image; with no registry, from a debootstrap base."""
    from ..sandbox.backend import backend_from_config

    config = SandboxConfig()
    progress = lambda message: click.echo(message, err=True)  # noqa: E731
    try:
        backend_from_config(config).build_image(tag, base, rebuild_base=rebuild_base, only_if_needed=if_needed, progress=progress)
    except OpenAgentsError as err:
        raise _setup_error(err) from None


@main.command("exec")
@click.option("--workspace", required=True, type=click.Path(exists=True, file_okay=False), help="Directory mounted at /workspace.")
@sandbox_options
@click.argument("tool")
@click.argument("json_args", default="{}")
def exec_(workspace: str, config: SandboxConfig, mode: WorkspaceMode, copy_limits: CopyLimits, tool: str, json_args: str) -> None:
    """Run one TOOL with JSON_ARGS in a fresh sandbox; print one JSON result. In copy mode the
    change stays in the session's copy: `oa-sandbox changes ID`, `oa-sandbox apply ID`."""
    from ..terminal.render import visible
    from ..sandbox.backend import backend_from_config
    from ..workspace.records import WorkspaceMode, prepare
    from ..tools.args import validate_arguments

    _terminate_as_interrupt()
    try:
        args = validate_arguments(tool, json_args).model_dump(exclude_none=True)
    except OpenAgentsError as err:
        result = ToolResult.failure(err)
    else:
        try:
            record, git_dir = prepare(Path(workspace).resolve(), mode, config.user, kind="exec", limits=_copy_progress(copy_limits))
            box_config = config.model_copy(update={"user": record.user})
            sandbox = backend_from_config(box_config).sandbox(record.box_workspace, box_config, state_dir=record.dir, git_dir=git_dir)
            sandbox.start()
            try:
                result = sandbox.call(tool, args)
            finally:
                sandbox.close()
        except OpenAgentsError as err:
            raise _setup_error(err) from None
        record.status = "finished" if result.ok else "stopped"
        record.save()
        for report in sandbox.sweeper.reports:
            for line in report.lines():
                click.echo(visible(f"oa-sandbox: integrity sweep: {line}"), err=True)
        if record.mode == WorkspaceMode.COPY:
            click.echo(f"oa-sandbox: session {record.id} (copy mode): review with `oa-sandbox changes {record.id}`, "
                       f"apply with `oa-sandbox apply {record.id}`", err=True)
    click.echo(result.model_dump_json())
    if result.error is not None and result.error.type in _NO_SANDBOX:
        raise _setup_error(OpenAgentsError(result.error.type, result.error.message))
    raise click.exceptions.Exit(EXIT_OK if result.ok else EXIT_TOOL_ERROR)


# A call that failed because the sandbox itself did (its daemon went away mid-call, it could not be
# replaced): the same set-up error, exit 2, as when the sandbox fails before the call.
_NO_SANDBOX = frozenset({ErrorType.DOCKER_UNAVAILABLE, ErrorType.SANDBOX_START_FAILED, ErrorType.IMAGE_MISSING})


def _wants_json(args: Iterable[str]) -> bool:
    """Whether a command line asks for `--output json` (read before click has parsed it)."""
    items = list(args)
    for i, arg in enumerate(items):
        if arg == "--":
            break
        if arg == "--output=json" or (arg == "--output" and items[i + 1:i + 2] == ["json"]):
            return True
    return False


def _exit_json(code: int, status: str, error: OpenAgentsError | None) -> dict[str, Any]:
    """The object `run --output json` prints when it ends before a session result exists: the same
    keys as a session's, empty, with the exit code, a status and the typed error."""
    return {"session_id": None, "status": status, "reason": error.message if error else status, "exit_code": code, "turns": 0,
            "final_text": "", "calls": {}, "refused_calls": [], "failed_calls": [], "changed_files": [], "changed_files_unknown": None,
            "tokens": {"input": 0, "output": 0}, "wall_s": 0.0, "error": error.to_dict() if error else None, "workspace_mode": None,
            "transcript": None, "session_status": None, "applied": None, "left_out": None, "conflicts": None}


_JSON_PRINTED = "oa-sandbox.json-printed"


class _JsonExits(click.Command):
    """`run --output json`: every exit prints exactly one JSON object on stdout, set-up errors and
    usage errors included (a CI script's json.load never meets an empty stdout); stderr still gets
    the one line a person reads."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        wants = _wants_json(args)
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as err:
            if wants:
                click.echo(json_line(_exit_json(EXIT_SETUP, "setup_error", OpenAgentsError(ErrorType.INVALID_ARGUMENTS, err.format_message()))))
            raise

    def invoke(self, ctx: click.Context) -> Any:
        if ctx.params.get("output_format") != "json":
            return super().invoke(ctx)
        try:
            return super().invoke(ctx)
        except SetupExit as exc:
            click.echo(json_line(_exit_json(exc.exit_code, "setup_error", exc.error)))
            raise
        except click.UsageError as err:  # raised by an option's own check (--env, --egress, sizes)
            click.echo(json_line(_exit_json(EXIT_SETUP, "setup_error", OpenAgentsError(ErrorType.INVALID_ARGUMENTS, err.format_message()))))
            raise
        except click.exceptions.Exit as exc:
            if not ctx.meta.get(_JSON_PRINTED):
                status = "cancelled" if exc.exit_code == EXIT_CANCELLED else "finished" if exc.exit_code == EXIT_OK else "stopped"
                click.echo(json_line(_exit_json(exc.exit_code, status, None)))
            raise
        except Exception as err:
            click.echo(json_line(_exit_json(EXIT_STOPPED, "failed", OpenAgentsError(ErrorType.INTERNAL_ERROR, f"{type(err).__name__}: {err}"[:500]))))
            raise


def _new_transcript_path(text: str | None) -> Path | None:
    """--transcript: a new file that can be written. An existing file is refused, never appended to
    (two sessions' events in one file read as one session); one that cannot be created is a set-up
    error now, not a traceback once the box has started."""
    import errno
    import os

    if text is None:
        return None
    path = Path(text).expanduser().absolute()
    if os.path.lexists(path):
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"--transcript {path} exists: a transcript is never appended to; "
                                                           "name a new file (or remove that one)")
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise NotADirectoryError(errno.ENOTDIR, f"{path.parent} is not a directory") from None
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        kind = {errno.EACCES: ErrorType.PERMISSION_DENIED, errno.EPERM: ErrorType.PERMISSION_DENIED, errno.EROFS: ErrorType.PERMISSION_DENIED,
                errno.ENOTDIR: ErrorType.NOT_A_DIRECTORY, errno.EISDIR: ErrorType.IS_DIRECTORY, errno.EEXIST: ErrorType.INVALID_ARGUMENTS}
        raise OpenAgentsError(kind.get(err.errno or 0, ErrorType.IO_ERROR),
                              f"--transcript {path}: cannot be written: {err.strerror or err}") from None
    os.close(fd)
    os.unlink(path)  # made again by the session; a set-up error before then leaves nothing behind
    return path


@main.command(cls=_JsonExits, epilog=EXIT_CODES_HELP)
@click.option("--workspace", default=".", show_default=True, type=click.Path(exists=True, file_okay=False), help="Directory mounted at /workspace.")
@click.option("--model", "model_spec", default=None, help="openai:NAME, gemini:NAME, anthropic:NAME or script:FILE (default: `model` in the config file).")
@click.option("--base-url", default=None, help="API base URL, e.g. http://127.0.0.1:8000/v1 for a local server (no key needed on loopback "
                                              "or a private address); default OPENAI_BASE_URL for openai: models, ANTHROPIC_BASE_URL for anthropic: models.")
@click.option("--api-key-env", default=None, metavar="VAR", help="Read the model key from VAR (default OPENAI_API_KEY / GEMINI_API_KEY / ANTHROPIC_API_KEY).")
@click.option("--policy", "policies", multiple=True, type=click.Path(exists=True, dir_okay=False), help="Policy file, TOML or YAML (repeatable).")
@click.option("--non-interactive", is_flag=True, help="Never prompt: refuse whatever would ask, unless a policy allows it.")
@click.option("--auto-approve", is_flag=True, help="Everything that runs inside the sandbox proceeds without asking; host-side git and MCP "
                                                   "tools still ask, and a policy's deny still wins.")
@click.option("--transcript", "transcript_path", default=None, type=click.Path(dir_okay=False),
              help="Where to write the JSONL transcript: a new file (an existing one is refused, never appended to).")
@click.option("--max-turns", default=None, type=click.IntRange(1, 10_000), help="Stop after N turns (default 100).")
@click.option("--max-tokens", default=None, type=click.IntRange(1, None), help="Stop once the model has used N tokens, input and output summed.")
@click.option("--max-wall", default=None, type=click.FloatRange(0, None, min_open=True), metavar="SECONDS", help="Stop after this much wall time.")
@click.option("--model-timeout", default=None, type=click.FloatRange(0, None, min_open=True), metavar="SECONDS",
              help="The longest the model server may stay silent (before its answer starts, or between two pieces of it); "
                   "then the session stops with model_api_error (default 300).")
@click.option("--context-window", default=None, type=click.IntRange(256, None), metavar="TOKENS",
              help="The model's context window (default: known per model family); older tool outputs are elided as the conversation nears it.")
@click.option("--output", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one JSON object on stdout at every exit, set-up errors included (exit_code, status, error, session_id, "
                   "turns, final_text, refused_calls, applied, left_out, conflicts, ...).")
@click.option("--disable", "disabled", multiple=True, help="Switch a tool off for this session (repeatable).")
@click.option("--no-git", is_flag=True, help="Do not offer the host-side git tool.")
@click.option("--apply", "apply_at_end", is_flag=True, help="Copy mode: apply the session's changes to the workspace at the end, without asking (CI).")
@sandbox_options
@click.argument("task")
def run(workspace: str, model_spec: str | None, base_url: str | None, api_key_env: str | None, policies: tuple[str, ...],
        non_interactive: bool, auto_approve: bool, transcript_path: str | None, max_turns: int | None, max_tokens: int | None,
        max_wall: float | None, model_timeout: float | None, context_window: int | None, output_format: str, disabled: tuple[str, ...], no_git: bool,
        apply_at_end: bool, config: SandboxConfig, mode: WorkspaceMode, copy_limits: CopyLimits, task: str) -> None:
    """Run TASK with a model, tools in the sandbox, approvals by the ladder. TASK `-` reads the task
    from standard input (the session is then non-interactive: stdin is spent).

    Defaults come from $XDG_CONFIG_HOME/openagents-sandbox/config.toml (model, base_url, api_key_env,
    policy, runtime, image, max_turns, max_tokens, max_wall, model_timeout, context_window); flags override them."""
    from ..budget import Budget
    from ..terminal.live import LiveView
    from ..loop import SessionStatus
    from ..policy.approvals import NonInteractiveApprover, TerminalApprover
    from ..terminal.render import visible
    from ..models.base import DEFAULT_MODEL_TIMEOUT_S
    from ..session import SessionOptions, open_session
    from ..terminal.summary import changed_files, exit_code, summary_json, summary_lines
    from ..tools.registry import RegistryConfig

    defaults = _user_config()
    model_spec = model_spec or defaults.model
    if not model_spec:
        raise _setup_error(OpenAgentsError(ErrorType.CONFIG_INVALID, "no model: pass --model (openai:NAME, gemini:NAME, anthropic:NAME, script:FILE) "
                                                                     "or set model in the config file"))
    if task == "-":
        task = sys.stdin.read()
        non_interactive = True
        if not task.strip():
            raise _setup_error(OpenAgentsError(ErrorType.CONFIG_INVALID, "the task read from standard input is empty"))
    try:
        path = _new_transcript_path(transcript_path)
    except OpenAgentsError as err:
        raise _setup_error(err) from None
    view = LiveView()
    _interrupt_once()
    interactive = not non_interactive and sys.stdin.isatty()
    budget = Budget(max_tokens=max_tokens or defaults.max_tokens, max_wall_s=max_wall or defaults.max_wall,
                    context_window=context_window or defaults.context_window)
    approver = TerminalApprover(show_diff=view.show_diff) if interactive else NonInteractiveApprover()
    if auto_approve:
        view.header_notes.append("  auto-approve: on (everything inside the sandbox runs without asking; host git and MCP tools still ask; a deny still wins)")
    if interactive:
        view.header_notes.append("  (at a prompt, `n REASON` rejects and tells the model why; Ctrl-C ends the session)")
    host_tools = None
    try:
        options = SessionOptions(model_spec=model_spec, base_url=base_url or defaults.base_url, api_key_env=api_key_env or defaults.api_key_env,
                                 policy_files=list(policies) or defaults.policy, max_turns=max_turns or defaults.max_turns or 100,
                                 registry=RegistryConfig(disabled=set(disabled), git=not no_git), budget=budget, auto_approve=auto_approve,
                                 model_timeout_s=model_timeout or defaults.model_timeout or DEFAULT_MODEL_TIMEOUT_S)
        host_tools = _start_mcp_servers(defaults.mcp_servers, view)
        opened = open_session(options, Path(workspace), config, approver, path, view.on_event, mode=mode, host_tools=host_tools,
                              copy_limits=_copy_progress(copy_limits))
    except OpenAgentsError as err:
        if host_tools is not None:
            host_tools.close()
        raise _setup_error(err) from None
    except ValueError as err:
        raise _setup_error(OpenAgentsError(ErrorType.CONFIG_INVALID, str(err))) from None
    except OSError as err:  # the transcript's file could not be made after all (a race), the state directory
        if host_tools is not None:
            host_tools.close()
        raise _setup_error(OpenAgentsError(ErrorType.IO_ERROR, f"{err.filename or 'the session'}: {err.strerror or err}")) from None
    except KeyboardInterrupt:  # while the box started: open_session removed it
        _ignore_interrupts()
        click.echo("oa-sandbox: cancelled while the sandbox started", err=True)
        raise click.exceptions.Exit(EXIT_CANCELLED) from None
    result = None
    try:
        try:
            result = opened.session.run(task)
        except KeyboardInterrupt:  # a second press while the loop itself was ending the session
            result = None
        _ignore_interrupts()  # from here on, clean-up runs to its end
        if result is None:
            from ..loop import SessionResult

            result = SessionResult(status=SessionStatus.CANCELLED, reason="interrupted (Ctrl-C)")
        opened.finish(result.status.value, result.reason)
        opened.record.turns = result.turns  # saved by close(); `rollback --turn` past it is refused
    finally:
        _ignore_interrupts()
        view.close()
        if result is not None and result.status == SessionStatus.CANCELLED:
            view.note("cancelling: removing the sandbox (Ctrl-C is ignored until it is gone)")
        swept = opened.close()
        if host_tools is not None:
            host_tools.close()  # the user's MCP servers end with the session
    record = opened.record
    for line in swept:
        view.note(visible(f"integrity sweep: {line}"))
    changes = changed_files(record)
    code = exit_code(result)
    view.print([Line(text) for text in summary_lines(result, changes)])
    view.note(f"   transcript: {record.transcript}")
    view.note(f"   session: {record.id} ({record.mode.value} mode)")
    report = None
    if record.mode.value == "copy":
        if apply_at_end:
            applied, report = _apply(record)
            if applied != EXIT_OK and code in (EXIT_OK, EXIT_REFUSED):
                code = EXIT_STOPPED  # an apply conflict: nothing reached the workspace
        else:
            view.note(f"   the changes are in a copy: `oa-sandbox changes {record.id}` to review, `oa-sandbox apply {record.id}` to apply")
    if output_format == "json":
        click.get_current_context().meta[_JSON_PRINTED] = True
        click.echo(json_line(summary_json(result, record, changes, code, report)))
    elif result.final_text:
        click.echo(visible(result.final_text))  # the model's text: no raw escape reaches the terminal
    raise click.exceptions.Exit(code)


def _start_mcp_servers(servers: list[dict[str, Any]], view: LiveView) -> McpHost | None:
    """The config file's stdio MCP servers, started on the host (their tools ask every time unless a
    policy says otherwise); each one that could not start is named, and the session goes on."""
    if not servers:
        return None
    from ..mcp.client import McpHost

    host = McpHost(servers).start()
    for problem in host.problems:
        view.note(f"oa-sandbox: {problem}")
    return host


def _pool_progress(event: PoolEvent) -> None:
    """The warm pool's refills on stderr (stdout is the protocol's): a refill waiting in the start
    line, each box made ready when -v is given; a failed start is logged by the pool itself."""
    from ..sandbox.pool import PoolBoxReady
    from ..sandbox.starts import StartQueued

    if isinstance(event, StartQueued) and not event.slot_taken:
        click.echo(f"oa-sandbox: pool: a refill waits for a start slot: {event.ahead} ahead, {event.starting} of {event.limit} starting", err=True)
    elif isinstance(event, PoolBoxReady):
        logging.getLogger(__name__).debug("pool: %d of %d sandboxes ready, %d claims waiting", event.ready, event.size, event.waiting_claims)


@main.command()
@click.option("--workspace", default=None, type=click.Path(exists=True, file_okay=False), help="Mount this instead of each session's cwd.")
@click.option("--model", "model_spec", required=True, help="openai:NAME, gemini:NAME or script:FILE.")
@click.option("--base-url", default=None)
@click.option("--api-key-env", default=None, metavar="VAR")
@click.option("--policy", "policies", multiple=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--transcript-dir", default=None, type=click.Path(file_okay=False), help="Where session transcripts go.")
@click.option("--max-turns", default=100, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--pool", default=0, show_default=True, type=click.IntRange(0, 32), help="Keep N sandboxes of --workspace warm, so a session starts at once.")
@sandbox_options
def acp(workspace: str | None, model_spec: str, base_url: str | None, api_key_env: str | None, policies: tuple[str, ...],
        transcript_dir: str | None, max_turns: int, pool: int, config: SandboxConfig, mode: WorkspaceMode, copy_limits: CopyLimits) -> None:
    """Speak the Agent Client Protocol on stdin/stdout, for editors (Zed and others)."""
    from ..acp.server import AcpServer
    from ..models.factory import model_from_spec
    from ..sandbox import lifetime
    from ..sandbox.pool import SandboxPool
    from ..session import SessionOptions, load_policies, open_session, with_policy_egress
    from ..state import new_id

    logging.getLogger().handlers[:] = [logging.StreamHandler(sys.stderr)]  # stdout is the protocol's
    lifetime.install()  # here, on the main thread: sessions and the pool start their boxes on others
    options = SessionOptions(model_spec=model_spec, base_url=base_url, api_key_env=api_key_env, policy_files=list(policies), max_turns=max_turns)
    try:
        model_from_spec(model_spec, base_url=base_url, api_key_env=api_key_env)  # fail fast on a missing key
    except OpenAgentsError as err:
        raise _setup_error(err) from None

    warm = None
    if pool:
        if not workspace:
            raise click.BadParameter("a warm pool needs a fixed --workspace", param_hint="--pool")
        ws = Path(workspace).resolve()
        try:
            warm = SandboxPool(ws, with_policy_egress(config, load_policies(ws, list(policies))[1]), size=pool, on_event=_pool_progress)
        except OpenAgentsError as err:
            raise _setup_error(err) from None
        warm.start()

    def start(ws: Path, approver: AcpApprover, on_event: Callable[[dict[str, Any]], None], host_tools: HostTools | None) -> OpenSession:
        path = Path(transcript_dir) / f"acp-{new_id()}.jsonl" if transcript_dir else None
        return open_session(options, ws, config, approver, path, on_event, sandbox=warm.claim() if warm else None, mode=mode, kind="acp",
                            host_tools=host_tools, copy_limits=copy_limits)

    try:
        AcpServer(start, workspace=Path(workspace) if workspace else None).serve()
    finally:
        if warm:
            warm.close()


@main.command()
@click.option("--workspace", default=".", show_default=True, type=click.Path(exists=True, file_okay=False), help="Directory mounted at /workspace.")
@click.option("--policy", "policies", multiple=True, type=click.Path(exists=True, dir_okay=False), help="Policy file, TOML or YAML (repeatable).")
@click.option("--transcript", "transcript_path", default=None, type=click.Path(dir_okay=False), help="Where to write the JSONL transcript.")
@sandbox_options
def mcp(workspace: str, policies: tuple[str, ...], transcript_path: str | None, config: SandboxConfig, mode: WorkspaceMode,
        copy_limits: CopyLimits) -> None:
    """Serve the six sandboxed tools over MCP stdio (register with Claude Code, Codex, Gemini CLI)."""
    from ..mcp.server import McpApprover, serve
    from ..terminal.render import visible
    from ..session import SessionOptions, open_session

    logging.getLogger().handlers[:] = [logging.StreamHandler(sys.stderr)]  # stdout is the protocol's
    _terminate_as_interrupt()  # a SIGTERM while the box starts removes it too
    approver = McpApprover()
    options = SessionOptions(policy_files=list(policies))  # no model: the MCP client makes the calls
    try:
        new_transcript = _new_transcript_path(transcript_path)
        opened = open_session(options, Path(workspace), config, approver, new_transcript, mode=mode, kind="mcp", copy_limits=copy_limits)
    except OpenAgentsError as err:
        raise _setup_error(err) from None
    except ValueError as err:
        raise _setup_error(OpenAgentsError(ErrorType.CONFIG_INVALID, str(err))) from None
    for line in serve(opened, approver):
        click.echo(visible(f"oa-sandbox: integrity sweep: {line}"), err=True)
    record = opened.record
    click.echo(f"oa-sandbox: session {record.id} ({record.mode.value} mode), transcript {record.transcript}", err=True)
    if record.mode.value == "copy":
        click.echo(f"oa-sandbox: review with `oa-sandbox changes {record.id}`, apply with `oa-sandbox apply {record.id}`", err=True)


@main.command(epilog="Exit codes: 0 every task finished; 1 at least one did not (stopped, error, invalid line); "
                    "2 set-up error; 130 interrupted (no box left behind).")
@click.argument("tasks_file", metavar="TASKS.jsonl", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="RESULTS.jsonl: one line appended per task as it ends; "
                                                                            "a rerun skips the ids it has finished or stopped.")
@click.option("--concurrency", type=click.IntRange(1, 1024), default=None, metavar="N",
              help="Sessions at once (default: from cores and memory; starts still go through the start gate).")
@click.option("--model", "model_spec", default=None, help="For tasks without `model`: openai:NAME, gemini:NAME or script:FILE.")
@click.option("--base-url", default=None)
@click.option("--api-key-env", default=None, metavar="VAR")
@click.option("--policy", "policies", multiple=True, type=click.Path(exists=True, dir_okay=False), help="For tasks without `policy` (repeatable).")
@click.option("--auto-approve", is_flag=True, help="Everything inside each sandbox proceeds without asking (a policy's deny still wins).")
@click.option("--max-turns", default=None, type=click.IntRange(1, 10_000), help="For tasks without `max_turns` (default 100).")
@click.option("--max-wall", default=None, type=click.FloatRange(0, None, min_open=True), metavar="SECONDS", help="For tasks without `max_wall`.")
@click.option("--max-tokens", default=None, type=click.IntRange(1, None), help="Per task.")
@click.option("--runtime", default=None, help="For tasks without `runtime`: runc or runsc.")
@click.option("--image", default=None, help="Sandbox image (default openagents-sandbox:latest).")
@click.option("--memory", default=None, help="Memory limit of each box, e.g. 1g.")
@click.option("--cpus", type=float, default=None, help="CPU share of each box.")
@click.option("--start-concurrency", type=click.IntRange(1, 256), default=None, metavar="N", help="Sandbox starts at once (default 4).")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option("--ray-address", default=None, metavar="ADDRESS", help="--engine ray: the cluster's address (HOST:PORT, or auto).")
@click.option("--ray-resource", default="oa_sandbox", show_default=True, metavar="NAME",
              help="--engine ray: the custom resource a node offers per box it holds.")
@click.option("--max-retries", default=2, show_default=True, type=click.IntRange(0, 10), help="--engine ray: reruns of a task whose node was lost.")
def batch(tasks_file: str, out: str, concurrency: int | None, model_spec: str | None, base_url: str | None, api_key_env: str | None,
          policies: tuple[str, ...], auto_approve: bool, max_turns: int | None, max_wall: float | None, max_tokens: int | None,
          runtime: str | None, image: str | None, memory: str | None, cpus: float | None, start_concurrency: int | None, engine: str,
          ray_address: str | None, ray_resource: str, max_retries: int) -> None:
    """Run every task of TASKS.jsonl (id, workspace, task; optional model, policy, max_turns,
    max_wall, runtime), each on its own copy of its workspace; one result line each in --out
    (status, exit_code, session_id, patch, left_out, tokens, wall_s, error, node)."""
    from ..batch.command import BatchRequest, run_batch
    from ..batch.runner import BatchSettings

    defaults = _user_config()
    config = build_config(image or defaults.image, memory or defaults.memory, defaults.pids, cpus or defaults.cpus, (),
                          runtime or defaults.runtime, None, start_concurrency=start_concurrency or defaults.start_concurrency)
    settings = BatchSettings(model=model_spec or defaults.model, base_url=base_url or defaults.base_url,
                             api_key_env=api_key_env or defaults.api_key_env, policy=[str(Path(p).resolve()) for p in policies] or defaults.policy,
                             auto_approve=auto_approve, max_turns=max_turns or defaults.max_turns or 100, max_wall=max_wall or defaults.max_wall,
                             max_tokens=max_tokens or defaults.max_tokens, config=config)
    request = BatchRequest(Path(tasks_file), Path(out), settings, concurrency=concurrency, engine=engine, ray_address=ray_address,
                           ray_resource=ray_resource, max_retries=max_retries)
    try:
        code = run_batch(request)
    except OpenAgentsError as err:
        raise _setup_error(err) from None
    raise click.exceptions.Exit(code)


@main.group()
def transcript() -> None:
    """Session transcripts."""


@transcript.command("show")
@click.argument("path_or_id")
def transcript_show(path_or_id: str) -> None:
    """Render a JSONL transcript for a terminal (secrets redacted): a file, or a session's by its id."""
    from rich.console import Console
    from rich.text import Text

    from ..terminal.render import visible
    from ..transcript import resolve_transcript, show_lines

    try:
        path = resolve_transcript(path_or_id)
    except OpenAgentsError as err:
        raise _setup_error(err) from None

    console = Console(highlight=False, markup=False, emoji=False, soft_wrap=True)
    for line in show_lines(path):  # each line is visible() already; colour only on a terminal
        console.print(Text(visible(line.text), style=(line.style or "") if console.is_terminal else ""))


@transcript.command("list")
def transcript_list() -> None:
    """Every session's transcript, newest first: time, session id, status, path."""
    import time as _time

    from ..terminal.render import visible
    from ..transcript import list_transcripts

    for created, session_id, status, path in list_transcripts():
        when = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(created))
        click.echo(visible(f"{when}  {session_id}  {status:<10} {path}"))


@main.command()
@click.option("--workspace", default=".", type=click.Path(exists=True, file_okay=False), help="Show the settings a sandbox of this workspace would get.")
@click.option("--attack", is_flag=True, help="Also run a quick attack battery against this Docker set-up.")
@sandbox_options
def doctor(workspace: str, attack: bool, config: SandboxConfig, mode: WorkspaceMode, copy_limits: CopyLimits) -> None:
    """Check the daemon and the image, and print the security settings a sandbox gets."""
    from sandbox_agent import limits

    from ..sandbox.backend import backend_from_config
    from ..workspace.records import resolve_mode

    backend = backend_from_config(config)
    try:
        diagnosis = backend.diagnose(config)
    except OpenAgentsError as err:
        raise _setup_error(err) from None
    for status, text in diagnosis.checks:
        click.echo(f"[{status}]{' ' * (5 - len(status))}{text}")
    if not diagnosis.reachable:
        raise click.exceptions.Exit(EXIT_SETUP)
    ok = all(status != "fail" for status, _ in diagnosis.checks)
    config = diagnosis.config
    ws = Path(workspace).resolve()
    try:
        mode, user = resolve_mode(ws, mode, config.user)
    except OpenAgentsError as err:
        raise _setup_error(err) from None
    git = "every .git present at the start read-only" if (ws / ".git").exists() else "an empty read-only placeholder at /workspace/.git"
    where = "a private copy of " if mode.value == "copy" else ""
    click.echo("\nSecurity settings of a sandbox:")
    rows = [
        ("workspace mode", mode.value + ("  (nothing reaches the workspace until `oa-sandbox apply`)" if mode.value == "copy" else "")),
        ("workspace", f"{where}{ws} -> /workspace (read-write); {git}"),
        ("write quota", f"{config.write_quota >> 20} MiB of growth per session; integrity sweep at the end and on every replacement"),
        ("network", "none" if config.egress is None else f"internal network + egress proxy allowing {', '.join(config.egress.allow)}"
                    f"{f'; {len(config.egress.rules)} rules' if config.egress.rules else ''}"
                    f"{f'; credentials injected for {sorted({c.host for c in config.egress.credentials})}' if config.egress.credentials else ''}"),
        ("user", user + ("  (root-owned workspace: the copy belongs to this unprivileged user)" if mode.value == "copy" and ws.stat().st_uid == 0 else "")),
        *backend.settings_for(diagnosis, ws, user),
        ("shell timeout", f"{limits.SHELL_DEFAULT_TIMEOUT_S} s default, {limits.SHELL_MAX_TIMEOUT_S} s ceiling, enforced by the host"),
    ]
    for name, value in rows:
        click.echo(f"  {name:<18} {value}")
    if attack and diagnosis.can_start:
        from .selfcheck import run_checks

        click.echo("\nAttack checks (each a real attempt in a real sandbox):")
        try:
            results = run_checks(config, backend)
        except OpenAgentsError as err:
            raise _setup_error(err) from None
        for name, passed, detail in results:
            click.echo(f"  {'PASS' if passed else 'FAIL'}  {name:<28} {detail}")
        failed = sum(not passed for _, passed, _ in results)
        click.echo(f"{len(results) - failed} passed, {failed} failed")
        ok &= failed == 0
        if failed:
            raise click.exceptions.Exit(EXIT_TOOL_ERROR)
    raise click.exceptions.Exit(EXIT_OK if ok else EXIT_SETUP)


def _session(session_id: str) -> SessionRecord:
    from ..workspace.records import load

    try:
        return load(session_id)
    except OpenAgentsError as err:
        raise _setup_error(err) from None


def _copy_session(session_id: str, action: str) -> SessionRecord:
    record = _session(session_id)
    if record.mode.value != "copy":
        raise _setup_error(OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"session {record.id} ran in bind mode: its changes are already in "
                                           f"{record.workspace}; nothing to {action} (`oa-sandbox rollback` undoes them)"))
    if record.discarded:
        raise _setup_error(OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"session {record.id} was discarded: its copy is gone"))
    if record.running():
        raise _setup_error(OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"session {record.id} is still running (pid {record.host_pid})"))
    return record


def _apply(record: SessionRecord) -> tuple[int, ApplyReport]:
    """Apply a copy session's changes; 0 when applied, 1 on conflicts (then nothing was applied)."""
    from ..boxfs import show
    from ..workspace.review import apply_changes, shown
    from ..workspace.copy import CopyManifest

    report = apply_changes(CopyManifest.load(record.manifest_path))
    for item in report.left_out:
        click.echo(f"  left out {shown(item.path)}: {show(item.reason)}", err=True)
    if report.conflicts:
        for conflict in report.conflicts:
            click.echo(f"  conflict {shown(conflict.path)}: {show(conflict.reason)}", err=True)
        click.echo(f"nothing applied: {len(report.conflicts)} file(s) changed in {record.workspace} since the copy was taken", err=True)
        return EXIT_TOOL_ERROR, report
    record.applied = True
    record.save()
    click.echo(f"applied {len(report.applied)} change(s) to {record.workspace}" + (f", left out {len(report.left_out)}" if report.left_out else ""), err=True)
    return EXIT_OK, report


@main.group("sessions", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON array of the session records on stdout.")
@click.option("--all-users", is_flag=True, help="Also the sessions other users ran with this state directory.")
@click.pass_context
def sessions_(ctx: click.Context, as_json: bool, all_users: bool) -> None:
    """List your sessions, newest first, under a header: id, time, mode, status, files changed,
    workspace. `sessions prune` removes old ones."""
    if ctx.invoked_subcommand is not None:
        return
    from ..terminal.render import visible
    from ..workspace.records import HEADER, list_sessions, shown_status, summary_line

    records = list_sessions(all_users=all_users)
    if as_json:
        click.echo(json_line([{**r.model_dump(mode="json"), "shown_status": shown_status(r), "dir": str(r.dir)} for r in records]))
        return
    click.echo(HEADER)
    for record in records:
        click.echo(visible(summary_line(record)))


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
    except OSError as err:
        raise _setup_error(OpenAgentsError(ErrorType.IO_ERROR, f"could not prune: {err}")) from None
    freed = sum(size for _, size in removed)
    click.echo(f"removed {len(removed)} session{'s' if len(removed) != 1 else ''} ({freed / (1 << 20):.1f} MiB)")
    if kept:
        click.echo(f"kept {len(kept)} copy session{'s' if len(kept) != 1 else ''} not yet applied or discarded (or still running): "
                   f"{', '.join(r.id for r in kept[:5])}{' ...' if len(kept) > 5 else ''}; `--all` removes them too")


@main.command()
@click.argument("session_id")
@click.option("--stat", "stat_only", is_flag=True, help="One line per file with counts, as git diff --stat.")
def changes(session_id: str, stat_only: bool) -> None:
    """The unified diff of a copy session's changes against the real workspace."""
    from ..workspace.review import list_changes, render_diff
    from ..workspace.copy import CopyManifest

    record = _copy_session(session_id, "show")
    manifest = CopyManifest.load(record.manifest_path)
    for line in render_diff(manifest, list_changes(manifest), stat=stat_only):
        click.echo(line)


@main.command("apply")
@click.argument("session_id")
def apply_(session_id: str) -> None:
    """Apply a copy session's changes to the real workspace (a sanitiser: regular files and dirs,
    normalised modes, nothing under .git). Any conflict: nothing is applied, exit 1."""
    record = _copy_session(session_id, "apply")
    raise click.exceptions.Exit(_apply(record)[0])


@main.command()
@click.argument("session_id")
def discard(session_id: str) -> None:
    """Throw a copy session away: its copy, checkpoints, manifest, quarantine and transcript. Only
    its record stays, marked discarded, so `oa-sandbox sessions` still says what became of it."""
    from ..workspace.records import discard_state, state_bytes

    record = _copy_session(session_id, "discard")
    before = state_bytes(record)
    try:
        discard_state(record)  # box-written parts through boxfs.remove_tree: no link followed, any depth
    except OSError as err:
        raise _setup_error(OpenAgentsError(ErrorType.IO_ERROR, f"could not discard session {record.id}: {err}")) from None
    click.echo(f"discarded session {record.id}: {before / (1 << 20):.1f} MiB removed; its record stays (`oa-sandbox sessions`)", err=True)


@main.command()
@click.argument("session_id")
def checkpoints(session_id: str) -> None:
    """A session's checkpoints: turn, files changed, what was not checkpointed; a checkpoint that
    failed or was skipped says so (what changed then is unknown)."""
    from ..workspace.checkpoints import CheckpointStore, shown_path
    from ..terminal.render import visible

    record = _session(session_id)
    for point in CheckpointStore(record.checkpoint_store, Path(record.box_workspace)).list():
        label = "start" if point.turn == 0 else f"turn {point.turn}"
        if not point.ok:
            click.echo(visible(f"{label:<9}    ? files  checkpoint {point.state} ({point.error_type}): {point.error}"))
            continue
        names = [shown_path(p, point) for p in point.files_changed[:8]]
        more = point.files_changed_count - len(names)
        files = ", ".join(names) + (f" and {more} more" if more > 0 else "")
        click.echo(visible(f"{label:<9} {point.files_changed_count:>4} files  {files}"))
        for skipped in point.skipped:
            click.echo(visible(f"          not checkpointed: {shown_path(skipped.path, point)} ({skipped.reason})"))


@main.command()
@click.argument("session_id")
@click.option("--turn", required=True, type=click.IntRange(0, None), help="Restore the state after this turn; 0 is the start.")
def rollback(session_id: str, turn: int) -> None:
    """Restore a session's workspace (the copy, or the real one in bind mode) to a checkpoint.
    Any file changed since the session's last checkpoint: nothing is restored, exit 1."""
    from ..boxfs import from_store, show
    from ..workspace.checkpoints import CheckpointStore
    from ..terminal.render import visible

    record = _session(session_id)
    if record.running():
        raise _setup_error(OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"session {record.id} is still running (pid {record.host_pid})"))
    if record.discarded:
        raise _setup_error(OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"session {record.id} was discarded: its copy is gone"))
    store = CheckpointStore(record.checkpoint_store, Path(record.box_workspace))
    points = store.list()
    turns = [p.turn for p in points if p.ok]
    last = record.turns if record.turns is not None else max((p.turn for p in points), default=0)
    if turn > last:
        said = f"ran {last} turn{'s' if last != 1 else ''}" if record.turns is not None else f"has checkpoints up to turn {last}"
        raise _setup_error(OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"session {record.id} {said}: there is no turn {turn} to restore "
                                                                        f"(`oa-sandbox checkpoints {record.id}`)"))
    if turn not in turns:
        # A turn that changed nothing (or whose checkpoint failed) has none of its own: the one before it holds.
        earlier = [t for t in turns if t <= turn]
        if not earlier:
            raise _setup_error(OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"session {record.id} has no checkpoint at or before turn {turn}"))
        turn = max(earlier)
    try:
        report = store.restore(turn)
    except OpenAgentsError as err:
        raise _setup_error(err) from None
    if report.conflicts:
        for conflict in report.conflicts:
            click.echo(visible(f"  conflict {show(from_store(conflict.path))}: {conflict.reason}"), err=True)
        click.echo(f"nothing restored: {len(report.conflicts)} file(s) changed in {record.box_workspace} since the session's last checkpoint", err=True)
        raise click.exceptions.Exit(EXIT_TOOL_ERROR)
    for skipped in report.skipped:
        click.echo(visible(f"  not restored: {show(from_store(skipped.path))} ({skipped.reason})"), err=True)
    click.echo(f"restored {record.box_workspace} to {'the start' if turn == 0 else f'turn {turn}'}: "
               f"{len(report.restored)} written, {len(report.removed)} removed", err=True)


@main.command()
@click.option("--all", "all_", is_flag=True, help="Also remove sandboxes whose host process is still alive.")
def gc(all_: bool) -> None:
    """Remove leftover sandbox containers."""
    from ..sandbox.backend import backend_from_config

    try:
        removed = backend_from_config(SandboxConfig()).gc(all_)
    except OpenAgentsError as err:
        raise _setup_error(err) from None
    click.echo(f"removed {removed} sandbox container{'s' if removed != 1 else ''}")


if __name__ == "__main__":
    sys.exit(main())
