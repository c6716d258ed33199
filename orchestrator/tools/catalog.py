"""Every built-in tool, found in tools/defs/ (one module per tool, each with its `TOOL`), and the
lists derived from them. Nothing here names a tool."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from . import defs
from .owner import CHANGES, FORK, LAND, ROLLBACK
from .tooldef import ToolDef


def _discover() -> dict[str, ToolDef]:
    found: list[ToolDef] = []
    for info in pkgutil.iter_modules(defs.__path__):
        module = importlib.import_module(f"{defs.__name__}.{info.name}")
        tool = getattr(module, "TOOL", None)
        if not isinstance(tool, ToolDef):
            raise TypeError(f"{module.__name__} defines no TOOL (a ToolDef)")
        found.append(tool)
    found.sort(key=lambda t: (t.order, t.name))
    names = [t.name for t in found]
    if len(set(names)) != len(names):
        raise TypeError(f"two tools share a name: {names}")
    return {t.name: t for t in found}


TOOLS: dict[str, ToolDef] = _discover()


def get(name: str) -> ToolDef | None:
    return TOOLS.get(name)


def mcp_tools() -> list[ToolDef]:
    return [t for t in TOOLS.values() if t.mcp.served]


def mutating() -> frozenset[str]:
    return frozenset(t.name for t in TOOLS.values() if t.mutates)


def reads_only(tool: str) -> bool:
    """A tool that changes no workspace file and leaves no process behind (its declaration says):
    `oa-sandbox exec` gives it a box whose workspace is mounted read-only, and the box's removal is
    asked of the daemon, not waited for (sandbox/handoff.py)."""
    tool_def = TOOLS.get(tool)
    if tool_def is None or tool in mutating():
        return False
    return not (tool_def.box.writes or tool_def.box.spawns)


def path_tools() -> frozenset[str]:
    return frozenset(t.name for t in TOOLS.values() if t.files.path_arg)


def file_replacing() -> frozenset[str]:
    return frozenset(t.name for t in TOOLS.values() if t.files.replaces_file)


def file_reader() -> ToolDef:
    return next(t for t in TOOLS.values() if t.files.reads_file)


def actions() -> list[str]:
    """Every key a policy rule's `action` can name: each tool's name, and each action of a multi-action tool."""
    return sorted({*TOOLS, *(a for t in TOOLS.values() for a in t.approval.actions)})


def call_title(tool: str, arguments: Any) -> str:
    """One line a person reads: the terminal prompt, the editor's tool call and its permission request.
    Takes raw arguments too (the editor is told of a call before it is validated)."""
    known = TOOLS.get(tool)
    return (known or ToolDef(tool, "other", "host")).call_title(arguments)


def announced_kind(tool: str, arguments: Any) -> str:
    known = TOOLS.get(tool)
    return known.announced_kind(arguments) if known is not None else "other"


# The owner's actions (owner.py), by the keys a policy rule names them with: tool, kind, action.
LAND_TOOL, LAND_KIND, LAND_ACTION = LAND.name, LAND.kind, LAND.approval.action
CHANGES_TOOL, CHANGES_KIND, CHANGES_ACTION = CHANGES.name, CHANGES.kind, CHANGES.name
ROLLBACK_TOOL, ROLLBACK_KIND, ROLLBACK_ACTION = ROLLBACK.name, ROLLBACK.kind, ROLLBACK.name
FORK_TOOL, FORK_KIND, FORK_ACTION = FORK.name, FORK.kind, FORK.name

# The Python API's bytes in and out of the box (Sandbox.read_bytes / write_bytes, upload, download):
# host tools of the program's own, named in a rule as `tool = "read_bytes"` (a read) or
# `tool = "write_bytes"` (an edit: or any rule on `kind = "edit"`).
READ_BYTES_TOOL, WRITE_BYTES_TOOL = "read_bytes", "write_bytes"

# The Python API's background processes (Sandbox.start, its Process): host tools of the program's
# own, named in a rule by these names (process_start is an execute, with its command for prefixes).
PROCESS_TOOLS = ("process_start", "process_read", "process_write", "process_wait", "process_kill", "process_list")
