"""Anthropic's Messages API with tools: `tools` carry `input_schema`, the model asks with `tool_use`
blocks and hears back in `tool_result` blocks of a user message; the system prompt is a field of
its own; `max_tokens` is required. Streamed: message_start (input usage), content_block_start /
content_block_delta (text_delta, input_json_delta) / content_block_stop, message_delta (stop
reason, output usage), message_stop; `ping` keeps the line alive; an `error` event
(overloaded_error) is tried again while nothing has been shown."""

from __future__ import annotations

import os
from typing import Any

from ...errors import ErrorType, OpenAgentsError
from ..base import Message, ModelTurn, RetryableModelError, TextSink, ToolCall
from ..stream import SSEEvent
from .dialect import MAX_STREAMED_ARGUMENT_CHARS, Assembler, Dialect, arguments_object

API_VERSION = "2023-06-01"
MAX_OUTPUT_TOKENS = 8192
MAX_BLOCKS = 256
RETRYABLE_STREAM_ERRORS = frozenset({"overloaded_error", "rate_limit_error", "api_error"})


def to_anthropic(messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    """(system, messages): roles alternate, so neighbours of one role are merged into one message;
    the results of one turn's calls go back together as one user message of tool_result blocks."""
    system: list[str] = []
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"] += blocks
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        if m.role == "system":
            system.append(m.content)
        elif m.role == "user":
            add("user", [{"type": "text", "text": m.content or "(empty)"}])
        elif m.role == "assistant":
            blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
            blocks += [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": arguments_object(c)} for c in m.tool_calls
            ]
            add("assistant", blocks or [{"type": "text", "text": "(no text)"}])
        else:
            add("user", [{"type": "tool_result", "tool_use_id": m.tool_call_id or "", "content": m.content}])
    return "\n\n".join(system), out


class AnthropicMessages(Dialect):
    family = "anthropic"
    what = "the Anthropic API"
    key_variable = "ANTHROPIC_API_KEY"

    def default_url(self) -> str:
        return os.environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"

    def url(self, base_url: str, model: str, stream: bool) -> str:
        root = base_url.rstrip("/")
        return root + (
            "/messages" if root.endswith("/v1") else "/v1/messages"
        )  # ANTHROPIC_BASE_URL has no /v1; a --base-url may

    def headers(self, key: str) -> dict[str, str]:
        return {"anthropic-version": API_VERSION, **({"x-api-key": key} if key else {})}

    def request(self, model: str, messages: list[Message], tools: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
        system, conversation = to_anthropic(messages)
        body: dict[str, Any] = {"model": model, "max_tokens": MAX_OUTPUT_TOKENS, "messages": conversation}
        if system:
            body["system"] = system
        if tools:
            body["tools"] = tools
        if stream:
            body["stream"] = True
        return body

    def declare(self, name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "description": description, "input_schema": parameters}

    def parse(self, data: dict[str, Any]) -> ModelTurn:
        try:
            if data.get("type") == "error":
                raise OpenAgentsError(
                    ErrorType.MODEL_API_ERROR, f"{self.what} answered with an error: {str(data.get('error'))[:300]}"
                )
            blocks = data["content"]
            text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
            calls = [
                ToolCall(
                    id=str(b.get("id") or f"toolu_{i}"),
                    name=str(b.get("name", "")),
                    arguments=b.get("input") if isinstance(b.get("input"), dict) else {},
                )
                for i, b in enumerate(blocks)
                if b.get("type") == "tool_use"
            ]
            return ModelTurn(text=text, tool_calls=calls, usage=data.get("usage") or {})
        except (KeyError, TypeError, AttributeError) as err:
            raise self.unexpected(err, data) from None

    def assembler(self, on_text: TextSink | None) -> Assembler:
        return AnthropicStream(self, on_text)


DIALECT = AnthropicMessages()


class AnthropicStream(Assembler):
    end_marker = "no message_stop"

    def __init__(self, dialect: Dialect, on_text: TextSink | None) -> None:
        super().__init__(dialect, on_text)
        self.blocks: dict[int, dict[str, Any]] = {}

    def feed(self, event: SSEEvent) -> None:
        data = self.data(event)
        kind = data.get("type", event.event)
        try:
            if kind == "message_start":
                usage = (data.get("message") or {}).get("usage")
                if isinstance(usage, dict):
                    self.usage.update(usage)
            elif kind == "content_block_start":
                block = data["content_block"]
                self._block(
                    data["index"],
                    {
                        "type": block.get("type"),
                        "id": block.get("id"),
                        "name": block.get("name"),
                        "text": str(block.get("text") or ""),
                        "json": "",
                    },
                )
            elif kind == "content_block_delta":
                self._delta(self._block(data["index"]), data["delta"])
            elif kind == "message_delta":
                usage = data.get("usage")
                if isinstance(usage, dict):
                    self.usage.update({k: v for k, v in usage.items() if v is not None})
            elif kind == "message_stop":
                self.finished = True
            elif kind == "error":
                error = data.get("error") or {}
                message = f"{error.get('type', 'error')}: {str(error.get('message', ''))[:200]}"
                if error.get("type") in RETRYABLE_STREAM_ERRORS:
                    raise RetryableModelError(f"error in the stream: {message}")
                raise OpenAgentsError(
                    ErrorType.MODEL_API_ERROR, f"{self.dialect.what} reported an error in the stream: {message}"
                )
            # ping, content_block_stop and event types added later: nothing to do
        except (KeyError, TypeError, AttributeError) as err:
            raise self.dialect.unexpected(err, data) from None

    def _delta(self, block: dict[str, Any], delta: dict[str, Any]) -> None:
        if delta.get("type") == "text_delta":
            piece = str(delta.get("text", ""))
            block["text"] += piece
            self.say(piece)
        elif delta.get("type") == "input_json_delta":
            block["json"] += str(delta.get("partial_json", ""))
            if len(block["json"]) > MAX_STREAMED_ARGUMENT_CHARS:
                raise OpenAgentsError(
                    ErrorType.MODEL_API_ERROR,
                    f"{self.dialect.what}: a streamed tool input is over {MAX_STREAMED_ARGUMENT_CHARS} characters",
                )

    def _block(self, index: Any, new: dict[str, Any] | None = None) -> dict[str, Any]:
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < MAX_BLOCKS:
            raise self.dialect.unexpected(ValueError(f"content block index {index!r}"), index)
        if new is not None:
            self.blocks[index] = new
        if index not in self.blocks:
            raise self.dialect.unexpected(KeyError(f"a delta for block {index}, which never started"), index)
        return self.blocks[index]

    def assembled(self) -> ModelTurn:
        text = "".join(b["text"] for _, b in sorted(self.blocks.items()) if b["type"] == "text")
        calls = [
            ToolCall.model_validate(
                {"id": str(b["id"] or f"toolu_{i}"), "name": str(b["name"] or ""), "arguments": b["json"] or "{}"}
            )
            for i, b in sorted(self.blocks.items())
            if b["type"] == "tool_use"
        ]
        return ModelTurn(text=text, tool_calls=calls, usage=self.usage)
