"""Anthropic's Messages API with tools: `tools` carry `input_schema`, the model asks with `tool_use`
blocks and hears back in `tool_result` blocks of a user message; the system prompt is a field of
its own. Streamed: message_start (input usage), content_block_start / content_block_delta
(text_delta, input_json_delta) / content_block_stop, message_delta (stop reason, output usage),
message_stop; `ping` keeps the line alive; an `error` event (overloaded_error) is tried again while
nothing has been shown."""
from __future__ import annotations

from typing import Any

from ..errors import ErrorType, OpenAgentsError
from ..tools.args import parse_arguments
from ..tools.call import ToolCall
from .base import DEFAULT_MODEL_TIMEOUT_S, Message, ModelTurn, RetryableModelError, RetryPolicy, TextSink, http_client, post_json, post_stream, preflight
from .stream import SSEEvent

WHAT = "the Anthropic API"
API_VERSION = "2023-06-01"
MAX_OUTPUT_TOKENS = 8192
MAX_BLOCKS = 256
MAX_INPUT_JSON_CHARS = 4 << 20
RETRYABLE_STREAM_ERRORS = frozenset({"overloaded_error", "rate_limit_error", "api_error"})


def _input(call: ToolCall) -> dict[str, Any]:
    try:
        return parse_arguments(call.arguments)
    except OpenAgentsError:
        return {}


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
            blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c)} for c in m.tool_calls]
            add("assistant", blocks or [{"type": "text", "text": "(no text)"}])
        else:
            add("user", [{"type": "tool_result", "tool_use_id": m.tool_call_id or "", "content": m.content}])
    return "\n\n".join(system), out


def _unexpected(err: Exception, data: Any) -> OpenAgentsError:
    return OpenAgentsError(ErrorType.MODEL_API_ERROR, f"{WHAT} answered in an unexpected shape ({type(err).__name__}: {err}): {str(data)[:200]}")


def parse_message(data: dict[str, Any]) -> ModelTurn:
    try:
        if data.get("type") == "error":
            raise OpenAgentsError(ErrorType.MODEL_API_ERROR, f"{WHAT} answered with an error: {str(data.get('error'))[:300]}")
        blocks = data["content"]
        text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
        calls = [ToolCall(id=str(b.get("id") or f"toolu_{i}"), name=str(b.get("name", "")), arguments=b.get("input") if isinstance(b.get("input"), dict) else {})
                 for i, b in enumerate(blocks) if b.get("type") == "tool_use"]
        return ModelTurn(text=text, tool_calls=calls, usage=data.get("usage") or {})
    except (KeyError, TypeError, AttributeError) as err:
        raise _unexpected(err, data) from None


class AnthropicStream:
    def __init__(self, on_text: TextSink | None) -> None:
        self.on_text = on_text
        self.shown = False
        self.blocks: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] = {}
        self.finished = False
        self._whole: ModelTurn | None = None

    def feed(self, event: SSEEvent) -> None:
        data = event.data
        if not isinstance(data, dict):
            raise _unexpected(TypeError("an event is no object"), data)
        kind = data.get("type", event.event)
        try:
            if kind == "message_start":
                usage = (data.get("message") or {}).get("usage")
                if isinstance(usage, dict):
                    self.usage.update(usage)
            elif kind == "content_block_start":
                block = data["content_block"]
                self._block(data["index"], {"type": block.get("type"), "id": block.get("id"), "name": block.get("name"),
                                            "text": str(block.get("text") or ""), "json": ""})
            elif kind == "content_block_delta":
                block = self._block(data["index"])
                delta = data["delta"]
                if delta.get("type") == "text_delta":
                    piece = str(delta.get("text", ""))
                    block["text"] += piece
                    if piece and self.on_text is not None:
                        self.shown = True
                        self.on_text(piece)
                elif delta.get("type") == "input_json_delta":
                    block["json"] += str(delta.get("partial_json", ""))
                    if len(block["json"]) > MAX_INPUT_JSON_CHARS:
                        raise OpenAgentsError(ErrorType.MODEL_API_ERROR, f"{WHAT}: a streamed tool input is over {MAX_INPUT_JSON_CHARS} characters")
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
                raise OpenAgentsError(ErrorType.MODEL_API_ERROR, f"{WHAT} reported an error in the stream: {message}")
            # ping, content_block_stop and event types added later: nothing to do
        except (KeyError, TypeError, AttributeError) as err:
            raise _unexpected(err, data) from None

    def _block(self, index: Any, new: dict[str, Any] | None = None) -> dict[str, Any]:
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < MAX_BLOCKS:
            raise _unexpected(ValueError(f"content block index {index!r}"), index)
        if new is not None:
            self.blocks[index] = new
        if index not in self.blocks:
            raise _unexpected(KeyError(f"a delta for block {index}, which never started"), index)
        return self.blocks[index]

    def whole(self, data: dict[str, Any]) -> None:
        self._whole = parse_message(data)

    def turn(self) -> ModelTurn:
        if self._whole is not None:
            return self._whole
        if not self.finished:
            raise RetryableModelError("the stream ended before the answer did (no message_stop)")
        text = "".join(b["text"] for _, b in sorted(self.blocks.items()) if b["type"] == "text")
        calls = [ToolCall.model_validate({"id": str(b["id"] or f"toolu_{i}"), "name": str(b["name"] or ""), "arguments": b["json"] or "{}"})
                 for i, b in sorted(self.blocks.items()) if b["type"] == "tool_use"]
        return ModelTurn(text=text, tool_calls=calls, usage=self.usage)


class AnthropicClient:
    family = "anthropic"

    def __init__(self, name: str, base_url: str, key: str, retry: RetryPolicy, timeout_s: float = DEFAULT_MODEL_TIMEOUT_S,
                 stream: bool = True, max_tokens: int = MAX_OUTPUT_TOKENS) -> None:
        self.name = name
        self.base_url = base_url
        self.stream = stream
        self.max_tokens = max_tokens
        root = base_url.rstrip("/")
        self._url = root + ("/messages" if root.endswith("/v1") else "/v1/messages")  # ANTHROPIC_BASE_URL has no /v1; a --base-url may
        self._headers = {"anthropic-version": API_VERSION, **({"x-api-key": key} if key else {})}
        self._retry = retry
        self._http = http_client(timeout_s)

    def preflight(self) -> None:
        preflight(self.base_url, WHAT)

    def complete(self, messages: list[Message], tools: list[dict[str, Any]], on_text: TextSink | None = None) -> ModelTurn:
        system, conversation = to_anthropic(messages)
        body: dict[str, Any] = {"model": self.name, "max_tokens": self.max_tokens, "messages": conversation}
        if system:
            body["system"] = system
        if tools:
            body["tools"] = tools
        if not self.stream:
            return parse_message(post_json(self._http, self._url, body, self._headers, self._retry, WHAT))
        body["stream"] = True
        return post_stream(self._http, self._url, body, self._headers, self._retry, WHAT, lambda: AnthropicStream(on_text))
