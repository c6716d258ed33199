"""What every tool's argument model shares. Arguments come from the model and are untrusted:
strict types, no extra fields, bounded sizes. A workspace path is checked lexically here too (the
same check the agent makes), so a bad path never reaches the box. Each tool's own model is in its
file under defs/; args.py validates by tool name."""
from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sandbox_agent.paths import PathRefused, check_lexical

from ..errors import ErrorType, OpenAgentsError

MAX_PATH_CHARS = 4096


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    mutation: ClassVar[bool] = False


class PathArgs(Args):
    path: str = Field(max_length=MAX_PATH_CHARS, description="Path relative to the workspace root.")

    @field_validator("path")
    @classmethod
    def _lexical(cls, value: str) -> str:
        try:
            check_lexical(value, mutation=cls.mutation)
        except PathRefused as err:
            raise PathError(err.kind, str(err)) from None
        return value


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
        summary = "; ".join(f"{'.'.join(map(str, d['loc'])) or 'arguments'}: {d['msg']}" for d in err.errors()[:5])
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"invalid arguments for {tool}: {summary}") from None
    except RecursionError:
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, "arguments nest too deeply") from None
