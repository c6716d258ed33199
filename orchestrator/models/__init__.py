"""Model clients. Keys live only in this process. base.py is the model-neutral conversation every
layer shares; dialects/ holds one file per model family (OpenAI-compatible, Gemini, Anthropic: wire
format, tool declarations, answers, errors, usage); http.py is the one HTTP client that speaks any
dialect; stream.py parses server-sent events with bounds; script.py replays a recorded
conversation; factory.py, above them all, makes a client from a `--model` spec (imported from
there, so that loading the shared types loads no client)."""

from .base import Message, ModelClient, ModelTurn, ToolCall

__all__ = ["Message", "ModelClient", "ModelTurn", "ToolCall"]
