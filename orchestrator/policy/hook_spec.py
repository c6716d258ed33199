"""The `[[hooks]]` tables of a policy file, and which hooks are in force.

A hook names its event, what it matches, the command (an argv list, or a string split like a shell
would split words, never run by a shell), a timeout and an order. Tiers: the admin's file, the
user's files, the workspace's own (.openagents/policy.*, or any file lying where a box can write).
No file removes or weakens another's hook: hooks only add, every matching hook runs, and one that
blocks decides. A workspace file's hooks run nothing unless a user or admin file says
`trust_workspace_hooks = true`; a command naming a file where the box can write is workspace
content too (the box could rewrite it), under the same trust.
"""

from __future__ import annotations

import os
import re
import shlex
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator

from ..programs.reach import reaches
from ..tools.tooldef import KINDS

EVENTS = (
    "BeforeTool",
    "AfterTool",
    "BeforeModel",
    "AfterModel",
    "BeforeToolSelection",
    "BeforeAgent",
    "AfterAgent",
    "SessionStart",
    "SessionEnd",
    "PreCompress",
    "Notification",
)
BEFORE = frozenset(
    {"BeforeTool", "BeforeModel", "BeforeToolSelection", "BeforeAgent"}
)  # a failed hook here fails closed
DEFAULT_TIMEOUT_S = 60.0

# What each event's matcher is matched against: a tool call's name (and its kind and command), or
# the event's trigger (hooks.fire's `trigger`). The other events have nothing to match.
TOOL_EVENTS = frozenset({"BeforeTool", "AfterTool"})
TRIGGER_EVENTS = frozenset({"SessionStart", "SessionEnd", "PreCompress", "Notification"})
EVERY_WORD = "*"


def means_every(value: str | None) -> bool:
    """A policy key left out, empty or "*" filters nothing: every tool, kind, command, trigger. The
    one meaning of the word, in a hook's filters and a rule's keys alike."""
    return value is None or value.strip() in ("", EVERY_WORD)


_FILTERS = ("matcher", "kind", "command_regex")


@lru_cache(maxsize=1024)
def filter_test(event: str, key: str, value: str | None) -> re.Pattern[str] | str | None:
    """The one reading of a hook's filter (`matcher`, `kind` or `command_regex`) on `event`, which
    the validator and `HookSpec.matches` both use: None when it filters nothing (left out, "" or
    "*"); else a compiled regex (matcher: matched whole against the tool's name on tool events, the
    trigger on trigger events; command_regex: searched in a shell call's command) or the kind itself.
    ValueError, with a message that never quotes the value, for one that could never mean anything."""
    if means_every(value):
        return None
    assert value is not None
    if key == "matcher" and event not in TOOL_EVENTS | TRIGGER_EVENTS:
        raise ValueError(f"{event} has nothing to match (no tool, no trigger): leave matcher out, or write '*'")
    if key != "matcher" and event not in TOOL_EVENTS:
        raise ValueError(f"{key} applies to tool calls only (BeforeTool, AfterTool), not to {event}: leave it out")
    if key == "kind":
        if value not in KINDS:
            raise ValueError(f"must be one of {', '.join(KINDS)}, or '*'")
        return value
    try:
        return re.compile(value)
    except (re.error, RecursionError, OverflowError):
        what = (
            (
                "a regular expression the tool's name matches whole (e.g. 'write_file|edit_file', 'mcp__github__.*')"
                if event in TOOL_EVENTS
                else "a regular expression the trigger matches whole (e.g. 'startup|resume')"
            )
            if key == "matcher"
            else "a regular expression searched in a shell call's command"
        )
        raise ValueError(f"must be {what}, or '*' (every)") from None


class HookSpec(BaseModel):
    """One `[[hooks]]` table. `matcher`: a regex the tool's name must match whole (tool events) or
    the trigger must match whole (SessionStart: startup, resume; SessionEnd: the session's status;
    Notification: ToolPermission; PreCompress: auto); `kind`: the call's ACP kind; `command_regex`:
    searched in a shell call's command. Each filter left out, "" or "*" filters nothing (filter_test
    is the one reading). `env`: host variables passed on by name, never a secret (the model's key, a
    variable an [[egress.credentials]] rule reads); `secrets`: the secrets passed on, each by its own
    name, honoured from a user or admin file only (`pass_model_key`: the model's key)."""

    model_config = ConfigDict(extra="forbid")
    id: str | None = Field(default=None, max_length=200)
    event: str = Field(max_length=40)
    matcher: str | None = Field(default=None, max_length=1000)
    kind: str | None = Field(default=None, max_length=100)
    command_regex: str | None = Field(default=None, max_length=1000)
    command: list[str] | str
    timeout: float = Field(default=DEFAULT_TIMEOUT_S, gt=0, le=3600)
    order: int = 0
    env: list[str] = Field(default_factory=list, max_length=64)
    secrets: list[str] = Field(default_factory=list, max_length=16)
    pass_model_key: bool = False
    _tier: int = PrivateAttr(default=2)  # ladder.Tier's value (spec.py does not import the ladder)
    _where: str = PrivateAttr(default="")
    _position: int = PrivateAttr(default=0)

    @field_validator("event")
    @classmethod
    def _known_event(cls, value: str) -> str:
        if value not in EVENTS:
            raise ValueError("must be one of " + ", ".join(EVENTS))
        return value

    @field_validator(*_FILTERS)
    @classmethod
    def _filter(cls, value: str | None, info: ValidationInfo) -> str | None:
        event = info.data.get("event")
        if event is not None:  # else the event's own error says what is wrong
            filter_test(event, str(info.field_name), value)
        return value

    @field_validator("command")
    @classmethod
    def _argv(cls, value: list[str] | str) -> list[str] | str:
        argv = split(value)
        if not argv or not argv[0] or len(argv) > 256 or any(len(a) > 4096 or "\x00" in a for a in argv):
            raise ValueError(
                "must be a non-empty argv list (or a string of words), at most 256 words of 4096 characters"
            )
        return value

    @field_validator("env", "secrets")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        if any(not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", name) for name in value):
            raise ValueError("must list environment variable names")
        return value

    @property
    def argv(self) -> list[str]:
        return split(self.command)

    @property
    def tier(self) -> int:
        return self._tier

    @property
    def where(self) -> str:
        return self._where

    def label(self) -> str:
        return self.id or f"{self.event} hook {self._position} of {self._where or 'a policy'}"

    def placed(self, tier: int, where: str, position: int) -> "HookSpec":
        hook = self.model_copy()
        hook._tier, hook._where, hook._position = tier, where, position
        return hook

    def matches(
        self, tool: str | None = None, kind: str | None = None, command: str | None = None, trigger: str | None = None
    ) -> bool:
        """Whether this hook runs for a call (tool events: its name, kind, command) or a trigger, by
        filter_test's reading of each filter: the same the validator accepted."""
        name = filter_test(self.event, "matcher", self.matcher)
        if isinstance(name, re.Pattern):
            subject = tool if self.event in TOOL_EVENTS else trigger
            if subject is None or not name.fullmatch(subject):
                return False
        wanted = filter_test(self.event, "kind", self.kind)
        if wanted is not None and wanted != kind:
            return False
        searched = filter_test(self.event, "command_regex", self.command_regex)
        if isinstance(searched, re.Pattern) and (command is None or not searched.search(command)):
            return False
        return True


def split(command: list[str] | str) -> list[str]:
    if isinstance(command, list):
        return list(command)
    try:
        return shlex.split(command)
    except ValueError:
        return []


def box_words(hook: HookSpec, workspace: Path, roots: list[Path]) -> list[tuple[int, Path]]:
    """The words of the command that name a file where a box can write, each with its path: an
    absolute word the box could change (programs/reach.py: under a box root as spelt, at a link on
    its way or where it ends), whether or not the file exists yet (the box may make it later, or replace a
    link that pointed out); a bare program name the host's own PATH lacks (programs/resolve.py
    search_path) that the user's PATH finds there; a relative word naming a file the workspace holds now
    (the user meant it: it runs from its pinned copy, or not at all). A relative word naming nothing there
    stays harmless: a hook runs in an empty directory of its own (hooks/run.py), never in the workspace.
    What a shell's `-c` string names is not looked into: keep a hook's scripts outside the workspace."""
    found: list[tuple[int, Path]] = []
    memo: dict[str, str | None] = {}
    for index, word in enumerate(hook.argv):
        if not word or word.startswith("-"):
            continue
        if index == 0 and "/" not in word:
            program = _which(word, roots)
            if program is None:
                continue
            path = Path(program)
        elif os.path.isabs(word):
            path = Path(word)
        elif os.path.lexists(workspace / word):
            path = workspace / word
        else:
            continue
        if reaches(os.path.abspath(path), roots, memo):
            found.append((index, path))
    return found


def names_box_file(hook: HookSpec, workspace: Path, roots: list[Path]) -> str | None:
    words = box_words(hook, workspace, roots)
    return hook.argv[words[0][0]] if words else None


def with_argv(hook: HookSpec, argv: list[str]) -> HookSpec:
    placed = hook.model_copy(update={"command": argv})
    placed._tier, placed._where, placed._position = hook._tier, hook._where, hook._position
    return placed


def _which(name: str, roots: list[Path]) -> str | None:
    """Where a bare program name is the box's: found only where the box can write (a name the hook's
    PATH finds is the host's own, whatever the user's PATH has first)."""
    from ..programs.resolve import found_inside, search_path, which

    if which(name, search_path(roots)) is not None:
        return None
    return found_inside(name, roots)


def in_force(
    specs: list[HookSpec], trusted: bool, workspace: Path, roots: list[Path]
) -> tuple[list[HookSpec], list[str]]:
    """The hooks that run, in order (admin's, then the user's, then the workspace's; by `order`,
    then as written), and one line for each left out and why."""
    kept: list[HookSpec] = []
    dropped: list[str] = []
    for hook in specs:
        reach = names_box_file(hook, workspace, roots)
        if hook.tier <= 1 and not trusted:
            dropped.append(
                f"{hook.label()}: a workspace file's hook runs nothing on the "
                "host unless a user policy says trust_workspace_hooks = true"
            )
        elif reach is not None and not trusted:
            dropped.append(
                f"{hook.label()}: its command names {reach!r}, where the sandbox can write; "
                "runs only with trust_workspace_hooks = true"
            )
        else:
            kept.append(hook)
    kept.sort(key=lambda h: (-h.tier, h.order))  # stable: files in the order read, hooks as written
    return kept, dropped


def describe(hook: HookSpec) -> dict[str, Any]:
    return {"id": hook.label(), "event": hook.event, "tier": hook.tier, "from": hook.where, "command": hook.argv[:8]}


class Collected:
    """The `[[hooks]]` of every policy file read at a session's start (SessionPolicy.hook_specs, policy/value.py)."""

    def __init__(self) -> None:
        self.specs: list[HookSpec] = []
        self.trusted = False  # a user or admin file said trust_workspace_hooks = true
        self.dropped: list[str] = []
