"""Gemini generateContent with functionDeclarations."""
from __future__ import annotations

import uuid
from typing import Any

import httpx

from ..errors import ErrorType, OpenAgentsError
from .base import Message, ModelTurn, RetryPolicy, ToolCall, post_json
from ..tools.args import parse_arguments


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


class GeminiClient:
    family = "gemini"

    def __init__(self, name: str, base_url: str, key: str, retry: RetryPolicy, timeout_s: float = 300.0) -> None:
        self.name = name
        self._url = f"{base_url.rstrip('/')}/models/{name}:generateContent"
        self._headers = {"x-goog-api-key": key} if key else {}
        self._retry = retry
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0))

    def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> ModelTurn:
        system, contents = to_gemini(messages)
        body: dict[str, Any] = {"contents": contents}
        if system:
            body["systemInstruction"] = system
        if tools:
            body["tools"] = [{"functionDeclarations": tools}]
        data = post_json(self._http, self._url, body, self._headers, self._retry, "the Gemini API")
        try:
            parts = data["candidates"][0]["content"].get("parts") or []
        except (KeyError, IndexError, TypeError, AttributeError) as err:
            raise OpenAgentsError(ErrorType.MODEL_API_ERROR, f"the Gemini API answered in an unexpected shape ({err}): {str(data)[:200]}") from None
        text = "".join(p.get("text", "") for p in parts if isinstance(p, dict))
        calls = [
            ToolCall(id=f"gemini_{uuid.uuid4().hex[:12]}", name=str(p["functionCall"].get("name", "")), arguments=p["functionCall"].get("args") or {})
            for i, p in enumerate(parts)
            if isinstance(p, dict) and isinstance(p.get("functionCall"), dict)
        ]
        return ModelTurn(text=text, tool_calls=calls, usage=data.get("usageMetadata") or {})
