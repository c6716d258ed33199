"""Server-sent events from a model API, parsed as the untrusted input they are.

One parser for every streaming client (OpenAI-compatible, Gemini's `alt=sse`, Anthropic's event
stream). It is bounded everywhere the other side chooses a size: a line, an event's data, the whole
stream, the number of events; each event's JSON has its nesting counted before it is parsed
(sandbox_agent/jsonbound). Whatever breaks a bound, is no UTF-8 or no JSON is a typed
MODEL_API_ERROR naming what and where, never a crash or an unbounded buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from pydantic import BaseModel, Field

from sandbox_agent import jsonbound

from ..errors import ErrorType, OpenAgentsError


class StreamLimits(BaseModel):
    max_line_bytes: int = Field(default=1 << 20, ge=64)  # one `data:` line
    max_event_bytes: int = Field(default=4 << 20, ge=64)  # one event's data, its lines joined
    max_total_bytes: int = Field(default=64 << 20, ge=64)  # the whole answer
    max_events: int = Field(default=200_000, ge=1)


@dataclass(frozen=True)
class SSEEvent:
    event: str  # the `event:` field; "message" when there was none
    data: Any  # the parsed JSON of its data; None for OpenAI's `[DONE]`
    done: bool = False


def _too_much(what: str, size: int, limit: int) -> OpenAgentsError:
    return OpenAgentsError(
        ErrorType.MODEL_API_ERROR, f"the model's stream broke a bound: {what} over {limit} bytes ({size}+)"
    )


def sse_events(chunks: Iterable[bytes], limits: StreamLimits | None = None) -> Iterator[SSEEvent]:
    """The events of a text/event-stream body, given its bytes in whatever pieces they arrive.

    Lines end with LF, CRLF or CR; `:` starts a comment (a keep-alive); `data:` lines of one event
    are joined with LF; a blank line ends the event; `id:` and `retry:` are read and ignored. An
    event with no data is skipped (SSE says so). The stream's end dispatches nothing half-made."""
    limits = limits or StreamLimits()
    buffer = bytearray()
    total = 0
    count = 0
    name = ""
    data: list[bytes] = []
    data_size = 0
    for chunk in chunks:
        total += len(chunk)
        if total > limits.max_total_bytes:
            raise _too_much("the whole answer", total, limits.max_total_bytes)
        buffer += chunk
        while True:
            cut = _line_end(buffer)
            if cut is None:
                if len(buffer) > limits.max_line_bytes:
                    raise _too_much("one line", len(buffer), limits.max_line_bytes)
                break
            end, after = cut
            if end > limits.max_line_bytes:
                raise _too_much("one line", end, limits.max_line_bytes)
            line = bytes(buffer[:end])
            del buffer[:after]
            if not line:  # the event is complete
                if data:
                    count += 1
                    if count > limits.max_events:
                        raise OpenAgentsError(
                            ErrorType.MODEL_API_ERROR,
                            f"the model's stream broke a bound: over {limits.max_events} events",
                        )
                    yield _event(name, b"\n".join(data))
                name, data, data_size = "", [], 0
                continue
            if line.startswith(b":"):
                continue
            field, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
            if field == b"data":
                data_size += len(value) + 1
                if data_size > limits.max_event_bytes:
                    raise _too_much("one event", data_size, limits.max_event_bytes)
                data.append(value)
            elif field == b"event":
                name = _text(value, "an event name")[:100]


def _line_end(buffer: bytearray) -> tuple[int, int] | None:
    """(where the first line ends, where the next begins), or None while no line is complete. A CR
    at the buffer's end waits: an LF may follow in the next piece."""
    lf = buffer.find(b"\n")
    cr = buffer.find(b"\r", 0, lf if lf >= 0 else len(buffer))
    if cr >= 0:
        if cr + 1 == len(buffer):
            return None
        return cr, cr + 2 if buffer[cr + 1 : cr + 2] == b"\n" else cr + 1
    if lf >= 0:
        return lf, lf + 1
    return None


def _text(value: bytes, what: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise OpenAgentsError(ErrorType.MODEL_API_ERROR, f"the model's stream sent {what} that is not UTF-8") from None


def _event(name: str, raw: bytes) -> SSEEvent:
    if raw.strip() == b"[DONE]":
        return SSEEvent(name or "message", None, done=True)
    try:
        data = jsonbound.loads(raw)
    except jsonbound.TooDeep:
        raise OpenAgentsError(
            ErrorType.MODEL_API_ERROR,
            f"the model's stream sent an event nested deeper than {jsonbound.MAX_DEPTH} levels",
        ) from None
    except ValueError:
        raise OpenAgentsError(
            ErrorType.MODEL_API_ERROR, f"the model's stream sent an event that is not JSON: {raw[:120]!r}"
        ) from None
    return SSEEvent(name or "message", data)
