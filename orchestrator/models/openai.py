"""OpenAI-compatible Chat Completions with tool calling: OpenAI, vLLM, Ollama, llama.cpp, proxies."""
from __future__ import annotations

import json
from typing import Any

import httpx

from ..errors import ErrorType, OpenAgentsError
from .base import Message, ModelTurn, RetryPolicy, ToolCall, post_json


def to_openai(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["content"] = message.content or None
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.raw_arguments if c.raw_arguments is not None else json.dumps(c.arguments)}}
            for c in message.tool_calls
        ]
    return out


class OpenAIChatClient:
    family = "openai"

    def __init__(self, name: str, base_url: str, key: str, retry: RetryPolicy, timeout_s: float = 300.0) -> None:
        self.name = name
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}  # a local server may need no key
        self._retry = retry
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0))

    def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> ModelTurn:
        body: dict[str, Any] = {"model": self.name, "messages": [to_openai(m) for m in messages]}
        if tools:
            body["tools"] = tools
        data = post_json(self._http, self._url, body, self._headers, self._retry, "the OpenAI-compatible API")
        try:
            message = data["choices"][0]["message"]
            calls = [
                ToolCall(id=c.get("id") or f"call_{i}", name=c["function"]["name"], arguments=c["function"].get("arguments"))
                for i, c in enumerate(message.get("tool_calls") or [])
            ]
            return ModelTurn(text=message.get("content") or "", tool_calls=calls, usage=data.get("usage") or {})
        except (KeyError, IndexError, TypeError) as err:
            raise OpenAgentsError(ErrorType.MODEL_API_ERROR, f"the OpenAI-compatible API answered in an unexpected shape ({err}): {str(data)[:200]}") from None
