"""The turn loop's points (loop/__init__.py): BeforeAgent and AfterAgent around a prompt, BeforeToolSelection,
BeforeModel and AfterModel around each model request, PreCompress when the conversation is
compacted. A block or a `continue: false` at one of them ends the session, typed."""

from __future__ import annotations

from typing import Any

from ..errors import ErrorType, OpenAgentsError
from ..models.base import Message
from .engine import Hooks, Verdict

MESSAGES_SHOWN = 20
MESSAGE_CAP = 8000


def _check(verdict: Verdict, what: str) -> Verdict:
    if verdict.stop:
        raise OpenAgentsError(ErrorType.HOOK_STOPPED, f"a hook stopped the session at {what}: {verdict.stop_reason}")
    if verdict.blocked:
        kind = ErrorType.HOOK_STOPPED if verdict.error_type == ErrorType.REJECTED_BY_USER else verdict.error_type
        raise OpenAgentsError(kind, f"a hook blocked {what}: {verdict.reason}")
    return verdict


def _messages(messages: list[Message]) -> list[dict[str, Any]]:
    return [
        {"role": m.role, "content": (m.content or "")[:MESSAGE_CAP], "name": m.name} for m in messages[-MESSAGES_SHOWN:]
    ]


def before_agent(hooks: Hooks | None, prompt: str) -> str:
    """The context BeforeAgent hooks add to the prompt; raises when one blocks it."""
    if hooks is None or not hooks.active("BeforeAgent"):
        return ""
    verdict = _check(hooks.fire("BeforeAgent", {"prompt": prompt[:MESSAGE_CAP]}), "the prompt (BeforeAgent)")
    return ("\n\n[context from the user's hooks]\n" + verdict.context_text()) if verdict.context else ""


def after_agent(hooks: Hooks | None, prompt: str, status: str, final_text: str) -> None:
    if hooks is not None and hooks.active("AfterAgent"):
        hooks.fire(
            "AfterAgent",
            {"prompt": prompt[:MESSAGE_CAP], "status": status, "prompt_response": final_text[:MESSAGE_CAP]},
        )


def select_tools(hooks: Hooks | None, tools: list[dict[str, Any]], name_of: Any) -> list[dict[str, Any]]:
    """BeforeToolSelection: the declarations offered, narrowed to what the hooks allow (never widened)."""
    if hooks is None or not hooks.active("BeforeToolSelection"):
        return tools
    verdict = _check(hooks.fire("BeforeToolSelection", {"tools": [name_of(t) for t in tools]}), "the tool selection")
    if verdict.allowed_tools is None:
        return tools
    return [t for t in tools if name_of(t) in verdict.allowed_tools]


def before_model(hooks: Hooks | None, messages: list[Message], turn: int, model: str) -> None:
    if hooks is not None and hooks.active("BeforeModel"):
        _check(
            hooks.fire("BeforeModel", {"turn": turn, "llm_request": {"model": model, "messages": _messages(messages)}}),
            "the model request (BeforeModel)",
        )


def after_model(hooks: Hooks | None, text: str, tool_calls: list[dict[str, Any]], turn: int) -> None:
    if hooks is not None and hooks.active("AfterModel"):
        _check(
            hooks.fire(
                "AfterModel",
                {"turn": turn, "llm_response": {"text": text[:MESSAGE_CAP], "tool_calls": tool_calls[:50]}},
            ),
            "the model's response (AfterModel)",
        )


def pre_compress(hooks: Hooks | None, turn: int, tokens: int, window: int) -> None:
    if hooks is not None and hooks.active("PreCompress"):
        hooks.fire(
            "PreCompress",
            {"turn": turn, "trigger": "auto", "context_tokens": tokens, "context_window": window},
            trigger="auto",
        )
