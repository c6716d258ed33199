"""Gemini generateContent (streamed: streamGenerateContent?alt=sse) with functionDeclarations.

Tools go as `[{"functionDeclarations": [...]}]`, each with an OpenAPI-subset schema (upper-case
type names, unknown keys dropped); calls come back as `functionCall` parts with an object of
arguments and no id (we make one); results go back as `functionResponse` parts of one user turn."""

from __future__ import annotations

import uuid
from typing import Any

from ...errors import ErrorType, OpenAgentsError
from ..base import Message, ModelTurn, RetryableModelError, TextSink, ToolCall
from ..stream import SSEEvent
from .dialect import MAX_STREAMED_CALLS, Assembler, Dialect, arguments_object

SCHEMA_KEYS = {
    "type",
    "description",
    "properties",
    "required",
    "items",
    "enum",
    "minimum",
    "maximum",
    "nullable",
    "format",
}


def to_gemini(messages: list[Message]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    system = None
    contents: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            system = {"parts": [{"text": m.content}]}
        elif m.role == "user":
            contents.append({"role": "user", "parts": [{"text": m.content}]})
        elif m.role == "assistant":
            parts: list[dict[str, Any]] = [{"text": m.content}] if m.content else []
            parts += [{"functionCall": {"name": call.name, "args": arguments_object(call)}} for call in m.tool_calls]
            contents.append({"role": "model", "parts": parts or [{"text": ""}]})
        else:  # tool results of one turn go back together, as one user turn
            part = {"functionResponse": {"name": m.name or "tool", "response": {"content": m.content}}}
            if contents and contents[-1]["role"] == "user" and "functionResponse" in contents[-1]["parts"][0]:
                contents[-1]["parts"].append(part)
            else:
                contents.append({"role": "user", "parts": [part]})
    return system, contents


def gemini_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Gemini takes an OpenAPI subset with upper-case type names; unknown keys are dropped."""
    out = {k: v for k, v in schema.items() if k in SCHEMA_KEYS}
    if "type" in out:
        out["type"] = str(out["type"]).upper()
    if "properties" in out:
        out["properties"] = {k: gemini_schema(v) for k, v in out["properties"].items()}
    if "items" in out:
        out["items"] = gemini_schema(out["items"])
    return out


class GeminiGenerate(Dialect):
    family = "gemini"
    what = "the Gemini API"
    key_variable = "GEMINI_API_KEY"

    def default_url(self) -> str:
        return "https://generativelanguage.googleapis.com/v1beta"

    def url(self, base_url: str, model: str, stream: bool) -> str:
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        return f"{base_url.rstrip('/')}/models/{model}:{method}"

    def headers(self, key: str) -> dict[str, str]:
        return {"x-goog-api-key": key} if key else {}

    def request(self, model: str, messages: list[Message], tools: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
        system, contents = to_gemini(messages)
        body: dict[str, Any] = {"contents": contents}  # the model and streaming are in the URL
        if system:
            body["systemInstruction"] = system
        if tools:
            body["tools"] = [{"functionDeclarations": tools}]
        return body

    def declare(self, name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "description": description, "parameters": gemini_schema(parameters)}

    def parse(self, data: dict[str, Any]) -> ModelTurn:
        if not data.get("candidates"):
            raise self.unexpected(KeyError("no candidates"), data)
        parts = self.parts(data)
        return ModelTurn(text=_text(parts), tool_calls=_calls(parts), usage=data.get("usageMetadata") or {})

    def parts(self, data: dict[str, Any]) -> list[Any]:
        try:
            candidates = data.get("candidates") or []
            if not candidates:
                return []
            content = candidates[0].get("content") or {}
            parts = content.get("parts") or []
            if not isinstance(parts, list):
                raise TypeError("parts is no list")
            return parts
        except (TypeError, AttributeError) as err:
            raise self.unexpected(err, data) from None

    def assembler(self, on_text: TextSink | None) -> Assembler:
        return GeminiStream(self, on_text)


DIALECT = GeminiGenerate()


def _calls(parts: list[Any]) -> list[ToolCall]:
    return [
        ToolCall(
            id=f"gemini_{uuid.uuid4().hex[:12]}",
            name=str(p["functionCall"].get("name", "")),
            arguments=p["functionCall"].get("args") or {},
        )
        for p in parts
        if isinstance(p, dict) and isinstance(p.get("functionCall"), dict)
    ]


def _text(parts: list[Any]) -> str:
    return "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict) and not p.get("thought"))


class GeminiStream(Assembler):
    """streamGenerateContent?alt=sse: each event is a whole GenerateContentResponse holding the new
    parts; the last carries finishReason, usageMetadata is cumulative; there is no [DONE]."""

    end_marker = "no finishReason"

    def __init__(self, dialect: GeminiGenerate, on_text: TextSink | None) -> None:
        super().__init__(dialect, on_text)
        self.parts = dialect.parts
        self.text: list[str] = []
        self.calls: list[ToolCall] = []

    def feed(self, event: SSEEvent) -> None:
        data = self.data(event)
        if "error" in data:
            raise RetryableModelError(f"error in the stream: {str(data['error'])[:200]}")
        parts = self.parts(data)
        piece = _text(parts)
        if piece:
            self.text.append(piece)
            self.say(piece)
        self.calls += _calls(parts)
        if len(self.calls) > MAX_STREAMED_CALLS:
            raise OpenAgentsError(
                ErrorType.MODEL_API_ERROR,
                f"{self.dialect.what} streamed over {MAX_STREAMED_CALLS} function calls in one answer",
            )
        if isinstance(data.get("usageMetadata"), dict):
            self.usage = data["usageMetadata"]
        candidates = data.get("candidates") or []
        if candidates and isinstance(candidates[0], dict) and candidates[0].get("finishReason"):
            self.finished = True

    def assembled(self) -> ModelTurn:
        return ModelTurn(text="".join(self.text), tool_calls=self.calls, usage=self.usage)
