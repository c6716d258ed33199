"""Gemini generateContent (streamed: streamGenerateContent?alt=sse) with functionDeclarations."""
from __future__ import annotations

import uuid
from typing import Any

from ..errors import ErrorType, OpenAgentsError
from ..tools.args import parse_arguments
from ..tools.call import ToolCall
from .base import DEFAULT_MODEL_TIMEOUT_S, Message, ModelTurn, RetryableModelError, RetryPolicy, TextSink, http_client, post_json, post_stream, preflight
from .stream import SSEEvent


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
            for call in m.tool_calls:
                try:
                    args = parse_arguments(call.arguments)
                except OpenAgentsError:
                    args = {}
                parts.append({"functionCall": {"name": call.name, "args": args}})
            contents.append({"role": "model", "parts": parts or [{"text": ""}]})
        else:  # tool results of one turn go back together, as one user turn
            part = {"functionResponse": {"name": m.name or "tool", "response": {"content": m.content}}}
            if contents and contents[-1]["role"] == "user" and "functionResponse" in contents[-1]["parts"][0]:
                contents[-1]["parts"].append(part)
            else:
                contents.append({"role": "user", "parts": [part]})
    return system, contents


WHAT = "the Gemini API"


def _parts(data: dict[str, Any]) -> list[Any]:
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
        raise OpenAgentsError(ErrorType.MODEL_API_ERROR, f"{WHAT} answered in an unexpected shape ({err}): {str(data)[:200]}") from None


def _calls(parts: list[Any]) -> list[ToolCall]:
    return [
        ToolCall(id=f"gemini_{uuid.uuid4().hex[:12]}", name=str(p["functionCall"].get("name", "")), arguments=p["functionCall"].get("args") or {})
        for p in parts
        if isinstance(p, dict) and isinstance(p.get("functionCall"), dict)
    ]


def _text(parts: list[Any]) -> str:
    return "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict) and not p.get("thought"))


def parse_response(data: dict[str, Any]) -> ModelTurn:
    if not data.get("candidates"):
        raise OpenAgentsError(ErrorType.MODEL_API_ERROR, f"{WHAT} answered in an unexpected shape (no candidates): {str(data)[:200]}")
    parts = _parts(data)
    return ModelTurn(text=_text(parts), tool_calls=_calls(parts), usage=data.get("usageMetadata") or {})


class GeminiStream:
    """streamGenerateContent?alt=sse: each event is a whole GenerateContentResponse holding the new
    parts; the last carries finishReason, usageMetadata is cumulative; there is no [DONE]."""

    def __init__(self, on_text: TextSink | None) -> None:
        self.on_text = on_text
        self.shown = False
        self.text: list[str] = []
        self.calls: list[ToolCall] = []
        self.usage: dict[str, Any] = {}
        self.finished = False
        self._whole: ModelTurn | None = None

    def feed(self, event: SSEEvent) -> None:
        data = event.data
        if not isinstance(data, dict):
            raise OpenAgentsError(ErrorType.MODEL_API_ERROR, f"{WHAT} streamed something that is no object: {str(data)[:200]}")
        if "error" in data:
            raise RetryableModelError(f"error in the stream: {str(data['error'])[:200]}")
        parts = _parts(data)
        piece = _text(parts)
        if piece:
            self.text.append(piece)
            if self.on_text is not None:
                self.shown = True
                self.on_text(piece)
        self.calls += _calls(parts)
        if len(self.calls) > 128:
            raise OpenAgentsError(ErrorType.MODEL_API_ERROR, f"{WHAT} streamed over 128 function calls in one answer")
        if isinstance(data.get("usageMetadata"), dict):
            self.usage = data["usageMetadata"]
        candidates = data.get("candidates") or []
        if candidates and isinstance(candidates[0], dict) and candidates[0].get("finishReason"):
            self.finished = True

    def whole(self, data: dict[str, Any]) -> None:
        self._whole = parse_response(data)

    def turn(self) -> ModelTurn:
        if self._whole is not None:
            return self._whole
        if not self.finished:
            raise RetryableModelError("the stream ended before the answer did (no finishReason)")
        return ModelTurn(text="".join(self.text), tool_calls=self.calls, usage=self.usage)


class GeminiClient:
    family = "gemini"

    def __init__(self, name: str, base_url: str, key: str, retry: RetryPolicy, timeout_s: float = DEFAULT_MODEL_TIMEOUT_S,
                 stream: bool = True) -> None:
        self.name = name
        self.base_url = base_url
        self.stream = stream
        self._url = f"{base_url.rstrip('/')}/models/{name}:generateContent"
        self._stream_url = f"{base_url.rstrip('/')}/models/{name}:streamGenerateContent?alt=sse"
        self._headers = {"x-goog-api-key": key} if key else {}
        self._retry = retry
        self._http = http_client(timeout_s)

    def preflight(self) -> None:
        preflight(self.base_url, WHAT)

    def complete(self, messages: list[Message], tools: list[dict[str, Any]], on_text: TextSink | None = None) -> ModelTurn:
        system, contents = to_gemini(messages)
        body: dict[str, Any] = {"contents": contents}
        if system:
            body["systemInstruction"] = system
        if tools:
            body["tools"] = [{"functionDeclarations": tools}]
        if not self.stream:
            return parse_response(post_json(self._http, self._url, body, self._headers, self._retry, WHAT))
        return post_stream(self._http, self._stream_url, body, self._headers, self._retry, WHAT, lambda: GeminiStream(on_text))
