"""A session's budgets: tokens summed from every model response, wall time, and the context window.

Token counts come from the model's own `usage` (OpenAI's prompt/completion tokens, Anthropic's
input/output tokens, Gemini's usageMetadata); a model that reports none (the scripted one, some
local servers) counts zero. The conversation's size is estimated (4 characters a token, the
usual rule of thumb): compaction must decide before a request, when no usage for it exists yet.

Compaction elides older tool outputs, oldest first, once the conversation passes COMPACT_AT of the
window, until it is under COMPACT_TO; the outputs of the last turn (which the model has not read
yet) are kept. Each elided output leaves a marker naming the call, so the model can ask again, as
Gemini CLI's chat compression keeps a session going.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from .models.base import Message

COMPACT_AT = 0.7
COMPACT_TO = 0.5
MIN_ELIDED_CHARS = 300  # shorter outputs cost less than their marker
CHARS_PER_TOKEN = 4

# Context windows by model name prefix (longest prefix wins), then by family.
_WINDOWS_BY_PREFIX = {
    "gpt-3.5": 16_385,
    "gpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4-turbo": 128_000,
    "gpt-4": 8_192,
    "gpt-5": 400_000,
    "o1": 200_000,
    "o3": 200_000,
    "o4": 200_000,
    "gemini-1.5": 1_048_576,
    "gemini-2": 1_048_576,
    "claude": 200_000,  # every Claude 3, 3.5, 3.7 and 4 model (a larger beta window is opt-in per request)
}
_WINDOWS_BY_FAMILY = {"openai": 128_000, "gemini": 1_048_576, "anthropic": 200_000}


class Budget(BaseModel):
    """Limits of one session; None means no limit (the context window then comes from the model)."""

    max_tokens: int | None = Field(default=None, ge=1, description="Input plus output tokens, summed over the session.")
    max_wall_s: float | None = Field(default=None, gt=0, description="Seconds from the session's start.")
    context_window: int | None = Field(default=None, ge=256, description="Tokens the model can read at once.")


def default_context_window(family: str, name: str) -> int:
    lowered = name.lower()
    matches = [p for p in _WINDOWS_BY_PREFIX if lowered.startswith(p)]
    if matches:
        return _WINDOWS_BY_PREFIX[max(matches, key=len)]
    return _WINDOWS_BY_FAMILY.get(family, 128_000)


def usage_tokens(usage: dict[str, Any]) -> tuple[int, int]:
    """(input, output) from one response's usage, whichever API's names it uses."""

    def first(*names: str) -> int:
        for name in names:
            value = usage.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
        return 0

    return (
        first("prompt_tokens", "input_tokens", "promptTokenCount"),
        first("completion_tokens", "output_tokens", "candidatesTokenCount"),
    )


def estimate_tokens(messages: list[Message]) -> int:
    chars = 0
    for message in messages:
        chars += len(message.content) + 16
        for call in message.tool_calls:
            chars += len(call.name) + len(call.raw_arguments or json.dumps(call.arguments, ensure_ascii=False))
    return chars // CHARS_PER_TOKEN


def elision_marker(message: Message) -> str:
    return (
        f"[output elided to keep the conversation within the context window: {len(message.content)} characters from "
        f"{message.name or 'a tool'} (call {message.tool_call_id}); call the tool again if you need it]"
    )


def compact(messages: list[Message], window: int) -> tuple[int, int, int]:
    """Elide older tool outputs in place when the conversation nears `window` tokens.
    Returns (outputs elided, tokens before, tokens after); (0, n, n) when nothing was needed."""
    before = estimate_tokens(messages)
    if before <= window * COMPACT_AT:
        return 0, before, before
    last_assistant = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=len(messages))
    elided, now = 0, before
    for i, message in enumerate(messages[:last_assistant]):
        if now <= window * COMPACT_TO:
            break
        if (
            message.role != "tool"
            or len(message.content) < MIN_ELIDED_CHARS
            or message.content.startswith("[output elided")
        ):
            continue
        marker = elision_marker(message)
        now -= (len(message.content) - len(marker)) // CHARS_PER_TOKEN
        messages[i] = message.model_copy(update={"content": marker})
        elided += 1
    return elided, before, estimate_tokens(messages)
