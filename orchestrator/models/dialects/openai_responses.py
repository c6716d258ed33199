"""OpenAI's Responses API (`POST /responses`), the successor of Chat Completions for OpenAI's own
models: `--model openai-responses:NAME`.

Stateless, as every family here: the whole conversation goes each turn as `input` items and
`store: false` keeps none of it on the server. The system prompt is `instructions`; a past call is
a `function_call` item (its arguments as the JSON text the model sent) and its result a
`function_call_output` item of the same `call_id`. Tools are flat `{"type": "function", name,
description, parameters}` with `strict: false` (strict mode, the API's default, would make every
optional argument required). An answer's `output` holds `message` items (`output_text` and
`refusal` parts), `function_call` items and `reasoning` items (not shown, not sent back).

Streamed: typed events, each with `event:` and a `type` field: response.output_text.delta (text),
response.output_item.added / response.function_call_arguments.delta / response.output_item.done
(calls, by output_index; the done item's arguments are the final ones), response.completed or
response.incomplete (usage; the end), response.failed and `error` (server errors and rate limits
tried again while nothing was shown, the rest a typed error)."""

from __future__ import annotations

import json
import os
from typing import Any

from ...errors import ErrorType, OpenAgentsError
from ..base import Message, ModelTurn, RetryableModelError, TextSink, ToolCall
from ..stream import SSEEvent
from .dialect import MAX_STREAMED_ARGUMENT_CHARS, MAX_STREAMED_CALLS, Assembler, Dialect

RETRYABLE_CODES = frozenset({"server_error", "rate_limit_exceeded", "server_is_overloaded"})


def to_items(messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    """(instructions, input items)."""
    system: list[str] = []
    items: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            system.append(m.content)
        elif m.role == "tool":
            items.append({"type": "function_call_output", "call_id": m.tool_call_id or "", "output": m.content})
        else:
            if m.content or not m.tool_calls:
                items.append({"role": m.role, "content": m.content})
            items += [
                {
                    "type": "function_call",
                    "call_id": c.id,
                    "name": c.name,
                    "arguments": c.raw_arguments if c.raw_arguments is not None else json.dumps(c.arguments),
                }
                for c in m.tool_calls
            ]
    return "\n\n".join(system), items


class OpenAIResponses(Dialect):
    family = "openai-responses"
    what = "the OpenAI Responses API"
    key_variable = "OPENAI_API_KEY"

    def default_url(self) -> str:
        return os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"

    def url(self, base_url: str, model: str, stream: bool) -> str:
        return base_url.rstrip("/") + "/responses"

    def headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"} if key else {}

    def request(self, model: str, messages: list[Message], tools: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
        instructions, items = to_items(messages)
        body: dict[str, Any] = {"model": model, "input": items, "store": False}
        if instructions:
            body["instructions"] = instructions
        if tools:
            body["tools"] = tools
        if stream:
            body["stream"] = True
        return body

    def declare(self, name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
        return {"type": "function", "name": name, "description": description, "parameters": parameters, "strict": False}

    def parse(self, data: dict[str, Any]) -> ModelTurn:
        try:
            if data.get("status") == "failed" or data.get("error"):
                raise self.failed(data.get("error"))
            text: list[str] = []
            calls: list[ToolCall] = []
            for i, item in enumerate(data["output"]):
                if item.get("type") == "message":
                    text += [_part_text(part) for part in item.get("content") or []]
                elif item.get("type") == "function_call":
                    calls.append(
                        ToolCall(
                            id=str(item.get("call_id") or f"call_{i}"),
                            name=str(item["name"]),
                            arguments=item.get("arguments"),
                        )
                    )
            return ModelTurn(text="".join(text), tool_calls=calls, usage=data.get("usage") or {})
        except (KeyError, TypeError, AttributeError) as err:
            raise self.unexpected(err, data) from None

    def failed(self, error: Any) -> Exception:
        """A failure the server reported in the answer: its own errors and rate limits are worth
        another try (while nothing was shown), anything else is the request's fault."""
        error = error if isinstance(error, dict) else {"message": str(error)}
        message = f"{str(error.get('code') or 'error')[:100]}: {str(error.get('message', ''))[:200]}"
        if error.get("code") in RETRYABLE_CODES:
            return RetryableModelError(f"error in the answer: {message}")
        return OpenAgentsError(ErrorType.MODEL_API_ERROR, f"{self.what} reported an error: {message}")

    def assembler(self, on_text: TextSink | None) -> Assembler:
        return ResponsesStream(self, on_text)


DIALECT = OpenAIResponses()


def _part_text(part: Any) -> str:
    if not isinstance(part, dict):
        return ""
    if part.get("type") == "output_text":
        return str(part.get("text", ""))
    if part.get("type") == "refusal":
        return str(part.get("refusal", ""))
    return ""


class ResponsesStream(Assembler):
    end_marker = "no response.completed"

    def __init__(self, dialect: OpenAIResponses, on_text: TextSink | None) -> None:
        super().__init__(dialect, on_text)
        self.failed = dialect.failed
        self.text: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}

    def feed(self, event: SSEEvent) -> None:
        data = self.data(event)
        kind = data.get("type", event.event)
        try:
            if kind in ("response.output_text.delta", "response.refusal.delta"):
                piece = str(data.get("delta", ""))
                self.text.append(piece)
                self.say(piece)
            elif kind in ("response.output_item.added", "response.output_item.done"):
                item = data["item"]
                if item.get("type") == "function_call":
                    call = self._call(data["output_index"])
                    call.update(
                        {"id": str(item.get("call_id") or call["id"]), "name": str(item.get("name") or call["name"])}
                    )
                    if kind == "response.output_item.done" and isinstance(item.get("arguments"), str):
                        call["arguments"] = item["arguments"]
            elif kind == "response.function_call_arguments.delta":
                call = self._call(data["output_index"])
                call["arguments"] += str(data.get("delta", ""))
                if len(call["arguments"]) > MAX_STREAMED_ARGUMENT_CHARS:
                    raise OpenAgentsError(
                        ErrorType.MODEL_API_ERROR,
                        f"{self.dialect.what}: a streamed call's arguments "
                        f"are over {MAX_STREAMED_ARGUMENT_CHARS} characters",
                    )
            elif kind in ("response.completed", "response.incomplete"):
                response = data.get("response") or {}
                if isinstance(response.get("usage"), dict):
                    self.usage = response["usage"]
                self.finished = True
            elif kind == "response.failed":
                raise self.failed((data.get("response") or {}).get("error"))
            elif kind == "error":
                raise self.failed(data.get("error") if isinstance(data.get("error"), dict) else data)
            # created, in_progress, content_part.*, *.done of text and events added later: nothing to do
        except (KeyError, TypeError, AttributeError) as err:
            raise self.dialect.unexpected(err, data) from None

    def _call(self, index: Any) -> dict[str, str]:
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < MAX_STREAMED_CALLS:
            raise self.dialect.unexpected(ValueError(f"output index {index!r}"), index)
        return self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})

    def assembled(self) -> ModelTurn:
        calls = [
            ToolCall.model_validate(
                {"id": c["id"] or f"call_{i}", "name": c["name"], "arguments": c["arguments"] or "{}"}
            )
            for i, c in sorted(self.calls.items())
        ]
        return ModelTurn(text="".join(self.text), tool_calls=calls, usage=self.usage)
