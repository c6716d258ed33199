"""The owner's actions as ordinary declarations: what the program that holds a session (the Python
API, the command line, an MCP client, an editor) asks of it, never a model. Each is a ToolDef like
the model's tools: its arguments validated by `ToolDef.validate`, its call decided by the ladder by
its tool, kind and action (a rule names it `tool = "fork"`, `action = "land"`, or with every edit as
`kind = "edit"`), recorded by the one call pipeline. What runs one lives beside what it acts on,
installed in the session's registry as OwnHostTools (registry.py): changes and apply_changes in
workspace/copy_tools.py, fork in workspace/fork_tool.py, rollback in api/own_calls.py. No model is
told of them, and a model's call of one is an unknown tool."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..ground.forks import MAX_FORKS
from .tooldef import Approval, ToolDef


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ChangesArgs(_Strict):
    stat: bool = False


class ApplyArgs(_Strict):
    """None: the landing takes every change the copy holds."""


class RollbackArgs(_Strict):
    turn: int


class ForkArgs(_Strict):
    n: int = Field(default=1, ge=1, le=MAX_FORKS)
    session_id: str | None = Field(default=None, min_length=1, max_length=200)
    turn: int | None = Field(default=None, ge=0)


def _describe_fork(args: Mapping[str, Any]) -> str:
    which = args.get("session_id")
    return f"fork {'session ' + str(which) if which else 'this session'} into {args.get('n', 1)} new session(s)"


# MCP's `changes` (copy mode): a read of the session's own copy.
CHANGES = ToolDef(
    "changes",
    "read",
    "host",
    ChangesArgs,
    title="The private copy's changes",
    approval=Approval(describe=lambda args: "show the private copy's changes against the real workspace"),
)
# Landing a copy's changes in the real workspace (`oa-sandbox apply`, `run --apply`, ACP's end of a
# turn, MCP's apply_changes): an edit of the user's files, action `land`. Every landing meets the same
# decision (policy/approvals.py ApprovalGate.decide_landing), whichever front-end asks.
LAND = ToolDef(
    "apply_changes",
    "edit",
    "host",
    ApplyArgs,
    title="Land the private copy's changes",
    approval=Approval(describe=lambda args: "land the private copy's changes in the real workspace", action="land"),
)
# The Python API's Sandbox.rollback(): the workspace the box sees put back to a checkpoint, an edit of it.
ROLLBACK = ToolDef(
    "rollback",
    "edit",
    "host",
    RollbackArgs,
    title="Roll the workspace back to a checkpoint",
    approval=Approval(describe=lambda args: f"roll the workspace back to its state after turn {args.get('turn')}"),
)
# MCP's `fork` (copy mode): the session's copy forked into new copy sessions; it reads the copy and
# writes only the sandbox's own state (no box, no workspace).
FORK = ToolDef(
    "fork",
    "read",
    "host",
    ForkArgs,
    title="Fork a copy session",
    reads_checkpoints=True,
    approval=Approval(describe=_describe_fork),
)

OWNER_TOOLS: dict[str, ToolDef] = {tool.name: tool for tool in (CHANGES, LAND, ROLLBACK, FORK)}
