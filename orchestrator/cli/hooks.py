"""`oa-sandbox hooks`: the hooks in force for a workspace, where each came from, and whether each can run."""
from __future__ import annotations

from pathlib import Path

import click

from ..errors import OpenAgentsError
from .common import load_defaults, setup_error


@click.command("hooks")
@click.option("--workspace", default=".", type=click.Path(exists=True, file_okay=False), help="The workspace (default: the cwd).")
@click.option("--policy", "policies", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Policy file (repeatable; default: `policy` in the config file), as `run` would take it.")
def hooks(workspace: str, policies: tuple[str, ...]) -> None:
    """List the hooks a session started here would run (docs/hooks.md), in order, with their tier and
    file, and the ones left out and why; exit 1 if a hook's program cannot run (it would fail closed)."""
    from ..hooks.engine import TIERS, clean
    from .hook_listing import hooks_for, problem

    ws = Path(workspace).resolve()
    try:
        specs, dropped = hooks_for(ws, list(policies or load_defaults().policy))
    except OpenAgentsError as err:
        raise setup_error(err) from None
    bad = 0
    for hook in specs:
        trouble = problem(hook, ws)
        bad += trouble is not None
        matcher = " ".join(f"{k}={v}" for k, v in (("matcher", hook.matcher), ("kind", hook.kind), ("command_regex", hook.command_regex)) if v)
        click.echo(clean(f"{'FAIL' if trouble else 'ok  '} {hook.event:<20} {TIERS.get(hook.tier, '?'):<9} {hook.label()}  "
                         f"[{matcher or 'every call'}] timeout {hook.timeout:g}s  from {hook.where}\n     {hook.argv}"
                         + (f"\n     cannot run: {trouble}" if trouble else ""), 2000))
    for line in dropped:
        click.echo(clean(f"not in force: {line}", 2000))
    if not specs and not dropped:
        click.echo("no hooks")
    if bad:
        raise click.exceptions.Exit(1)


def doctor_check(ws: Path) -> bool:
    """`doctor`'s lines on the hooks in force here (the config file's policies): False if one cannot run."""
    from ..hooks.engine import clean
    from .hook_listing import hooks_for, problem

    try:
        specs, dropped = hooks_for(ws, list(load_defaults().policy))
    except OpenAgentsError as err:
        click.echo(clean(f"[fail] hooks: {err.message}", 2000))
        return False
    troubles = [(hook, problem(hook, ws)) for hook in specs]
    for hook, trouble in troubles:
        if trouble:
            click.echo(clean(f"[fail] hook {hook.label()} ({hook.event}, from {hook.where}): {trouble}", 2000))
    for line in dropped:
        click.echo(clean(f"[warn] hook not in force: {line}", 2000))
    if specs and not any(trouble for _, trouble in troubles):
        click.echo(f"[ok]   {len(specs)} hook(s) in force, every program executable (`oa-sandbox hooks` lists them)")
    return not any(trouble for _, trouble in troubles)
