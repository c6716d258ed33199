"""`oa-sandbox run --output stream-json`: the session's typed events on stdout, one JSON object a
line, as they happen (as `claude -p --output-format stream-json` and `codex exec --json` do).

Each line is a record the transcript shaped (orchestrator/transcript.py: redacted, at most 64 KiB)
or a live one it handed on (model_text, tool_output, budget), written with json_line: whatever the
box or the model put in a string reaches stdout as a JSON escape, never as a raw control byte.
The loop's own session_end is held back: the stream's last line is always one session_end that
carries the summary `--output json` prints (set-up errors and Ctrl-C included), so a script reads
lines until that one. No line is over terminal.machine.MAX_LINE_BYTES (1 MiB): the summary's lists
are bounded, and an event still over it keeps its small values only. Several threads
report events (parallel reads, streamed output): one lock keeps every line whole.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, TextIO

from ..ground.text import json_line
from ..terminal.machine import MAX_LINE_BYTES, fit_json

END_TYPE = "session_end"


def end_line(summary: dict[str, Any]) -> str:
    """The stream's last line: the summary object, typed."""
    return json_line({"type": END_TYPE, **summary})


class StreamJson:
    def __init__(self, out: TextIO | None = None) -> None:
        self._out = out if out is not None else sys.stdout
        self._lock = threading.Lock()
        self._closed = False  # the reader went away: the session goes on, its events go nowhere

    def on_event(self, record: dict[str, Any]) -> None:
        if record.get("type") == END_TYPE:
            return  # said once, with the summary, by end()
        line = json_line(record)
        self._write(
            line if len(line) <= MAX_LINE_BYTES // 4 or len(line.encode()) <= MAX_LINE_BYTES else fit_json(record)
        )

    def end(self, summary: dict[str, Any]) -> None:
        self._write(end_line(summary))

    def _write(self, line: str) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                self._out.write(line + "\n")
                self._out.flush()
            except (OSError, ValueError):  # a closed pipe (`| head -3`), a closed stream
                self._closed = True
