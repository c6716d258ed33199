"""The commands around sessions rather than in them: the image, `doctor`, transcripts, `gc`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import OpenAgentsError
from ..ground.exit_codes import EXIT_OK, EXIT_SETUP
from .common import EXIT_TOOL_ERROR, load_defaults, sandbox_options, setup_error

if TYPE_CHECKING:
    from ..config import SandboxConfig
    from ..workspace.copy import CopyLimits
    from ..workspace.host_code import Guard
    from ..workspace.records import WorkspaceMode


@click.group()
def image() -> None:
    """The sandbox image."""


@image.command("build")
@click.option(
    "--base",
    default="python:3.12-slim",
    show_default=True,
    help="Base image, or 'debootstrap' to make one from Debian's packages.",
)
@click.option("--tag", default=None, help="Image tag (default openagents-sandbox:latest).")
@click.option("--rebuild-base", is_flag=True, help="Run debootstrap again even if the base exists.")
@click.option(
    "--if-needed", is_flag=True, help="Only build when the image is missing or was built from other agent code."
)
def image_build(base: str, tag: str | None, rebuild_base: bool, if_needed: bool) -> None:
    """Build the sandbox image; with no registry, from a debootstrap base."""
    from ..config import SandboxConfig
    from ..sandbox.backend import backend_from_config

    config = SandboxConfig()
    progress = lambda message: click.echo(message, err=True)  # noqa: E731
    try:
        backend_from_config(config).build_image(
            tag, base, rebuild_base=rebuild_base, only_if_needed=if_needed, progress=progress
        )
    except OpenAgentsError as err:
        raise setup_error(err) from None


@click.group()
def transcript() -> None:
    """Session transcripts."""


@transcript.command("show")
@click.argument("path_or_id")
@click.option(
    "--full",
    is_flag=True,
    help="Every tool result in full (by default the last lines of each, as the live view shows them).",
)
def transcript_show(path_or_id: str, full: bool) -> None:
    """Render a JSONL transcript for a terminal (secrets redacted): a file, or a session's by its id."""
    from rich.console import Console
    from rich.text import Text

    from ..ground.text import visible
    from ..transcript import resolve_transcript, show_lines

    try:
        path = resolve_transcript(path_or_id)
    except OpenAgentsError as err:
        raise setup_error(err) from None

    console = Console(highlight=False, markup=False, emoji=False, soft_wrap=True)
    try:
        for line in show_lines(path, full=full):  # each line is visible() already; colour only on a terminal
            console.print(Text(visible(line.text), style=(line.style or "") if console.is_terminal else ""))
    except OpenAgentsError as err:  # a link, a FIFO where the transcript was: refused, typed
        raise setup_error(err) from None


@transcript.command("list")
def transcript_list() -> None:
    """Every session's transcript, newest first: time, session id, status, path."""
    import time as _time

    from ..ground.text import one_line
    from ..transcript import list_transcripts

    for created, session_id, status, path in list_transcripts():
        when = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(created))
        click.echo(one_line(f"{when}  {session_id}  {status:<10} {path}"))


@click.command()
@click.option(
    "--workspace",
    default=".",
    type=click.Path(exists=True, file_okay=False),
    help="Show the settings a sandbox of this workspace would get.",
)
@click.option("--attack", is_flag=True, help="Also run a quick attack battery against this set-up (Docker or Podman).")
@sandbox_options
def doctor(workspace: str, attack: bool, config: SandboxConfig, mode: WorkspaceMode, copy_limits: CopyLimits) -> None:
    """Check the engine (Docker or Podman) and the image, and print the security settings a sandbox gets."""
    from sandbox_agent import limits

    from ..sandbox.backend import backend_from_config
    from ..workspace import host_code
    from ..workspace.records import resolve_mode

    backend = backend_from_config(config)
    try:
        diagnosis = backend.diagnose(config)
    except OpenAgentsError as err:
        raise setup_error(err) from None
    for status, text in diagnosis.checks:
        click.echo(f"[{status}]{' ' * (5 - len(status))}{text}")
    if not diagnosis.reachable:
        raise click.exceptions.Exit(EXIT_SETUP)
    ok = all(status != "fail" for status, _ in diagnosis.checks)
    config = diagnosis.config
    ws = Path(workspace).resolve()
    decided = host_code.guard(ws, mode, config)  # what a session here does about the host's own code in it
    try:
        mode, user = resolve_mode(ws, decided.mode, config.user)
    except OpenAgentsError as err:
        raise setup_error(err) from None
    git = (
        "every .git present at the start read-only"
        if (ws / ".git").exists()
        else (
            "an empty read-only placeholder at /workspace/.git"
            if mode.value == "copy"
            else "nothing at /workspace/.git (bind mode: a repository planted there is swept)"
        )
    )
    where = "a private copy of " if mode.value == "copy" else ""
    if decided.read_only and mode.value == "bind":
        git += f"; {', '.join(decided.read_only)} read-only (the host's own code: --host-code-read-only)"
    click.echo("\nSecurity settings of a sandbox:")
    rows = [
        (
            "workspace mode",
            mode.value + ("  (nothing reaches the workspace until `oa-sandbox apply`)" if mode.value == "copy" else ""),
        ),
        ("workspace", f"{where}{ws} -> /workspace (read-write); {git}"),
        (
            "write quota",
            f"{config.write_quota >> 20} MiB of growth per session, {_quota_enforced(mode.value)}; "
            "integrity sweep at the end and on every replacement",
        ),
        (
            "network",
            "none"
            if config.egress is None
            else f"internal network + egress proxy allowing {', '.join(config.egress.allow)}"
            f"{f'; {len(config.egress.rules)} rules' if config.egress.rules else ''}"
            + (
                f"; credentials injected for {sorted({c.host for c in config.egress.credentials})}"
                if config.egress.credentials
                else ""
            ),
        ),
        (
            "user",
            user
            + (
                "  (root-owned workspace: the copy belongs to this unprivileged user)"
                if mode.value == "copy" and ws.stat().st_uid == 0
                else ""
            ),
        ),
        *backend.settings_for(diagnosis, ws, user),
        (
            "shell timeout",
            f"{limits.SHELL_DEFAULT_TIMEOUT_S} s default, {limits.SHELL_MAX_TIMEOUT_S} s ceiling, enforced by the host",
        ),
        ("forks", _forks_made_by()),
    ]
    for name, value in rows:
        click.echo(f"  {name:<18} {value}")
    ok &= _host_code_lines(ws, decided)
    from .hooks import doctor_check

    ok &= doctor_check(ws)  # the user's hooks (docs/hooks.md): each program must be able to run
    _mcp_lines(ws)  # the config file's MCP servers: what each would run, and what is refused
    if attack and diagnosis.can_start:
        from .selfcheck import run_checks

        click.echo("\nAttack checks (each a real attempt in a real sandbox):")
        try:
            results = run_checks(config, backend)
        except OpenAgentsError as err:
            raise setup_error(err) from None
        for name, passed, detail in results:
            click.echo(f"  {'PASS' if passed else 'FAIL'}  {name:<28} {detail}")
        failed = sum(not passed for _, passed, _ in results)
        click.echo(f"{len(results) - failed} passed, {failed} failed")
        ok &= failed == 0
        if failed:
            raise click.exceptions.Exit(EXIT_TOOL_ERROR)
    raise click.exceptions.Exit(EXIT_OK if ok else EXIT_SETUP)


@click.command()
@click.option("--all", "all_", is_flag=True, help="Also remove sandboxes whose host process is still alive.")
def gc(all_: bool) -> None:
    """Remove leftover sandbox containers."""
    from ..config import SandboxConfig
    from ..sandbox.backend import backend_from_config

    try:
        removed = backend_from_config(SandboxConfig()).gc(all_)
    except OpenAgentsError as err:
        raise setup_error(err) from None
    click.echo(f"removed {removed} sandbox container{'s' if removed != 1 else ''}")


def _quota_enforced(mode: str) -> str:
    """Whether the file system stops the box at the write quota
    here (workspace/quota_fs.py), or the host only watches it."""
    from ..workspace.quota_fs import unusable

    why = unusable()
    if why is None and mode == "copy":
        return "enforced: the copy lies on a file system of its own that stops writes at the quota (ENOSPC)"
    watched = "watched: measured every 0.1 s, the session stopped past it (the box may write more in between)"
    if why is None:
        return (
            f"{watched}; bind mode writes to your own workspace, which "
            "no file system of ours limits (copy mode enforces it)"
        )
    return f"{watched}; not enforced by a file system: {why}"


def _forks_made_by() -> str:
    """How `fork` and `run --attempts` make a fork's copy here (workspace/cow.py)."""
    from ..workspace.overlay import unusable

    why = unusable()
    if why is None:
        return (
            "copy-on-write: a kernel overlay per fork over the parent's frozen state (no data copied until the fork "
            "writes; a data copy where the engine cannot say that no box still runs on the parent's copy)"
        )
    return f"a data copy per fork (reflinks where the file system has them): {why}"


def _mcp_lines(ws: Path) -> None:
    """`doctor`'s lines on the config file's MCP servers (started on the host by `run`): what each runs,
    found as a session starting now would find it (tools/mcp/launch.py), what is refused or cannot
    run (a server left out: the session goes on), and what the user's PATH or HOME would have given
    it from where the box writes."""
    import shlex

    from ..ground.text import visible
    from ..programs.resolve import WHERE
    from ..tools.mcp.client import McpHost

    try:
        servers = load_defaults().mcp_servers
    except OpenAgentsError as err:
        click.echo(visible(f"[fail] MCP servers: {err.message}"))
        return
    if not servers:
        return
    host = McpHost(servers, workspace=ws)
    for problem in host.problems:
        click.echo(visible(f"[warn] {problem}"))
    launches = host.launches()
    for name, launch in launches.items():
        click.echo(
            visible(
                f"[ok]   MCP server {name!r} runs: {shlex.join(launch.argv)}"
                + (f" (in {launch.cwd})" if launch.cwd else "")
            )
        )
        for note in launch.notes():
            click.echo(visible(f"[warn] MCP server {name!r}: {note}"))
    left = dict.fromkeys(entry for launch in launches.values() for entry, why in launch.search.left_out if why == WHERE)
    for entry in left:
        click.echo(visible(f"[warn] MCP servers run without PATH entry {entry}: {WHERE}"))


def _host_code_lines(ws: Path, decided: Guard) -> bool:
    """`doctor`'s lines on what the host runs or imports from inside the workspace (issue 49); False
    when a session here would be refused."""
    from ..boxfs import show

    if not decided.found:
        click.echo(f"[ok]   nothing this oa-sandbox runs or imports lies inside {show(str(ws))} or the state directory")
        return True
    for item in decided.found:
        where = "the state directory" if item.in_state else "the workspace"
        click.echo(f"[warn] the host runs or imports from inside {where}: {item.line()}  ({show(item.path)})")
    if decided.error is not None:
        click.echo(f"[fail] {show(decided.error.message)}")
        return False
    if decided.note:
        click.echo(f"[warn] {show(decided.note)}")
    elif decided.read_only:
        click.echo(
            f"[ok]   bind mode with {', '.join(show(n) for n in decided.read_only)} "
            "read-only in the box (--host-code-read-only)"
        )
    else:
        click.echo("[ok]   sessions here work on a copy: the box cannot change what the host runs")
    return True
