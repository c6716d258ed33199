"""A path a program gives the API, as the tools' argument: every name a listing gave can be given back.

A name is bytes; in Python it is an `os.fsdecode` string (lone surrogates for bytes that are not
UTF-8, as `os.listdir` and `ListResult.entries` give it) or those bytes. A reading tool takes it as
its text when that is UTF-8, else as {"bytes_b64": ...} (sandbox_agent/names.py); a writing tool
takes text only: a name that is not UTF-8 is made with the shell."""

from __future__ import annotations

import base64
import os
from os import PathLike
from typing import Any

from ..errors import ErrorType
from .results import ToolError


def _name(tool: str, path: Any) -> str:
    if isinstance(path, PathLike):
        path = path.__fspath__()
    if isinstance(path, bytes):
        return os.fsdecode(path)
    if isinstance(path, bool) or not isinstance(path, str):
        raise ToolError(
            ErrorType.INVALID_ARGUMENTS,
            f"{tool}: path must be a str or bytes (relative to the workspace), not {type(path).__name__}",
        )
    return path


def read_path(tool: str, path: Any) -> tuple[str, str | dict[str, str]]:
    """(the name as an os.fsdecode string, the path argument a reading tool takes for it)."""
    name = _name(tool, path)
    try:
        name.encode("utf-8")
        return name, name
    except UnicodeEncodeError:
        pass
    try:
        raw = os.fsencode(name)
    except UnicodeEncodeError:
        raise ToolError(
            ErrorType.INVALID_ARGUMENTS, f"{tool}: path holds a lone surrogate that stands for no byte"
        ) from None
    return name, {"bytes_b64": base64.b64encode(raw).decode("ascii")}


def write_path(tool: str, path: Any) -> str:
    """The path argument a writing tool takes: text only."""
    name = _name(tool, path)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolError(
            ErrorType.INVALID_ARGUMENTS,
            f"{tool}: a name whose bytes are not UTF-8 can be read, listed and searched, "
            "not written by this tool; make it with shell",
        ) from None
    return name
