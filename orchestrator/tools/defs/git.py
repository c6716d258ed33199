"""git: the workspace's repository, on the host, without a git program (docs/tools.md#git; the
implementation is host_git.py)."""

from __future__ import annotations

from typing import Any, Mapping

from ...models.base import parse_arguments
from .. import host_git
from ..tooldef import Approval, Prepared, RunContext, ToolDef

KINDS = {"status": "read", "diff": "read", "log": "read", "commit": "edit"}


def _prepare(raw: Any) -> Prepared:
    args = host_git.parse_args(parse_arguments(raw))
    return Prepared(args, KINDS[args.subcommand], host_git.action(args))


def _action_of(args: Mapping[str, Any]) -> str | None:
    sub = args.get("subcommand")
    return f"git {sub}" if isinstance(sub, str) and sub in KINDS else None


def _run(context: RunContext, args: Any) -> Any:
    assert isinstance(args, host_git.GitArgs)  # _prepare made these
    return host_git.run_git(context.repo, args)


TOOL = ToolDef(
    "git",
    "other",
    "host",
    host_git.GitArgs,
    order=70,
    title="Run git on the host",
    description=(
        "Git on the host for the workspace's repository (no git program runs; hooks, filters and "
        "nested repositories are never used): status and log run at once; diff shows what commit would "
        "record (HEAD to the working tree, new files included; large or binary files summarised); "
        "commit records all changes, or the given paths, and asks the user. There is no push."
    ),
    mutates=True,
    needs_repo=True,
    run=_run,
    approval=Approval(
        describe=lambda args: f"Run on the host: git {args.get('subcommand', '')}".strip(),
        actions={f"git {sub}": kind for sub, kind in KINDS.items()},
        action_of=_action_of,
        prepare=_prepare,
    ),
)
