"""`oa-sandbox`: the command line. Exit codes of `run`: 0 finished with no refused call, 3 finished
but a call was refused, 1 stopped (max turns, a loop, a budget, the model API), 2 a usage or set-up
error (no Docker daemon, missing image, bad config), 130 cancelled (Ctrl-C). Other commands: 0 done,
1 a typed tool error, 2 a set-up error."""

from __future__ import annotations

import gc
import logging
from typing import Any

import click

# Every command: its module and attribute, and its help's first paragraph (what `--help` lists). The
# commands are imported only when one is run or its own help asked for, so `oa-sandbox --help` starts
# at once (issue 50); tests/box/test_cli_startup.py holds each line here to the command's own help.
COMMANDS: dict[str, tuple[str, str]] = {
    "image": ("admin:image", "The sandbox image."),
    "exec": (
        "run:exec_",
        "Run one TOOL with JSON_ARGS in a fresh sandbox; print one JSON result (a set-up error too: a script's "
        "json.load never meets an empty stdout).",
    ),
    "run": ("run:run", "Run TASK with a model, tools in the sandbox, approvals by the ladder."),
    "acp": ("servers:acp", "Speak the Agent Client Protocol on stdin/stdout, for editors (Zed and others)."),
    "mcp": (
        "servers:mcp",
        "Serve the six sandboxed tools over MCP stdio (register with Claude Code, Codex, Gemini CLI).",
    ),
    "batch": (
        "servers:batch",
        "Run every task of TASKS.jsonl (id, workspace, task; optional model, policy, max_turns, max_wall, "
        "runtime, attempts and pick), each on its own copy of its workspace; one result line each in --out "
        "(status, exit_code, session_id, patch, left_out, tokens, wall_s, error, node, best_of).",
    ),
    "transcript": ("admin:transcript", "Session transcripts."),
    "doctor": (
        "admin:doctor",
        "Check the engine (Docker or Podman) and the image, and print the security settings a sandbox gets.",
    ),
    "sessions": (
        "sessions:sessions_",
        "List your sessions, newest first, under a header: id, time, mode, status, files changed, workspace.",
    ),
    "changes": ("sessions:changes", "The unified diff of a copy session's changes against the real workspace."),
    "apply": (
        "sessions:apply_",
        "Apply a copy session's changes to the real workspace (a sanitiser: regular files and dirs, normalised "
        "modes, nothing under .git).",
    ),
    "discard": (
        "sessions:discard",
        "Throw a copy session away: its copy, checkpoints, manifest, quarantine and transcript.",
    ),
    "checkpoints": (
        "sessions:checkpoints",
        "A session's checkpoints: turn, files changed, what was not checkpointed; a checkpoint that failed or was"
        " skipped says so (what changed then is unknown).",
    ),
    "rollback": (
        "sessions:rollback",
        "Restore a session's workspace (the copy, or the real one in bind mode) to a checkpoint.",
    ),
    "fork": (
        "fork:fork",
        "Fork an ended copy session into N copy sessions, each with its own copy, record and (when run) box: `run"
        " --resume FORK`, `changes`, `apply`, `discard` work on each; `sessions` names its parent.",
    ),
    "report": (
        "report:report",
        "One self-contained HTML page of a session, for review and audit: summary, every tool call with its "
        "approval and who decided, the gate's egress audit, checkpoints and the final diff.",
    ),
    "gc": ("admin:gc", "Remove leftover sandbox containers."),
    "hooks": (
        "hooks:hooks",
        "List the hooks a session started here would run (docs/hooks.md), in order, with their tier and file, "
        "what each runs (program and interpreter as found at a start, never from the workspace), what your PATH "
        "would have run from the workspace instead, the secrets each is not given, and the ones left out and why;"
        " exit 1 if a hook's program cannot run (it would fail closed).",
    ),
}


class _LazyGroup(click.Group):
    """A group whose commands are imported on first use; its help lists them from COMMANDS."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands or cmd_name not in COMMANDS:
            return self.commands.get(cmd_name)
        import importlib

        module, attr = COMMANDS[cmd_name][0].split(":")
        command = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
        assert isinstance(command, click.Command)
        self.commands[cmd_name] = command
        return command

    def invoke(self, ctx: click.Context) -> Any:
        """The cyclic garbage collector paused while a command starts: its start is imports (hundreds of
        modules, their pydantic models), which make no garbage, and the collector's passes over them were
        ~15% of exec's import CPU (measured; issue 50). main() resumes it for every command but exec, which
        resumes it once its session is open (run.py), with what the start made frozen (never scanned
        again). Restored as it was for an in-process caller (a test's): enabled, nothing left frozen."""
        was = gc.isenabled()
        gc.disable()
        try:
            return super().invoke(ctx)
        finally:
            gc.unfreeze()  # a splice of two lists: nothing is scanned here
            if was:
                gc.enable()

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        no_such = getattr(click.exceptions, "NoSuchCommand", None)  # click >= 8.2: it suggests the closest names
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as err:
            if no_such is None or not isinstance(err, no_such):
                raise
            # "Did you mean ...?" from every command's name, loaded or not (click looks at the loaded ones only)
            raise no_such(err.command_name, possibilities=self.list_commands(ctx), ctx=ctx) from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            loaded = self.commands.get(name)
            if loaded is None:
                loaded = click.Command(name, help=COMMANDS[name][1])
            if loaded.hidden:
                continue
            rows.append((name, loaded.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup)
@click.option("-v", "--verbose", is_flag=True, help="Log what the host does.")
@click.version_option(package_name="openagents-sandbox")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """Run an AI coding agent's tools in a hardened Docker sandbox."""
    if ctx.invoked_subcommand != "exec":  # exec resumes the collector itself, once its session is open
        gc.enable()
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, format="oa-sandbox: %(message)s")
    from ..host_memory import tune_allocator

    tune_allocator()  # a long `acp` server's RSS follows its sessions (host_memory.py)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_OnceFilter())
    _complete_pending_sweeps()


def _complete_pending_sweeps() -> None:
    """Before anything else, every command finishes the integrity sweeps that host processes which
    ended (OOM, SIGKILL, power loss) left journaled (sandbox/sweep_journal.py): their boxes are reaped first,
    so no box of theirs still writes while the sweep runs. Never fatal; one that cannot finish is
    said, and no session starts on that workspace until it does."""
    try:
        if not _journals_exist():
            return  # the usual case, known without importing the sweep's machinery (a command's start stays fast)
        from ..errors import OpenAgentsError
        from ..ground.text import visible
        from ..sandbox import sweep_journal

        if not any(entry.owner_gone() for entry in sweep_journal.pending()):
            return
        try:
            from ..sandbox.docker import docker_client
            from ..sandbox.reaper import reap_leftovers_once

            client = docker_client(timeout=30)
            reap_leftovers_once(client)  # the boxes of owners that are gone, before their sweep
            client.close()
        except OpenAgentsError as err:
            logging.getLogger(__name__).warning(
                "could not reap the boxes of ended sessions before their sweep: %s", err.message
            )
        for entry, report in sweep_journal.complete_gone():
            for line in report.lines():
                click.echo(
                    visible(
                        "oa-sandbox: integrity sweep left by an ended session "
                        f"(pid {entry.owner_pid()}) of {entry.workspace}: {line}"
                    ),
                    err=True,
                )
    except Exception as err:  # noqa: BLE001 - a command is never stopped by another session's leftovers
        logging.getLogger(__name__).warning("could not complete the pending integrity sweeps: %s", str(err)[:300])


def _journals_exist() -> bool:
    """Whether the pending-sweeps directory holds a journal (sandbox/sweep_journal.py reads them)."""
    import os

    from ..state import PENDING_SWEEPS, own_subdir

    try:
        return any(n.endswith(".json") and not n.startswith(".") for n in os.listdir(own_subdir(PENDING_SWEEPS)))
    except FileNotFoundError:
        return False


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
