"""OpenAI-compatible Chat Completions with tool calling: OpenAI, vLLM, Ollama, llama.cpp, proxies.

Streamed (`stream: true`, usage asked for in the last chunk): text goes to the watcher as it comes,
tool calls are assembled from their deltas by index (the id and name come first, the arguments'
JSON text in pieces)."""
from __future__ import annotations

import json
from typing import Any

from ..errors import ErrorType, OpenAgentsError
from ..tools.call import ToolCall
from .base import DEFAULT_MODEL_TIMEOUT_S, Message, ModelTurn, RetryableModelError, RetryPolicy, TextSink, http_client, post_json, post_stream, preflight
from .stream import SSEEvent

WHAT = "the OpenAI-compatible API"
MAX_TOOL_CALLS = 128  # in one streamed answer; indexes past it are refused, not allocated
MAX_ARGUMENT_CHARS = 4 << 20


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


def _unexpected(err: Exception, data: Any) -> OpenAgentsError:
    return OpenAgentsError(ErrorType.MODEL_API_ERROR, f"{WHAT} answered in an unexpected shape ({type(err).__name__}: {err}): {str(data)[:200]}")


def parse_completion(data: dict[str, Any]) -> ModelTurn:
    try:
        message = data["choices"][0]["message"]
        calls = [
            ToolCall(id=c.get("id") or f"call_{i}", name=c["function"]["name"], arguments=c["function"].get("arguments"))
            for i, c in enumerate(message.get("tool_calls") or [])
        ]
        return ModelTurn(text=message.get("content") or "", tool_calls=calls, usage=data.get("usage") or {})
    except (KeyError, IndexError, TypeError, AttributeError) as err:
        raise _unexpected(err, data) from None


class OpenAIStream:
    """One streamed answer's chunks -> a ModelTurn."""

    def __init__(self, on_text: TextSink | None) -> None:
        self.on_text = on_text
        self.shown = False
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] = {}
        self.finished = False
        self._whole: ModelTurn | None = None

    def feed(self, event: SSEEvent) -> None:
        if event.done:
            self.finished = True
            return
        data = event.data
        if not isinstance(data, dict):
            raise _unexpected(TypeError("a chunk is no object"), data)
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
                    if self.on_text is not None:
                        self.shown = True
                        self.on_text(piece)
                for part in delta.get("tool_calls") or []:
                    self._call_delta(part)
                if choice.get("finish_reason"):
                    self.finished = True
        except (KeyError, TypeError, AttributeError) as err:
            raise _unexpected(err, data) from None

    def _call_delta(self, part: dict[str, Any]) -> None:
        index = part.get("index", len(self.calls))
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < MAX_TOOL_CALLS:
            raise _unexpected(ValueError(f"tool call index {index!r}"), part)
        call = self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        if part.get("id"):
            call["id"] = str(part["id"])
        function = part.get("function") or {}
        if function.get("name"):
            call["name"] += str(function["name"])
        if function.get("arguments"):
            call["arguments"] += str(function["arguments"])
            if len(call["arguments"]) > MAX_ARGUMENT_CHARS:
                raise OpenAgentsError(ErrorType.MODEL_API_ERROR, f"{WHAT}: a streamed tool call's arguments are over {MAX_ARGUMENT_CHARS} characters")

    def whole(self, data: dict[str, Any]) -> None:
        self._whole = parse_completion(data)
        self.finished = True

    def turn(self) -> ModelTurn:
        if self._whole is not None:
            return self._whole
        if not self.finished:
            raise RetryableModelError("the stream ended before the answer did (no finish_reason, no [DONE])")
        calls = [ToolCall.model_validate({"id": c["id"] or f"call_{i}", "name": c["name"], "arguments": c["arguments"] or "{}"})
                 for i, c in sorted(self.calls.items())]
        return ModelTurn(text="".join(self.text), tool_calls=calls, usage=self.usage)


class OpenAIChatClient:
    family = "openai"

    def __init__(self, name: str, base_url: str, key: str, retry: RetryPolicy, timeout_s: float = DEFAULT_MODEL_TIMEOUT_S,
                 stream: bool = True) -> None:
        self.name = name
        self.base_url = base_url
        self.stream = stream
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}  # a local server may need no key
        self._retry = retry
        self._http = http_client(timeout_s)

    def preflight(self) -> None:
        preflight(self.base_url, WHAT)

    def complete(self, messages: list[Message], tools: list[dict[str, Any]], on_text: TextSink | None = None) -> ModelTurn:
        body: dict[str, Any] = {"model": self.name, "messages": [to_openai(m) for m in messages]}
        if tools:
            body["tools"] = tools
        if not self.stream:
            return parse_completion(post_json(self._http, self._url, body, self._headers, self._retry, WHAT))
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        return post_stream(self._http, self._url, body, self._headers, self._retry, WHAT, lambda: OpenAIStream(on_text))
