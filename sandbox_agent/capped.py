"""A command's output held within its bound: the head and the tail of the stream, its byte and
line counts, and a coalesced live tail for streaming. Memory stays bounded whatever the command
prints (shell.py's commands write into one of these)."""

from __future__ import annotations

import codecs
import time

from . import limits

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start 10-25 ms
if TYPE_CHECKING:
    from typing import Callable

STREAM_EVERY_S = 0.2  # output chunks are coalesced: at most one message per interval
STREAM_CHUNK_CHARS = 4096  # and each bounded: a live tail, never the whole output (the result has that)


class CappedOutput:
    """Keeps the head and the tail of the stream, and counts its bytes and lines; memory stays
    bounded whatever the command prints."""

    def __init__(self, on_output: Callable[[str], None] | None = None) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.newlines = 0
        self.last_byte: int | None = None
        self.before_tail: int | None = None  # the last byte dropped before the tail, once any was
        self.omitted_bytes = self.omitted_lines = 0  # set by text()
        self.on_output = on_output
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._unsent = ""
        self._last_sent = 0.0

    @property
    def waiting(self) -> bool:
        """Streamed output not sent yet: send it if nothing follows within STREAM_EVERY_S."""
        return bool(self._unsent) and self.on_output is not None

    def stream(self, chunk: bytes, final: bool = False, flush: bool = False) -> None:
        """Hand the caller the newest output, coalesced and bounded (its tail when there is more)."""
        if self.on_output is None:
            return
        self._unsent = (self._unsent + self._decoder.decode(chunk, final))[-STREAM_CHUNK_CHARS:]
        now = time.monotonic()
        if self._unsent and (final or flush or now - self._last_sent >= STREAM_EVERY_S):
            text, self._unsent, self._last_sent = self._unsent, "", now
            try:
                self.on_output(text)
            except Exception:  # noqa: BLE001 - the live view must never break the command's result
                self.on_output = None

    def add(self, chunk: bytes) -> None:
        self.stream(chunk)
        head_cap, tail_cap = limits.SHELL_OUTPUT_HEAD_BYTES, limits.SHELL_OUTPUT_TAIL_BYTES
        self.total += len(chunk)
        self.newlines += chunk.count(b"\n")
        if chunk:
            self.last_byte = chunk[-1]
        room = head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > tail_cap:
                cut = len(self.tail) - tail_cap
                self.before_tail = self.tail[cut - 1]
                del self.tail[:cut]

    @property
    def lines(self) -> int:
        """Lines in the whole output; a last one without a newline counts."""
        return self.newlines + (self.total > 0 and self.last_byte != NL)

    def text(self) -> tuple[str, bool]:
        """The output, or its head and tail around one marker saying how many bytes and lines were
        left out. The cuts fall between lines where there are lines near them (within the kept part's
        second half for the head, first half for the tail), else inside the line but never inside a
        UTF-8 character: no fragment of a line or U+FFFD made by the cut."""
        head, tail = bytes(self.head), bytes(self.tail)
        if self.total <= len(head) + len(tail):
            return (head + tail).decode("utf-8", errors="replace"), False
        head = head[: _head_end(head)]
        start = _tail_start(tail, self.before_tail)
        ends_line = (tail[start - 1] if start else self.before_tail) == NL
        tail = tail[start:]
        self.omitted_bytes = self.total - len(head) - len(tail)
        self.omitted_lines = self.newlines - head.count(b"\n") - tail.count(b"\n") + (not ends_line)
        mid_line = not ends_line or not head.endswith(b"\n")
        marker = (
            f"[... {self.omitted_bytes} bytes ({self.omitted_lines} line{'s' if self.omitted_lines != 1 else ''}"
            f"{', cut mid-line' if mid_line else ''}) omitted ...]\n"
        )
        text = head.decode("utf-8", errors="replace")
        if text and not text.endswith("\n"):
            text += "\n"
        return text + marker + tail.decode("utf-8", errors="replace"), True


NL = ord("\n")


def _head_end(head: bytes) -> int:
    """Where the kept head ends: after its last newline in its second half, else before a character
    the cap split (a UTF-8 lead byte whose sequence runs past the end)."""
    newline = head.rfind(b"\n", len(head) // 2)
    if newline >= 0:
        return newline + 1
    for back in range(1, min(4, len(head)) + 1):
        byte = head[-back]
        if byte < 0x80:
            break
        if byte >= 0xC0:
            size = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(head) - back if size > back else len(head)
    return len(head)


def _tail_start(tail: bytes, before: int | None) -> int:
    """Where the kept tail starts: where it is, if a line starts there; after the first newline in
    its first half; else after the continuation bytes of a character the cap split."""
    if before == NL:
        return 0
    newline = tail.find(b"\n", 0, len(tail) // 2)
    if newline >= 0:
        return newline + 1
    start = 0
    while start < min(3, len(tail)) and 0x80 <= tail[start] < 0xC0:
        start += 1
    return start
