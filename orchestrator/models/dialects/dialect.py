"""What a model family is, as one object: everything the HTTP client (models/http.py) must know
about a family's wire, and nothing else. A family file (openai.py, gemini.py, anthropic.py) is one
subclass of `Dialect` and one instance of it; it imports this module and the shared types
(models/base.py, models/stream.py), never another family and never the client, so a new family is
one new file plus its line in the registry (dialects/__init__.py).

A dialect is data in, data out: it builds a request body from our conversation, declares a tool in
the family's shape, reads an answer (whole or streamed) into a ModelTurn, and says what a refusal
means. Sockets, retries, timeouts and bounds are the client's; so each dialect is testable alone,
with dicts."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from ...errors import ErrorType, OpenAgentsError
from ..base import Message, ModelTurn, RetryableModelError, TextSink, ToolCall, parse_arguments
from ..stream import SSEEvent

MAX_STREAMED_CALLS = 128  # tool calls in one streamed answer: indexes past it are refused, not allocated
MAX_STREAMED_ARGUMENT_CHARS = 4 << 20  # one streamed call's arguments, assembled from pieces


class Assembler(ABC):
    """Builds one ModelTurn from one streamed answer's events (a new one per attempt). `shown` says
    whether any text went to the watcher already: after that an attempt that fails is not made again
    (the text would be said twice), it is a typed error. A stream that stops before its family's end
    marker (`finished` never set) is worth another try while nothing was shown."""

    end_marker: ClassVar[str]  # what says the answer is complete, named in the error when it never came

    def __init__(self, dialect: "Dialect", on_text: TextSink | None) -> None:
        self.dialect = dialect
        self.on_text = on_text
        self.shown = False
        self.usage: dict[str, Any] = {}
        self.finished = False

    def say(self, piece: str) -> None:
        if piece and self.on_text is not None:
            self.shown = True
            self.on_text(piece)

    def data(self, event: SSEEvent) -> dict[str, Any]:
        if not isinstance(event.data, dict):
            raise self.dialect.unexpected(TypeError("an event is no object"), event.data)
        return event.data

    def turn(self) -> ModelTurn:
        if not self.finished:
            raise RetryableModelError(f"the stream ended before the answer did ({self.end_marker})")
        return self.assembled()

    @abstractmethod
    def feed(self, event: SSEEvent) -> None: ...

    @abstractmethod
    def assembled(self) -> ModelTurn: ...


class Dialect(ABC):
    """One model family's wire format. Class attributes are the family's constants; the methods
    are pure (no I/O), so the request a family receives and the turn it yields are testable as data."""

    family: ClassVar[str]  # the `--model FAMILY:NAME` prefix, and which declarations the model receives
    what: ClassVar[str]  # how errors name the server: "the Gemini API"
    key_variable: ClassVar[str]  # where its key comes from unless --api-key-env names another

    @abstractmethod
    def default_url(self) -> str:
        """The endpoint when --base-url gives none (read when a client is made: a variable may be set late)."""

    @abstractmethod
    def url(self, base_url: str, model: str, stream: bool) -> str: ...

    @abstractmethod
    def headers(self, key: str) -> dict[str, str]:
        """The key's header; none when the key is empty (a local server may need no key)."""

    @abstractmethod
    def request(self, model: str, messages: list[Message], tools: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
        """The body: `tools` are this family's declarations (declare()), passed through as given."""

    @abstractmethod
    def declare(self, name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
        """One tool as this family declares it, from a JSON schema cleaned of pydantic's extras
        (tools/declarations.py); the built-in tools and MCP tools alike."""

    @abstractmethod
    def parse(self, data: dict[str, Any]) -> ModelTurn:
        """A whole answer (also what a server that ignored `stream` sends); an unexpected shape is a
        typed MODEL_API_ERROR, never a KeyError."""

    @abstractmethod
    def assembler(self, on_text: TextSink | None) -> Assembler: ...

    def retryable(self, status: int) -> bool:
        """429 and 5xx (Anthropic's 529 overloaded among them) are worth another try; other 4xx are not."""
        return status == 429 or status >= 500

    def unexpected(self, err: Exception, data: Any) -> OpenAgentsError:
        return OpenAgentsError(
            ErrorType.MODEL_API_ERROR,
            f"{self.what} answered in an unexpected shape ({type(err).__name__}: {err}): {str(data)[:200]}",
        )


def arguments_object(call: ToolCall) -> dict[str, Any]:
    """A past call's arguments as the object families that send objects (Gemini, Anthropic) need;
    arguments that never parsed go back as {} (the model was told why in the call's result)."""
    try:
        return parse_arguments(call.arguments)
    except OpenAgentsError:
        return {}
