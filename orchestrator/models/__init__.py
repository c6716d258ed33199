"""Model clients: OpenAI-compatible, Gemini, and a scripted replay. Keys live only in this process."""
from .base import Message, ModelClient, ModelTurn, ToolCall, model_from_spec

__all__ = ["Message", "ModelClient", "ModelTurn", "ToolCall", "model_from_spec"]
