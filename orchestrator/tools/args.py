"""Validating a call's arguments by tool name: the tool's declaration (tools/defs/, tooldef.py
`ToolDef.validate`) over the shared parsing of argbase.py."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from ..errors import ErrorType, OpenAgentsError
from ..models.base import MAX_RAW_ARGUMENT_BYTES, parse_arguments
from . import catalog
from .argbase import MAX_PATH_CHARS

__all__ = ["ARGS_MODELS", "MAX_PATH_CHARS", "MAX_RAW_ARGUMENT_BYTES", "parse_arguments", "validate_arguments"]

# The tools whose arguments are one model (the sandbox tools); a multi-action tool validates in its own prepare.
ARGS_MODELS: dict[str, type[BaseModel]] = {
    t.name: t.args for t in catalog.TOOLS.values() if t.args is not None and t.approval.prepare is None
}


def validate_arguments(tool: str, raw: str | bytes | dict[str, Any] | None) -> BaseModel:
    if tool not in ARGS_MODELS:
        raise OpenAgentsError(ErrorType.UNKNOWN_TOOL, f"unknown tool {tool!r}; the tools are {', '.join(ARGS_MODELS)}")
    return catalog.TOOLS[tool].validate(raw).args
