"""Model clients: OpenAI-compatible, Gemini, Anthropic, and a scripted replay. Keys live only in this
process. base.py is the layer every client shares; factory.py, above the clients, makes one from a
`--model` spec (imported from there, so that loading the shared types loads no client)."""
from ..tools.call import ToolCall
from .base import Message, ModelClient, ModelTurn

__all__ = ["Message", "ModelClient", "ModelTurn", "ToolCall"]
