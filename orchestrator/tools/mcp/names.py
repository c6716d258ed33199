"""The names an MCP server's tools get here (`mcp__<server>__<tool>`) and the policy keys that name
them (`tool = "mcp__github__create_issue"`, `action = "mcp github"`): one definition for the client
that makes the names and the policy loader that checks a rule could ever match one."""

from __future__ import annotations

import re

PREFIX = "mcp__"
ACTION_PREFIX = "mcp "
MAX_NAME = 64  # OpenAI's and Gemini's limit on a function name
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_SAFE = re.compile(r"[A-Za-z0-9_-]+")


def safe(text: str) -> str:
    """A server's or a tool's own name, as a model accepts it in a function name."""
    return _UNSAFE.sub("_", text)


def tool_name(server_key: str, tool: str) -> str:
    """The name a model sees for a server's tool (cut at MAX_NAME)."""
    return (PREFIX + server_key + "__" + safe(tool))[:MAX_NAME]


def action(server_key: str) -> str:
    """The policy action that names every tool of one server."""
    return ACTION_PREFIX + server_key


def could_be_tool_name(value: str) -> bool:
    """Whether tool_name can give `value` for some server and tool: a rule naming anything else
    (a glob, a space, a server alone) would match nothing."""
    rest = value[len(PREFIX) :]
    return (
        value.startswith(PREFIX)
        and len(value) <= MAX_NAME
        and bool(_SAFE.fullmatch(rest))
        and ("__" in rest[1:] or len(value) == MAX_NAME)
    )


def could_be_action(value: str) -> bool:
    """Whether action() can give `value` for some server (a server's name is 1 to 64 characters)."""
    key = value[len(ACTION_PREFIX) :]
    return value.startswith(ACTION_PREFIX) and 1 <= len(key) <= 64 and bool(_SAFE.fullmatch(key))
