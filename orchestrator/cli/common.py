"""What every command of the CLI shares: set-up errors said in one line (and carried for `--output
json`), the signal handling that lets clean-up run to its end, the config file's defaults, and the
sandbox's flags."""

from __future__ import annotations

import functools
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

import click

from ..errors import ErrorType, OpenAgentsError
from ..ground.exit_codes import EXIT_SETUP, EXIT_STOPPED

if TYPE_CHECKING:
    from ..config import SandboxConfig
    from ..workspace.copy import CopyLimits, CopyProgress
    from .user_config import UserConfig

EXIT_TOOL_ERROR = EXIT_STOPPED


class SetupExit(click.exceptions.Exit):
    """A set-up error, said on stderr in one line; it carries the typed error for `--output json`."""

    def __init__(self, error: OpenAgentsError, code: int = EXIT_SETUP) -> None:
        super().__init__(code)
        self.error = error


def setup_error(err: OpenAgentsError) -> SetupExit:
    from ..ground.text import visible

    click.echo(visible(f"oa-sandbox: {err.type.value}: {err.message}"), err=True)  # messages may name box paths
    return SetupExit(err)


# A closed terminal (SIGHUP) ends a command as SIGTERM does: unwound, its box removed (issue 16).
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def terminate_as_interrupt() -> None:
    """SIGTERM and SIGHUP unwind like Ctrl-C, so context managers remove their containers."""
    for signum in ENDING_SIGNALS:
        signal.signal(signum, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))


def interrupt_once() -> None:
    """The first Ctrl-C (or SIGTERM, SIGHUP) unwinds the session as a KeyboardInterrupt; from then on
    all are ignored, so the clean-up that follows (killing the call, removing the container, the
    sweep) runs to its end however often the key is pressed."""

    def first(*_: object) -> None:
        ignore_interrupts()
        raise KeyboardInterrupt()

    for signum in (signal.SIGINT, *ENDING_SIGNALS):
        signal.signal(signum, first)


def ignore_interrupts() -> None:
    for signum in (signal.SIGINT, *ENDING_SIGNALS):
        signal.signal(signum, signal.SIG_IGN)


def load_defaults(workspace: str | Path | None = None) -> UserConfig:
    """The user's config file. Its keys are authority (the model endpoint, the key variable, policy
    files, MCP servers started on the host), so a file the box can reach (inside `workspace` or the
    state directory, as when the workspace is $HOME) is refused, never read: a box that rewrote it
    would otherwise choose the next session's endpoint or host commands."""
    from ..policy.pins import box_roots, inside
    from ..state import config_path
    from .user_config import load_user_config

    try:
        path = config_path()
        if workspace is not None and path.exists() and inside(path, box_roots(Path(workspace))):
            raise OpenAgentsError(
                ErrorType.CONFIG_INVALID,
                f"config {path} lies where the sandbox can write (inside the workspace "
                "or the state directory), so it is not trusted: move it (XDG_CONFIG_HOME) or "
                "choose another workspace",
            )
        return load_user_config()
    except OpenAgentsError as err:
        raise setup_error(err) from None


def sandbox_options(fn: Callable[..., None]) -> Callable[..., None]:
    """The sandbox's knobs, shared by every command that starts one; the command gets `config`."""
    options = [
        click.option("--image", default=None, help="Sandbox image (default openagents-sandbox:latest)."),
        click.option("--memory", default=None, help="Memory limit, e.g. 1g."),
        click.option("--pids", type=int, default=None, help="Most processes in the box."),
        click.option("--cpus", type=float, default=None, help="CPU share, e.g. 1.5."),
        click.option(
            "--env",
            "env",
            multiple=True,
            metavar="NAME=VALUE",
            help="An explicit extra variable for the box (repeatable).",
        ),
        click.option("--runtime", default=None, help="Docker runtime, e.g. runsc (gVisor)."),
        click.option(
            "--engine",
            type=click.Choice(["docker", "podman"]),
            default=None,
            help="Who runs the boxes (default: OA_ENGINE, else Docker if its daemon answers, else Podman).",
        ),
        click.option(
            "--user", default=None, metavar="UID:GID", help="Run the box as this user (default: the workspace owner)."
        ),
        click.option(
            "--egress",
            default=None,
            metavar="allow:HOST[,HOST...]",
            help="Opt-in egress through the allow-listing proxy (default: no network).",
        ),
        click.option(
            "--write-quota",
            default=None,
            metavar="SIZE",
            help="How much the session may grow the workspace, e.g. 4g (default), 500m.",
        ),
        click.option(
            "--entry-quota",
            type=click.IntRange(100),
            default=None,
            metavar="N",
            help="How many new files, directories and links the session may create in the workspace (default 200000).",
        ),
        click.option(
            "--start-concurrency",
            type=click.IntRange(1, 256),
            default=None,
            metavar="N",
            help="Sandbox starts this process runs at once; the rest wait in "
            "line, shown as they wait (default 4, OA_START_CONCURRENCY).",
        ),
        click.option(
            "--workspace-mode",
            type=click.Choice(["auto", "bind", "copy"]),
            default="auto",
            show_default=True,
            help="bind: the box writes the workspace; copy: it works on a private copy you review and apply; "
            "auto: copy for a root-owned workspace, else bind.",
        ),
        click.option(
            "--host-code-read-only",
            is_flag=True,
            default=False,
            help="Bind mode although the workspace holds what oa-sandbox itself runs or imports (its virtualenv, "
            "an editable clone): those entries are mounted read-only in the box. Without it such a workspace "
            "is worked on as a copy (auto), and bind mode is refused (host_code_read_only in config.toml).",
        ),
        click.option(
            "--copy-max-bytes",
            default=None,
            metavar="SIZE",
            help="Copy mode: refuse, before copying anything, a workspace holding "
            "more data than this (default 2g; copy_max_bytes in config.toml).",
        ),
        click.option(
            "--copy-max-entries",
            type=click.IntRange(1, None),
            default=None,
            metavar="N",
            help="Copy mode: refuse, before copying anything, a workspace of more "
            "entries than this (default 200000; copy_max_entries in config.toml).",
        ),
    ]

    @functools.wraps(fn)
    def wrapper(
        *args: Any,
        image: str | None,
        memory: str | None,
        pids: int | None,
        cpus: float | None,
        env: tuple[str, ...],
        runtime: str | None,
        user: str | None,
        egress: str | None,
        write_quota: str | None,
        start_concurrency: int | None,
        workspace_mode: str,
        entry_quota: int | None = None,
        copy_max_bytes: str | None = None,
        copy_max_entries: int | None = None,
        host_code_read_only: bool = False,
        engine: str | None = None,
        **kwargs: Any,
    ) -> None:
        from ..workspace.copy import CopyLimits
        from ..workspace.records import WorkspaceMode

        defaults = load_defaults(kwargs.get("workspace"))  # the config file's values; a flag given wins
        config = build_config(
            image or defaults.image,
            memory or defaults.memory,
            pids or defaults.pids,
            cpus or defaults.cpus,
            env,
            runtime or defaults.runtime,
            user,
            egress,
            write_quota,
            start_concurrency or defaults.start_concurrency,
            entry_quota,
            host_code_read_only or bool(defaults.host_code_read_only),
            engine=engine or defaults.engine,
        )
        limits = CopyLimits()
        max_bytes = copy_max_bytes or defaults.copy_max_bytes
        if max_bytes is not None:
            limits = CopyLimits(
                max_bytes=parse_size(str(max_bytes), "--copy-max-bytes"), max_entries=limits.max_entries
            )
        if copy_max_entries or defaults.copy_max_entries:
            limits = CopyLimits(
                max_bytes=limits.max_bytes, max_entries=copy_max_entries or defaults.copy_max_entries or 0
            )
        return fn(*args, config=config, mode=WorkspaceMode(workspace_mode), copy_limits=limits, **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def build_config(
    image: str | None,
    memory: str | None,
    pids: int | None,
    cpus: float | None,
    env: Iterable[str],
    runtime: str | None,
    user: str | None,
    egress: str | None = None,
    write_quota: str | None = None,
    start_concurrency: int | None = None,
    entry_quota: int | None = None,
    host_code_read_only: bool = False,
    *,
    engine: str | None = None,
) -> SandboxConfig:
    values: dict[str, Any] = {
        k: v
        for k, v in dict(
            image=image,
            memory=memory,
            pids=pids,
            cpus=cpus,
            runtime=runtime,
            engine=engine,
            user=user,
            start_concurrency=start_concurrency,
            entry_quota=entry_quota,
        ).items()
        if v is not None
    }
    if host_code_read_only:
        values["host_code_read_only"] = True
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
    from ..config import SandboxConfig

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


def copy_options(limits: CopyLimits) -> dict[str, Any]:
    """Copy mode's size guard (--copy-max-bytes, --copy-max-entries, a progress line) as the API's
    SandboxOptions fields."""
    return {
        "copy_max_bytes": limits.max_bytes,
        "copy_max_entries": limits.max_entries,
        "on_copy_progress": limits.progress,
    }


def copy_progress(limits: CopyLimits) -> CopyLimits:
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
        click.echo(
            f"\r\x1b[K⧗ copying the workspace for copy mode: {p.entries:,}{of} "
            f"entries, {p.bytes / (1 << 20):.0f} MiB written, {p.elapsed_s:.0f} s",
            nl=False,
            err=True,
        )

    return dataclasses.replace(limits, progress=progress)


def new_transcript_path(text: str | None) -> Path | None:
    """--transcript: a new file that can be written. An existing file is refused, never appended to
    (two sessions' events in one file read as one session); one that cannot be created is a set-up
    error now, not a traceback once the box has started."""
    import errno
    import os

    from ..boxfs.private import create_private

    if text is None:
        return None
    path = Path(text).expanduser().absolute()
    if os.path.lexists(path):
        raise OpenAgentsError(
            ErrorType.INVALID_ARGUMENTS,
            f"--transcript {path} exists: a transcript is never appended to; name a new file (or remove that one)",
        )
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise NotADirectoryError(errno.ENOTDIR, f"{path.parent} is not a directory") from None
        fd = create_private(path)
    except OSError as err:
        kind = {
            errno.EACCES: ErrorType.PERMISSION_DENIED,
            errno.EPERM: ErrorType.PERMISSION_DENIED,
            errno.EROFS: ErrorType.PERMISSION_DENIED,
            errno.ENOTDIR: ErrorType.NOT_A_DIRECTORY,
            errno.EISDIR: ErrorType.IS_DIRECTORY,
            errno.EEXIST: ErrorType.INVALID_ARGUMENTS,
        }
        raise OpenAgentsError(
            kind.get(err.errno or 0, ErrorType.IO_ERROR),
            f"--transcript {path}: cannot be written: {err.strerror or err}",
        ) from None
    os.close(fd)
    os.unlink(path)  # made again by the session; a set-up error before then leaves nothing behind
    return path
