"""One tool call as the model asked for it: the call type every part shares (the model clients make it,
the registry, the hooks and the front-ends run it). It lives with the tools because its arguments are
parsed by the tools' one parser (argbase.py), so the model clients import tools/, never the reverse."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from ..errors import ErrorType, OpenAgentsError
from .argbase import parse_arguments


class ToolCall(BaseModel):
    """One call as the model asked for it. Arguments are parsed here, once, at the edge: OpenAI-style
    models send JSON text, Gemini an object; everything after sees a dict (still untrusted). Text
    that is no JSON object keeps its raw form and the reason, and the call fails as invalid_arguments."""

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    raw_arguments: str | None = None  # only when they could not be parsed
    arguments_error: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _parse_arguments(cls, data: Any) -> Any:
        if not isinstance(data, dict) or isinstance(data.get("arguments"), dict):
            return data
        raw = data.get("arguments")
        try:
            parsed = parse_arguments(raw if isinstance(raw, (str, bytes)) or raw is None else _not_an_object(raw))
        except OpenAgentsError as err:
            text = raw if isinstance(raw, str) else repr(raw)
            return {**data, "arguments": {}, "raw_arguments": text[:_RAW_KEEP], "arguments_error": err.message}
        return {**data, "arguments": parsed}


_RAW_KEEP = 64 * 1024


def _not_an_object(raw: Any) -> Any:
    raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"arguments must be a JSON object, not {type(raw).__name__}")
