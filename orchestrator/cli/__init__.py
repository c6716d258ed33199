"""`oa-sandbox`: the command line. Exit codes of `run`: 0 finished with no refused call, 3 finished
but a call was refused, 1 stopped (max turns, a loop, a budget, the model API), 2 a usage or set-up
error (no Docker daemon, missing image, bad config), 130 cancelled (Ctrl-C). Other commands: 0 done,
1 a typed tool error, 2 a set-up error."""
from __future__ import annotations

import logging

import click

from ..errors import OpenAgentsError
from .admin import doctor, gc, image, transcript
from .fork import fork
from .hooks import hooks
from .report import report
from .run import exec_, run
from .servers import acp, batch, mcp
from .sessions import apply_, changes, checkpoints, discard, rollback, sessions_


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
    ended (OOM, SIGKILL, power loss) left journaled (sandbox/sweep_journal.py): their boxes are reaped first,
    so no box of theirs still writes while the sweep runs. Never fatal; one that cannot finish is
    said, and no session starts on that workspace until it does."""
    from ..ground.text import visible
    from ..sandbox import sweep_journal

    try:
        if not any(entry.owner_gone() for entry in sweep_journal.pending()):
            return
        try:
            from ..sandbox.docker import docker_client
            from ..sandbox.reaper import reap_leftovers_once

            client = docker_client(timeout=30)
            reap_leftovers_once(client)  # the boxes of owners that are gone, before their sweep
            client.close()
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


for command in (image, exec_, run, acp, mcp, batch, transcript, doctor, sessions_, changes, apply_, discard, checkpoints, rollback, fork, report, gc, hooks):
    main.add_command(command)
