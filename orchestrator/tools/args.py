"""Argument models for the six sandbox tools. Arguments come from the model and are untrusted:
strict types, no extra fields, bounded sizes. The host's lexical path check runs here too, so a
bad path never reaches the box.
"""
from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sandbox_agent import jsonbound, limits
from sandbox_agent.paths import PathRefused, check_lexical

from ..errors import ErrorType, OpenAgentsError

MAX_PATH_CHARS = 4096
MAX_RAW_ARGUMENT_BYTES = limits.WRITE_MAX_BYTES + 64 * 1024


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    mutation: ClassVar[bool] = False


class _PathArgs(_Args):
    path: str = Field(max_length=MAX_PATH_CHARS, description="Path relative to the workspace root.")

    @field_validator("path")
    @classmethod
    def _lexical(cls, value: str) -> str:
        try:
            check_lexical(value, mutation=cls.mutation)
        except PathRefused as err:
            raise _PathError(err.kind, str(err)) from None
        return value


class _PathError(ValueError):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class ReadFileArgs(_PathArgs):
    offset: int = Field(default=1, ge=1, le=10_000_000, description="First line to read, 1-based.")
    limit: int = Field(default=limits.READ_DEFAULT_LIMIT_LINES, ge=1, le=1_000_000, description="Most lines to read.")


class ListFilesArgs(_PathArgs):
    path: str = Field(default=".", max_length=MAX_PATH_CHARS, description="Directory relative to the workspace root.")
    recursive: bool = Field(default=True, description="List subdirectories too.")


class GrepFilesArgs(_PathArgs):
    pattern: str = Field(min_length=1, max_length=2000, description="Python regular expression.")
    path: str = Field(default=".", max_length=MAX_PATH_CHARS, description="File or directory to search.")
    glob: str | None = Field(default=None, max_length=512, description="Only files whose name matches, e.g. '*.py'.")
    ignore_case: bool = False


class WriteFileArgs(_PathArgs):
    mutation: ClassVar[bool] = True
    content: str = Field(max_length=limits.WRITE_MAX_BYTES, description="The whole new content of the file.")


class EditFileArgs(_PathArgs):
    mutation: ClassVar[bool] = True
    old_text: str = Field(min_length=1, max_length=limits.EDIT_MAX_FILE_BYTES, description="Exact text to replace.")
    new_text: str = Field(max_length=limits.EDIT_MAX_FILE_BYTES, description="Replacement text.")
    allow_multiple: bool = Field(default=False, description="Replace every occurrence instead of requiring a unique match.")
    expected_sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-fA-F]{64}$", description="The sha256 read_file showed; the edit is refused if the file changed since."
    )

    @model_validator(mode="after")
    def _changes_something(self) -> "EditFileArgs":
        """An edit that changes nothing is a mistake the model should hear about (as OpenHands' editor says)."""
        if self.old_text == self.new_text:
            raise ValueError("old_text and new_text are the same; nothing would change")
        return self


class ShellArgs(_Args):
    command: str = Field(min_length=1, max_length=64 * 1024, description="Run with /bin/sh -c in the workspace, no standard input.")
    timeout: int = Field(
        default=limits.SHELL_DEFAULT_TIMEOUT_S, ge=1, le=1_000_000,
        description=f"Seconds; default {limits.SHELL_DEFAULT_TIMEOUT_S}, clamped to {limits.SHELL_MAX_TIMEOUT_S}.",
    )


ARGS_MODELS: dict[str, type[_Args]] = {
    "read_file": ReadFileArgs,
    "list_files": ListFilesArgs,
    "grep_files": GrepFilesArgs,
    "write_file": WriteFileArgs,
    "edit_file": EditFileArgs,
    "shell": ShellArgs,
}


def parse_arguments(raw: str | bytes | dict[str, Any] | None) -> dict[str, Any]:
    """Model arguments arrive as JSON text (OpenAI) or an object (Gemini); both end up a dict or a typed error."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, "arguments are not valid UTF-8") from None
    if len(raw) > MAX_RAW_ARGUMENT_BYTES:
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"arguments are {len(raw)} characters; the limit is {MAX_RAW_ARGUMENT_BYTES}")
    try:
        value = jsonbound.loads(raw)
    except ValueError as err:
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"arguments are not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, "arguments must be a JSON object")
    return value


def validate_arguments(tool: str, raw: str | bytes | dict[str, Any] | None) -> _Args:
    model = ARGS_MODELS.get(tool)
    if model is None:
        raise OpenAgentsError(ErrorType.UNKNOWN_TOOL, f"unknown tool {tool!r}; the tools are {', '.join(ARGS_MODELS)}")
    args = parse_arguments(raw)
    try:
        return model.model_validate(args)
    except ValidationError as err:
        for detail in err.errors():
            cause = (detail.get("ctx") or {}).get("error")
            if isinstance(cause, _PathError):
                raise OpenAgentsError(ErrorType(cause.kind), str(cause)) from None
        summary = "; ".join(f"{'.'.join(map(str, d['loc'])) or 'arguments'}: {d['msg']}" for d in err.errors()[:5])
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"invalid arguments for {tool}: {summary}") from None
    except RecursionError:
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, "arguments nest too deeply") from None
