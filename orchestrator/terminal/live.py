"""What `oa-sandbox run` shows while it runs, on stderr: the painter's lines (coloured on a terminal,
plain when stderr is a file or a pipe), and a live elapsed-time line for any call running over a
second (a spinner line on a terminal; a plain line now and then otherwise).

rich draws the terminal: the field's standard, and it keeps the live line below the printed ones.
Nothing from the box or the model reaches it unescaped: the painter has made every line visible,
and lines go in as rich Text (never markup).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rich.console import Console
from rich.status import Status
from rich.text import Text

from ..events import (
    ModelRequested,
    ModelResponded,
    ModelRetrying,
    ModelTextStreamed,
    SessionEnded,
    SessionStarted,
    ToolCallChanged,
    ToolCallFinished,
    ToolCallState,
    ToolOutputStreamed,
    parse,
)
from ..ground.text import continued, visible
from .painter import Line, Painter, diff_lines

ELAPSED_AFTER_S = 1.0
PLAIN_NOTICES_S = (1, 5, 15, 30, 60, 120, 300, 600)  # when stderr is no terminal: a line at each
TAIL_LINES = 5  # of a running command's output, under the elapsed-time line on a terminal
PLAIN_STREAM_LINES = 40  # printed as they come when stderr is no terminal; the result has the rest
MODEL_TEXT_SHOWN = 100_000  # characters of one streamed answer said live; the transcript has all of it
MODEL_PREFIX = "◆ model: "


class LiveView:
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, highlight=False, markup=False, emoji=False, soft_wrap=True)
        self.painter = Painter()
        self._lock = threading.RLock()
        self._running: dict[str, tuple[str, float]] = {}  # call id -> (tool, started)
        self._notified: dict[str, int] = {}
        self._status: Status | None = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._seen_once: set[str] = set()
        self.header_notes: list[str] = []  # said right under the task line (e.g. that --auto-approve is on)
        self._tails: dict[str, list[str]] = {}  # call id -> the last lines of its streamed output
        self._partial: dict[str, str] = {}
        self._streamed_lines: dict[str, int] = {}
        self._waiting: float | None = None  # since when the model has been asked and has said nothing
        self._waited_notice = 0
        self._text_turn: int | None = None  # the turn whose streamed text is being printed
        self._text_open = False  # a streamed line is printed without its end yet
        self._text_chars = 0
        self._text_cr = ""
        self._streamed_turns: set[int] = set()

    @property
    def terminal(self) -> bool:
        return self.console.is_terminal

    # -- lines ----------------------------------------------------------------------------------
    def print(self, lines: list[Line]) -> None:
        with self._lock:
            if lines:
                self._close_text()
            for line in lines:
                self.console.print(Text(line.text, style=line.style or "") if self.terminal else Text(line.text))

    def note(self, text: str, style: str | None = None) -> None:
        """One of our own lines (visible already)."""
        self.print([Line(text, style)])

    def once(self, key: str, text: str) -> None:
        """A warning or hint said once per session, however often its cause repeats."""
        if key not in self._seen_once:
            self._seen_once.add(key)
            self.note(text)

    def show_diff(self, diff: str) -> None:
        """At an approval prompt: what the edit would change."""
        self.print(diff_lines(diff, indent="  "))

    def on_event(self, record: dict[str, Any]) -> None:
        event = parse(record)
        if event is None:
            return
        if isinstance(event, ToolOutputStreamed):
            self._output(event.call_id, event.text)
            return
        if isinstance(event, ModelTextStreamed):
            self._model_text(event.turn, event.text)
            return
        if isinstance(event, ModelRequested):
            self._streamed_turns.discard(event.turn)
            self._wait_for_model()
        elif isinstance(event, (ModelResponded, ModelRetrying, SessionEnded)):
            self._stop_waiting()
        if isinstance(event, ModelResponded) and event.turn in self._streamed_turns:
            with self._lock:
                self._close_text()  # said as it came: not again
            return
        if isinstance(event, ToolCallChanged) and event.state is ToolCallState.EXECUTING:
            self._started(event.call_id, event.tool)
        elif isinstance(event, ToolCallFinished):
            self._ended(event.call_id)
        self.print(self.painter.event_lines(event))
        if isinstance(event, SessionStarted):
            self.print([Line(note) for note in self.header_notes])

    # -- the model's text as it arrives, and the line while it thinks -----------------------------
    def _model_text(self, turn: int, text: str) -> None:
        """Each piece printed as it comes (no line waits for its end), made visible, every line after
        the first behind the continuation mark; bounded per answer."""
        self._stop_waiting()
        with self._lock:
            if self._text_turn != turn or turn not in self._streamed_turns:
                self._close_text()
                self._text_turn, self._text_chars = turn, 0
                self._streamed_turns.add(turn)
                self.console.print(Text(MODEL_PREFIX), end="")
                self._text_open = True
            if self._text_chars >= MODEL_TEXT_SHOWN:
                return
            text = self._text_cr + text
            self._text_cr = "\r" if text.endswith("\r") else ""  # a CRLF cut in two is one line end
            text = text[:-1] if self._text_cr else text
            if self._text_chars == 0:
                text = text.lstrip()
            room = MODEL_TEXT_SHOWN - self._text_chars
            piece = continued(text[:room])
            if len(text) > room:
                piece += " … (the rest of this answer is in the transcript)"
            self._text_chars += len(text)
            if piece:
                self.console.print(Text(piece), end="")
                self._text_open = True

    def _close_text(self) -> None:
        if self._text_open:
            self._text_open = False
            self._text_cr = ""
            self.console.print(Text(""))  # the streamed answer's last line ends

    def _wait_for_model(self) -> None:
        with self._lock:
            self._waiting = time.monotonic()
            self._waited_notice = 0
            self._ensure_ticker()

    def _stop_waiting(self) -> None:
        with self._lock:
            if self._waiting is None:
                return
            self._waiting = None
            if not self._running and self._status is not None:
                self._status.stop()
                self._status = None

    # -- the elapsed-time line ------------------------------------------------------------------
    def _ensure_ticker(self) -> None:
        if self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="oa-elapsed", daemon=True)
            self._ticker.start()

    def _started(self, call_id: str, tool: str) -> None:
        with self._lock:
            self._running[call_id] = (tool, time.monotonic())
            self._ensure_ticker()

    def _output(self, call_id: str, text: str) -> None:
        """Streamed output: a bounded tail under the live line on a terminal, else the first lines as
        they come. Each line is made visible: the box wrote it."""
        with self._lock:
            text = self._partial.pop(call_id, "") + text
            lines = text.split("\n")
            self._partial[call_id] = lines.pop()[-400:]
            if not lines:
                return
            if self.terminal:
                self._tails[call_id] = (self._tails.get(call_id, []) + [visible(line[:200]) for line in lines])[
                    -TAIL_LINES:
                ]
                return
            shown = self._streamed_lines.get(call_id, 0)
            for line in lines:
                if shown < PLAIN_STREAM_LINES:
                    self.console.print(Text("    ┆ " + visible(line[:200])))
                elif shown == PLAIN_STREAM_LINES:
                    self.console.print(Text("    ┆ … (more output; the result has it)"))
                shown += 1
            self._streamed_lines[call_id] = shown

    def _ended(self, call_id: str) -> None:
        with self._lock:
            shown = self._streamed_lines.get(call_id, 0)
            if 0 < shown <= PLAIN_STREAM_LINES and not self._partial.get(call_id, "").strip():
                self.painter.said.add(call_id)  # every line is on the screen already, under its call
            self._running.pop(call_id, None)
            self._notified.pop(call_id, None)
            self._tails.pop(call_id, None)
            self._partial.pop(call_id, None)
            self._streamed_lines.pop(call_id, None)
            if not self._running and self._status is not None:
                self._status.stop()
                self._status = None

    def _tick(self) -> None:
        while not self._stop.wait(0.25):
            with self._lock:
                now = time.monotonic()
                long = [
                    (cid, tool, now - start)
                    for cid, (tool, start) in self._running.items()
                    if now - start >= ELAPSED_AFTER_S
                ]
                if not long:
                    self._tick_waiting(now)
                    continue
                if self.terminal:
                    text = "running: " + ", ".join(f"{tool} {elapsed:.0f} s" for _, tool, elapsed in long)
                    tail = [line for cid, _, _ in long for line in self._tails.get(cid, [])][-TAIL_LINES:]
                    text += "".join("\n  ┆ " + line for line in tail)
                    if self._status is None:
                        self._status = self.console.status(text)
                        self._status.start()
                    else:
                        self._status.update(text)
                    continue
                for cid, tool, elapsed in long:
                    due = [s for s in PLAIN_NOTICES_S if s <= elapsed]
                    if due and self._notified.get(cid, 0) < due[-1]:
                        self._notified[cid] = due[-1]
                        self.console.print(Text(f"  … {tool} still running ({due[-1]} s)"))

    def _tick_waiting(self, now: float) -> None:
        """While the model thinks: a spinner line on a terminal, a plain line now and then otherwise."""
        if self._waiting is None or now - self._waiting < ELAPSED_AFTER_S:
            return
        waited = now - self._waiting
        if self.terminal:
            text = f"waiting for the model: {waited:.0f} s"
            if self._status is None:
                self._status = self.console.status(text)
                self._status.start()
            else:
                self._status.update(text)
            return
        due = [s for s in PLAIN_NOTICES_S if s <= waited]
        if due and self._waited_notice < due[-1]:
            self._waited_notice = due[-1]
            self.console.print(Text(f"  … waiting for the model ({due[-1]} s)"))

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            if self._status is not None:
                self._status.stop()
                self._status = None
