"""A scripted model: replays recorded turns from a JSONL file, so a session runs with no key and no
network (the README's main job, deterministic tests).

Each line: {"text": "...", "tool_calls": [{"name": "read_file", "arguments": {...}}]}, optionally
"usage": {"prompt_tokens": N, "completion_tokens": N} as a real API reports it.
A line with no tool calls is the final answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandbox_agent import jsonbound

from ..errors import ErrorType, OpenAgentsError
from .base import Message, ModelTurn, TextSink, ToolCall


class ScriptedModel:
    family = "openai"

    def __init__(self, turns: list[ModelTurn], name: str = "script") -> None:
        self.name = name
        self._turns = turns
        self._next = 0

    @classmethod
    def load(cls, path: str) -> "ScriptedModel":
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as err:
            raise OpenAgentsError(
                ErrorType.CONFIG_INVALID, f"cannot read the model script {path}: {err.strerror}"
            ) from None
        turns = []
        for number, line in enumerate(lines, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                raw = jsonbound.loads(line)
                calls = [
                    ToolCall(id=c.get("id") or f"call_{number}_{i}", name=c["name"], arguments=c.get("arguments"))
                    for i, c in enumerate(raw.get("tool_calls") or [])
                ]
                turns.append(ModelTurn(text=raw.get("text", ""), tool_calls=calls, usage=raw.get("usage") or {}))
            except (ValueError, KeyError, TypeError, AttributeError) as err:
                raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"{path}:{number}: not a model turn ({err})") from None
        return cls(turns, name=f"script:{Path(path).name}")

    def complete(
        self, messages: list[Message], tools: list[dict[str, Any]], on_text: TextSink | None = None
    ) -> ModelTurn:
        """A replay: nothing is streamed (the turn is whole at once)."""
        if self._next >= len(self._turns):
            return ModelTurn(text="(the script has no more turns)")
        turn = self._turns[self._next]
        self._next += 1
        return turn
