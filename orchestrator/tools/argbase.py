"""What every tool's argument model shares. Arguments come from the model and are untrusted:
strict types, no extra fields, bounded sizes. A workspace path is checked lexically here too (the
same check the agent makes), so a bad path never reaches the box. Each tool's own model is in its
file under defs/; args.py validates by tool name."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator

from sandbox_agent.names import displayed, from_arg
from sandbox_agent.paths import PathRefused, check_lexical

from ..errors import ErrorType, OpenAgentsError

MAX_PATH_CHARS = 4096


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    mutation: ClassVar[bool] = False


class NameBytes(BaseModel):
    """A name whose bytes are not UTF-8, as list_files' `names` and grep_files' `hits` give it
    (sandbox_agent/names.py): the standard base64 of its bytes."""

    model_config = ConfigDict(extra="forbid", strict=True)
    bytes_b64: str = Field(max_length=2 * MAX_PATH_CHARS)

    def name(self) -> str:
        """The name as an os.fsdecode string; PathError for base64 that is not."""
        try:
            return from_arg(self.model_dump())
        except ValueError as err:
            raise PathError("invalid_arguments", f"path: {err}") from None


# The path of a tool that reads (read_file, list_files, grep_files): a string, or a NameBytes, so every
# name a listing gives can be read back exactly. Declared to models as a string: they read names as text.
ReadPath = Annotated[
    Annotated[str, Field(max_length=MAX_PATH_CHARS)] | NameBytes,
    WithJsonSchema({"type": "string", "maxLength": MAX_PATH_CHARS}),
]


class PathArgs(Args):
    path: str = Field(max_length=MAX_PATH_CHARS, description="Path relative to the workspace root.")

    @field_validator("path")
    @classmethod
    def _lexical(cls, value: str | NameBytes) -> str | NameBytes:
        try:
            check_lexical(value.name() if isinstance(value, NameBytes) else value, mutation=cls.mutation)
        except PathRefused as err:
            raise PathError(err.kind, str(err)) from None
        return value


class ReadPathArgs(PathArgs):
    """A reading tool's arguments: its path may name a file whose name is not UTF-8 (NameBytes)."""

    path: ReadPath = Field(description="Path relative to the workspace root.")  # type: ignore[assignment]


def shown_path(value: object) -> str:
    """A path argument as text for a title or a message: a NameBytes's bytes escaped (`\\xNN`)."""
    if isinstance(value, NameBytes):
        value = value.model_dump()
    try:
        return displayed(from_arg(value))
    except ValueError:
        return ""


class PathError(ValueError):
    """A path refused by the lexical check: becomes its own error type, not invalid_arguments."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def validate_model(model: type[BaseModel], tool: str, args: dict[str, Any]) -> BaseModel:
    """`args` as `model`, or a typed error: a refused path keeps its own type; anything else is
    invalid_arguments with the first few problems."""
    try:
        return model.model_validate(args)
    except ValidationError as err:
        for detail in err.errors():
            cause = (detail.get("ctx") or {}).get("error")
            if isinstance(cause, PathError):
                raise OpenAgentsError(ErrorType(cause.kind), str(cause)) from None
        summary = "; ".join(_problem(d) for d in err.errors()[:5])
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"invalid arguments for {tool}: {summary}") from None
    except RecursionError:
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, "arguments nest too deeply") from None


def _problem(detail: Any) -> str:
    """One problem as `offset: Input should be a valid integer (got str)`: the argument, what it must
    be and, for a value of the wrong type, the type it had (a program's caller, e.g. the Python API's
    `read_file(offset="3")`, sees what it passed; this is the one validation the host makes)."""
    where = ".".join(map(str, detail["loc"])) or "arguments"
    given = detail.get("input")
    wrong_type = str(detail.get("type", "")).endswith("_type") and not isinstance(given, dict)
    return f"{where}: {detail['msg']}" + (f" (got {type(given).__name__})" if wrong_type else "")
