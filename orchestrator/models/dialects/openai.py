"""OpenAI-compatible Chat Completions with tool calling: OpenAI, vLLM, Ollama, llama.cpp, proxies.

Tools are `{"type": "function", "function": {name, description, parameters}}`; calls come back
with their arguments as JSON text. Streamed (`stream: true`, usage asked for in the last chunk):
text goes to the watcher as it comes, tool calls are assembled from their deltas by index (the id
and name come first, the arguments' JSON text in pieces); `[DONE]` or a finish_reason ends it."""

from __future__ import annotations

import json
import os
from typing import Any

from ...errors import ErrorType, OpenAgentsError
from ..base import Message, ModelTurn, RetryableModelError, TextSink, ToolCall
from ..stream import SSEEvent
from .dialect import MAX_STREAMED_ARGUMENT_CHARS, MAX_STREAMED_CALLS, Assembler, Dialect


def to_openai(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["content"] = message.content or None
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {
                    "name": c.name,
                    "arguments": c.raw_arguments if c.raw_arguments is not None else json.dumps(c.arguments),
                },
            }
            for c in message.tool_calls
        ]
    return out


class OpenAIChat(Dialect):
    family = "openai"
    what = "the OpenAI-compatible API"
    key_variable = "OPENAI_API_KEY"

    def default_url(self) -> str:
        return os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"

    def url(self, base_url: str, model: str, stream: bool) -> str:
        return base_url.rstrip("/") + "/chat/completions"

    def headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"} if key else {}

    def request(self, model: str, messages: list[Message], tools: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "messages": [to_openai(m) for m in messages]}
        if tools:
            body["tools"] = tools
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def declare(self, name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
        return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}

    def parse(self, data: dict[str, Any]) -> ModelTurn:
        try:
            message = data["choices"][0]["message"]
            calls = [
                ToolCall(
                    id=c.get("id") or f"call_{i}", name=c["function"]["name"], arguments=c["function"].get("arguments")
                )
                for i, c in enumerate(message.get("tool_calls") or [])
            ]
            return ModelTurn(text=message.get("content") or "", tool_calls=calls, usage=data.get("usage") or {})
        except (KeyError, IndexError, TypeError, AttributeError) as err:
            raise self.unexpected(err, data) from None

    def assembler(self, on_text: TextSink | None) -> Assembler:
        return OpenAIStream(self, on_text)


DIALECT = OpenAIChat()


class OpenAIStream(Assembler):
    """One streamed answer's chunks -> a ModelTurn."""

    end_marker = "no finish_reason, no [DONE]"

    def __init__(self, dialect: Dialect, on_text: TextSink | None) -> None:
        super().__init__(dialect, on_text)
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}

    def feed(self, event: SSEEvent) -> None:
        if event.done:
            self.finished = True
            return
        data = self.data(event)
        if "error" in data:  # some servers report a failure inside the stream
            raise RetryableModelError(f"error in the stream: {str(data['error'])[:200]}")
        if isinstance(data.get("usage"), dict):
            self.usage = data["usage"]
        try:
            for choice in data.get("choices") or []:
                if choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta") or {}
                piece = delta.get("content")
                if isinstance(piece, str) and piece:
                    self.text.append(piece)
                    self.say(piece)
                for part in delta.get("tool_calls") or []:
                    self._call_delta(part)
                if choice.get("finish_reason"):
                    self.finished = True
        except (KeyError, TypeError, AttributeError) as err:
            raise self.dialect.unexpected(err, data) from None

    def _call_delta(self, part: dict[str, Any]) -> None:
        index = part.get("index", len(self.calls))
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < MAX_STREAMED_CALLS:
            raise self.dialect.unexpected(ValueError(f"tool call index {index!r}"), part)
        call = self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        if part.get("id"):
            call["id"] = str(part["id"])
        function = part.get("function") or {}
        if function.get("name"):
            call["name"] += str(function["name"])
        if function.get("arguments"):
            call["arguments"] += str(function["arguments"])
            if len(call["arguments"]) > MAX_STREAMED_ARGUMENT_CHARS:
                raise OpenAgentsError(
                    ErrorType.MODEL_API_ERROR,
                    f"{self.dialect.what}: a streamed tool call's arguments "
                    f"are over {MAX_STREAMED_ARGUMENT_CHARS} characters",
                )

    def assembled(self) -> ModelTurn:
        calls = [
            ToolCall.model_validate(
                {"id": c["id"] or f"call_{i}", "name": c["name"], "arguments": c["arguments"] or "{}"}
            )
            for i, c in sorted(self.calls.items())
        ]
        return ModelTurn(text="".join(self.text), tool_calls=calls, usage=self.usage)
