"""The model-neutral conversation (what the loop, the transcript and the front-ends hold), the
client interface, the retry policy and where a key comes from. Imports no family and no HTTP:
the families' wire formats are models/dialects/, the one HTTP client is models/http.py."""

from __future__ import annotations

import ipaddress
import os
from typing import Any, Callable, Literal, Protocol
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, model_validator

from sandbox_agent import jsonbound, limits

from ..errors import ErrorType, OpenAgentsError


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


class ModelTurn(BaseModel):
    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: dict[str, Any] = Field(default_factory=dict)


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None


TextSink = Callable[[str], None]  # streamed text, piece by piece, as it arrives


class ModelClient(Protocol):
    family: str  # a dialect's family (models/dialects/): which tool declarations this model receives
    name: str

    def complete(
        self, messages: list[Message], tools: list[dict[str, Any]], on_text: TextSink | None = None
    ) -> ModelTurn: ...


class RetryableModelError(Exception):
    """A failed attempt worth making again (429, 5xx, a broken connection, a stream cut before any
    text was shown); the client turns the last one into a typed MODEL_API_ERROR."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RetryNotice(BaseModel):
    """One failed attempt that will be tried again: said as it happens (`429, retry 2/5 in 4 s`)."""

    attempt: int  # the attempt that failed, 1-based
    max_attempts: int
    delay_s: float
    problem: str

    def line(self) -> str:
        return f"{self.problem}, retry {self.attempt + 1}/{self.max_attempts} in {self.delay_s:.0f} s"


class RetryPolicy(BaseModel):
    max_attempts: int = 5
    max_total_s: float = 120.0
    base_delay_s: float = 1.0
    max_delay_s: float = 30.0
    on_retry: Callable[[RetryNotice], None] | None = None  # progress for whoever watches


DEFAULT_MODEL_TIMEOUT_S = 300.0  # --model-timeout: the longest the model server may stay silent


def local_endpoint(base_url: str | None) -> bool:
    """A server on this machine or a private network (llama.cpp, vLLM, Ollama): no key needed."""
    if not base_url:
        return False
    host = (urlsplit(base_url).hostname or "").strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_link_local


def api_key(var: str, base_url: str | None = None) -> str:
    """The key from `var`; optional (empty) for a loopback or private `base_url`."""
    value = os.environ.get(var, "")
    if not value and not local_endpoint(base_url):
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID,
            f"the model's key is not set: export {var}=... (a server on loopback or a private address needs none)",
        )
    return value


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
        raise OpenAgentsError(
            ErrorType.INVALID_ARGUMENTS, f"arguments are {len(raw)} characters; the limit is {MAX_RAW_ARGUMENT_BYTES}"
        )
    try:
        value = jsonbound.loads(raw)
    except ValueError as err:
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"arguments are not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, "arguments must be a JSON object")
    return value


MAX_RAW_ARGUMENT_BYTES = limits.WRITE_MAX_BYTES + 64 * 1024
