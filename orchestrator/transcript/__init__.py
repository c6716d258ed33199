"""The session transcript: JSONL, one event per line, written as it happens, so a crash keeps
everything up to the crash. Every outcome names its executor. Secrets are redacted on the way in.

Everything in an event may come from the box or the model, so every event is bounded here, in one
place no caller can skip: no line exceeds MAX_EVENT_BYTES (strings cut with a marker saying how
much was cut, lists and dicts bounded), and no line holds a raw control or bidi character.
Rendering for a terminal makes such characters visible (orchestrator/ground/text.py).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, TextIO

from sandbox_agent import jsonbound
from sandbox_agent.limits import SECRET_NAME_PATTERN

from ..boxfs.private import open_private
from ..errors import ErrorType, OpenAgentsError
from ..events import Event
from ..ground.text import json_line, visible
from ..protocol import Executor

if TYPE_CHECKING:  # for the annotation only: show_lines loads the painter when a transcript is shown
    from ..terminal.painter import Line

REDACTED = "[REDACTED]"
MAX_EVENT_BYTES = 64 * 1024  # one serialized line, all fields together
MAX_ITEMS = 256  # per list or dict, before any shrinking
MAX_KEY_CHARS = 128
MAX_DEPTH = 16
# Reading a transcript back (`transcript show`, resume): every line we write is at most
# MAX_EVENT_BYTES, so a longer one was not written by us and is passed over, never held whole;
# past MAX_READ_BYTES the file is not read on.
MAX_READ_LINE_BYTES = 4 * MAX_EVENT_BYTES
MAX_READ_BYTES = 256 << 20
_READ_CHUNK = 64 * 1024
_MIN_STRING = 64  # the smallest per-string bound tried before an event is replaced by a stub
_SECRET_PATTERNS = [
    re.compile(r"sk-[A-Za-z0-9_\-]{16,}"),
    re.compile(r"gh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"github_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"AIza[0-9A-Za-z_\-]{30,}"),
    re.compile(r"(?i)bearer\s+[A-Za-z0-9._\-]{16,}"),
]


SECRET_NAME = re.compile(SECRET_NAME_PATTERN, re.I)  # the agent's shell strips the same names


class Redactor:
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = sorted({s for s in secrets if s and len(s) >= 6}, key=len, reverse=True)

    @classmethod
    def from_environment(cls, extra: Iterable[str] = ()) -> "Redactor":
        """Every host variable whose name looks secret, plus the model key in use."""
        return cls([v for k, v in os.environ.items() if SECRET_NAME.search(k)] + list(extra))

    def add(self, values: Iterable[str]) -> None:
        """More values to redact from here on (a program's secret-looking `env`), by the same rule."""
        self.secrets = sorted({*self.secrets, *(s for s in values if s and len(s) >= 6)}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        for pattern in _SECRET_PATTERNS:
            text = pattern.sub(REDACTED, text)
        return text

    def deep(self, value: Any) -> Any:
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            return {k: self.deep(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.deep(v) for v in value]
        return value


class Transcript:
    def __init__(
        self,
        path: str | Path | None,
        redactor: Redactor | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        resume_seq: int | None = None,
    ) -> None:
        """`resume_seq`: the session is resumed and the file exists already; its records go on from
        this seq. The file is then opened without following a link and must be a regular file."""
        self.path = Path(path) if path else None
        self.redactor = redactor or Redactor.from_environment()
        self.on_event = on_event
        self._lock = threading.Lock()
        self._seq = resume_seq or 0
        self._fh: TextIO | None = None
        if self.path and resume_seq is not None:
            fd = _open_regular(self.path, os.O_RDWR | os.O_APPEND)
            size = os.fstat(fd).st_size
            self._fh = open(fd, "a", encoding="utf-8")
            if size and os.pread(fd, 1, size - 1) != b"\n":
                self._fh.write(
                    "\n"
                )  # a line cut short by a crash stays one unreadable line, not two records run together
        elif self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")
        self.events: list[dict[str, Any]] = []

    def event(self, type: str, executor: Executor | None = None, **fields: Any) -> dict[str, Any]:
        with self._lock:
            self._seq += 1
            record: dict[str, Any] = {"seq": self._seq, "ts": round(time.time(), 3), "type": type}
            if executor is not None:
                record["executor"] = executor.value
            # Shape and redact first (whole strings, so no secret is cut in two before it is
            # recognised; a box's meta can nest hundreds deep), then cut to size.
            shaped = _shape({k: v for k, v in fields.items() if k not in record}, self.redactor)
            record, line = _capped(record, shaped)
            self.events.append(record)
            if self._fh:
                self._fh.write(line + "\n")
                self._fh.flush()
        if self.on_event:
            self.on_event(record)
        return record

    def notify(self, event: Event) -> None:
        """Hand an ephemeral event (streamed output) to the subscriber only: redacted and bounded like
        the rest, but not written, so the transcript keeps one record of each output, the result."""
        if self.on_event is None:
            return
        fields = _shape(event.fields(), self.redactor)
        record, _ = _capped(
            {"type": event.type, **({"executor": event.executor.value} if event.executor else {})}, fields
        )
        self.on_event(record)

    def emit(self, event: Event) -> dict[str, Any]:
        """Record a typed event (the turn loop's); subscribers get the shaped, redacted record."""
        return self.event(event.type, executor=event.executor, **event.fields())

    def close(self) -> None:
        with self._lock:
            if self._fh:
                self._fh.close()
                self._fh = None


class _Cut(list[Any]):
    """A list already shortened by _shape: `dropped` items are gone."""

    dropped = 0


class _CutDict(dict[str, Any]):
    dropped = 0


def _shape(value: Any, redact: Callable[[str], str], depth: int = 0) -> Any:
    """Plain JSON values, redacted, at most MAX_ITEMS per list or dict and MAX_DEPTH deep; strings
    still whole. Recursion stops at MAX_DEPTH, so no nesting the box sends can exhaust the stack."""
    if isinstance(value, str):
        return redact(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        if depth >= MAX_DEPTH:
            return f"…[cut: a list nested deeper than {MAX_DEPTH}]"
        out = _Cut(_shape(v, redact, depth + 1) for v in value[:MAX_ITEMS])
        out.dropped = max(0, len(value) - MAX_ITEMS)
        return out
    if isinstance(value, dict):
        if depth >= MAX_DEPTH:
            return f"…[cut: a dict nested deeper than {MAX_DEPTH}]"
        cut = _CutDict()
        for k, v in list(value.items())[:MAX_ITEMS]:
            cut[_cut(redact(str(k)), MAX_KEY_CHARS)] = _shape(v, redact, depth + 1)
        cut.dropped = max(0, len(value) - MAX_ITEMS)
        return cut
    return _shape(_jsonable(value), redact, depth + 1)  # pydantic models, enums, paths


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}…[cut {len(text) - limit} chars]"


def _fit(value: Any, max_chars: int, max_items: int) -> Any:
    """The shaped value with every string at most `max_chars` and every list and dict at most
    `max_items` entries, each cut marked with how much was cut."""
    if isinstance(value, str):
        return _cut(value, max_chars)
    if isinstance(value, list):
        dropped = getattr(value, "dropped", 0) + max(0, len(value) - max_items)
        items = [_fit(v, max_chars, max_items) for v in value[:max_items]]
        return items + ([f"…[cut {dropped} items]"] if dropped else [])
    if isinstance(value, dict):
        dropped = getattr(value, "dropped", 0) + max(0, len(value) - max_items)
        out = {k: _fit(v, max_chars, max_items) for k, v in list(value.items())[:max_items]}
        if dropped:
            out["…"] = f"[cut {dropped} keys]"
        return out
    return value


def _capped(header: dict[str, Any], fields: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The record and its JSONL line, at most MAX_EVENT_BYTES: the per-string bound halves until
    the line fits; if even that fails, the fields give way to a stub that says so."""
    max_chars, max_items = MAX_EVENT_BYTES, MAX_ITEMS
    while True:
        record = {**header, **_fit(fields, max_chars, max_items)}
        line = json_line(record)
        if len(line.encode("utf-8", errors="surrogatepass")) <= MAX_EVENT_BYTES:
            return record, line
        if max_chars <= _MIN_STRING:
            record = {
                **header,
                "cut": f"event over {MAX_EVENT_BYTES} bytes even with every string at {max_chars} chars",
            }
            return record, json_line(record)
        max_chars, max_items = max(_MIN_STRING, max_chars // 2), max(8, max_items // 2)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if hasattr(value, "value"):
        return value.value
    return str(value)


def _open_regular(path: Path, flags: int) -> int:
    """An fd of the regular file at `path`: no link followed, no FIFO waited on; typed otherwise."""
    try:
        fd = open_private(path, flags | os.O_NONBLOCK)
    except FileNotFoundError:
        raise OpenAgentsError(ErrorType.FILE_NOT_FOUND, f"the transcript {visible(str(path))} does not exist") from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise OpenAgentsError(
                ErrorType.UNSAFE_WORKSPACE_FILE, f"the transcript {visible(str(path))} is a symbolic link: not followed"
            ) from None
        raise OpenAgentsError(
            ErrorType.IO_ERROR, f"the transcript {visible(str(path))}: {err.strerror or err}"
        ) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OpenAgentsError(ErrorType.NOT_REGULAR_FILE, f"the transcript {visible(str(path))} is not a regular file")
    os.set_blocking(fd, True)
    return fd


class Unreadable(str):
    """A transcript line that is no record: why (too long, not JSON, not an object), for the reader to count or say."""


def read_records(
    path: str | Path, max_line: int = MAX_READ_LINE_BYTES, max_total: int = MAX_READ_BYTES
) -> Iterator[dict[str, Any] | Unreadable]:
    """The transcript's records in order, read back bounded: the file is opened without following a
    link (a transcript given with --transcript may sit where the box writes); a line over
    `max_line` bytes is skipped unread, past its end, and said as Unreadable, as is one that is
    not a JSON object (each parse bounded in depth by jsonbound). Past `max_total` bytes:
    RESOURCE_EXHAUSTED, raised after the records before it."""
    fd = _open_regular(Path(path), os.O_RDONLY)
    with open(fd, "rb", buffering=0) as fh:
        pending, skipping, total = bytearray(), False, 0
        while True:
            chunk = fh.read(_READ_CHUNK)
            if not chunk:
                break
            total += len(chunk)
            if total > max_total:
                raise OpenAgentsError(
                    ErrorType.RESOURCE_EXHAUSTED,
                    f"the transcript {visible(str(path))} is over {max_total >> 20} MiB: not read on",
                )
            start = 0
            while True:
                end = chunk.find(b"\n", start)
                piece = chunk[start:] if end < 0 else chunk[start:end]
                if not skipping:
                    pending += piece
                    if len(pending) > max_line:
                        pending.clear()
                        skipping = True
                        yield Unreadable(f"a line over {max_line} bytes")
                if end < 0:
                    break
                if not skipping and pending.strip():
                    yield _record(bytes(pending))
                pending.clear()
                skipping = False
                start = end + 1
        if not skipping and pending.strip():
            yield _record(bytes(pending))


def _record(line: bytes) -> dict[str, Any] | Unreadable:
    try:
        value = jsonbound.loads(line)
    except (ValueError, UnicodeDecodeError) as err:
        return Unreadable(f"not JSON ({str(err)[:80]})")
    return value if isinstance(value, dict) else Unreadable(f"not an event (a JSON {type(value).__name__})")


def show(path: str | Path) -> Iterable[str]:
    """The transcript's lines rendered for a terminal: secrets redacted, control characters visible."""
    return (line.text for line in show_lines(path))


def show_lines(path: str | Path, full: bool = False) -> Iterable[Line]:
    """As show(), with each line's style (diffs are coloured on a terminal); each result under its
    call, as its tail or (`full`) whole."""
    from ..terminal.painter import Line, Painter

    painter = Painter(full=full)
    redactor = Redactor.from_environment()
    try:
        for record in read_records(path):
            if isinstance(record, Unreadable):
                yield Line(visible(f"(unreadable line: {redactor(record)})"))
                continue
            yield from painter.lines(redactor.deep(record))
    except OpenAgentsError as err:
        if err.type != ErrorType.RESOURCE_EXHAUSTED:
            raise
        yield Line(visible(f"(stopped: {err.message})"))


def resolve_transcript(path_or_id: str) -> Path:
    """`transcript show`'s argument: a transcript file, or a session id (its recorded transcript)."""
    from ..errors import ErrorType, OpenAgentsError
    from ..workspace.records import open_own_record

    path = Path(path_or_id)
    if path.is_file():
        return path
    if path.exists():
        raise OpenAgentsError(ErrorType.NOT_A_FILE, f"{path_or_id} is not a transcript file")
    try:
        record = open_own_record(path_or_id)
    except OpenAgentsError as err:
        if err.type == ErrorType.INVALID_ARGUMENTS:  # not shaped like an id either
            raise OpenAgentsError(
                ErrorType.FILE_NOT_FOUND,
                f"{path_or_id}: no such transcript file, and not a session id (see `oa-sandbox transcript list`)",
            ) from None
        raise
    if not record.transcript or not Path(record.transcript).is_file():
        why = " (the session was discarded)" if record.discarded else ""
        raise OpenAgentsError(ErrorType.FILE_NOT_FOUND, f"session {record.id} has no transcript left{why}")
    return Path(record.transcript)


def list_transcripts() -> list[tuple[float, str, str, str]]:
    """(time, session id, status, transcript path) of every recorded session's transcript, newest first."""
    from ..workspace.records import list_sessions

    out = []
    for record in list_sessions():
        if record.transcript and Path(record.transcript).is_file():
            out.append((record.created, record.id, record.status, record.transcript))
    return sorted(out, reverse=True)
