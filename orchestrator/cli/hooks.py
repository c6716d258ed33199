"""`oa-sandbox hooks`: the hooks in force for a workspace, where
each came from, what each runs, and whether each can run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import OpenAgentsError
from .common import load_defaults, setup_error

if TYPE_CHECKING:
    from ..policy.hook_spec import HookSpec
    from ..programs.resolve import Resolved


@click.command("hooks")
@click.option(
    "--workspace", default=".", type=click.Path(exists=True, file_okay=False), help="The workspace (default: the cwd)."
)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Policy file (repeatable; default: `policy` in the config file), as `run` would take it.",
)
def hooks(workspace: str, policies: tuple[str, ...]) -> None:
    """List the hooks a session started here would run (docs/hooks.md), in order, with their tier and
    file, what each runs (program and interpreter as found at a start, never from the workspace), what
    your PATH would have run from the workspace instead, the secrets each is not given, and the ones
    left out and why; exit 1 if a hook's program cannot run (it would fail closed)."""
    from ..hooks.engine import TIERS, clean
    from .hook_listing import hooks_for, problem

    ws = Path(workspace).resolve()
    try:
        defaults = load_defaults()
        listing = hooks_for(ws, list(policies or defaults.policy), defaults.api_key_env)
    except OpenAgentsError as err:
        raise setup_error(err) from None
    bad = 0
    for hook, resolved in listing.hooks:
        trouble = problem(resolved)
        bad += trouble is not None
        matcher = " ".join(
            f"{k}={v}"
            for k, v in (("matcher", hook.matcher), ("kind", hook.kind), ("command_regex", hook.command_regex))
            if v
        )
        click.echo(
            clean(
                f"{'FAIL' if trouble else 'ok  '} {hook.event:<20} {TIERS.get(hook.tier, '?'):<9} {hook.label()}  "
                f"[{matcher or 'every call'}] timeout {hook.timeout:g}s  from {hook.where}\n     {hook.argv}",
                2000,
            )
        )
        for line in _what_runs(hook, resolved, listing.withheld_from(hook), listing.box_files.get(id(hook), [])):
            click.echo(clean(f"     {line}", 2000))
        if trouble:
            click.echo(clean(f"     cannot run: {trouble}", 2000))
    if listing.hooks:
        click.echo(clean(f"hooks' PATH: {listing.search.value}", 2000))
        for entry, why in listing.search.left_out:
            click.echo(clean(f"PATH entry {entry or '(empty)'} left out: {why}", 2000))
    for line in listing.dropped:
        click.echo(clean(f"not in force: {line}", 2000))
    if not listing.hooks and not listing.dropped:
        click.echo("no hooks")
    if bad:
        raise click.exceptions.Exit(1)


def _what_runs(hook: HookSpec, resolved: Resolved | None, withheld: list[str], box_files: list[str]) -> list[str]:
    """The lines saying what a hook runs, what of the workspace it would have run, and what it is not given."""
    import shlex

    lines = []
    if resolved is None:
        lines.append(
            f"its program {hook.argv[0]} is a workspace file: it runs from a copy pinned at the session's start "
            "(its #! interpreter is checked then)"
        )
    elif not resolved.problem:
        lines.append(f"runs: {shlex.join(resolved.argv)}")
        lines.append(
            f"program {resolved.program}" + (f", interpreter {resolved.interpreter}" if resolved.interpreter else "")
        )
    if resolved is not None:
        lines += [f"not from the workspace: {note}" for note in resolved.notes]
    lines += [
        f"workspace file {path}: runs from a copy pinned at the session's start (trust_workspace_hooks)"
        for path in box_files
    ]
    if withheld:
        lines.append(
            f"withheld: {', '.join(withheld)} (a secret reaches a hook "
            "only named in its `secrets`, in your own or the admin's file)"
        )
    return lines


def doctor_check(ws: Path) -> bool:
    """`doctor`'s lines on the hooks in force here (the config file's policies): False if one cannot
    run. It names what the hooks would have run from the workspace (refused, or left off their PATH)."""
    from ..hooks.engine import clean
    from ..programs.resolve import WHERE
    from .hook_listing import hooks_for, problem

    try:
        defaults = load_defaults()
        listing = hooks_for(ws, list(defaults.policy), defaults.api_key_env)
    except OpenAgentsError as err:
        click.echo(clean(f"[fail] hooks: {err.message}", 2000))
        return False
    troubles = [(hook, problem(resolved)) for hook, resolved in listing.hooks]
    for hook, trouble in troubles:
        if trouble:
            click.echo(clean(f"[fail] hook {hook.label()} ({hook.event}, from {hook.where}): {trouble}", 2000))
    for line in listing.dropped:
        click.echo(clean(f"[warn] hook not in force: {line}", 2000))
    if listing.hooks:
        for entry, why in listing.search.left_out:
            if why == WHERE:
                click.echo(clean(f"[warn] hooks run without PATH entry {entry}: {why}", 2000))
        for hook, resolved in listing.hooks:
            for note in resolved.notes if resolved is not None else ():
                click.echo(clean(f"[warn] hook {hook.label()}: {note}", 2000))
    if listing.hooks and not any(trouble for _, trouble in troubles):
        click.echo(
            f"[ok]   {len(listing.hooks)} hook(s) in force, every program executable (`oa-sandbox hooks` lists them)"
        )
    return not any(trouble for _, trouble in troubles)
