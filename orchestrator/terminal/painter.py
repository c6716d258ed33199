"""Session events as lines for a person: the live run and `transcript show` read the same way.

Each result is printed right under its call: a call's header (`→ shell command=...`) is printed when
it starts running or is decided, and printed again above its result if anything came between. Every
string here may come from the box or the model: each line is made visible (orchestrator/ground/text.py)
and continuation lines are marked, before any colour is added by the front-end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..events import (
    ApprovalDecided,
    ContextCompacted,
    EgressRecorded,
    Event,
    HookRan,
    ModelResponded,
    ModelRetrying,
    SandboxStartQueued,
    SessionEnded,
    SessionResumed,
    SessionStarted,
    ToolCallChanged,
    ToolCallFinished,
    ToolCallState,
    parse,
)
from ..ground.text import continued, visible

DIFF_LINES_SHOWN = 120
RESULT_TAIL_LINES = 8  # of a result's output, under its status line (the end of a test run says how it went)
RESULT_LINE_CHARS = 200  # of each of those lines
# Reads and searches need no line of their own; a refusal is said by the result line below its call.
QUIET_DECISIONS = frozenset({"automatic", "reject_once", "refused"})


@dataclass(frozen=True)
class Line:
    text: str  # already visible()
    style: str | None = None  # a rich style name, for a terminal only; diffs only, so that every other
    # line reaches even a terminal as plain text (the attack battery checks a session's terminal
    # output holds no control character at all)


def diff_lines(diff: str, indent: str = "    ") -> list[Line]:
    """A unified diff, each line visible and styled by its first character."""
    out = []
    lines = diff.rstrip("\n").split("\n")
    for raw in lines[:DIFF_LINES_SHOWN]:
        style = None
        if raw.startswith(("+++", "---")):
            style = "bold"
        elif raw.startswith("+"):
            style = "green"
        elif raw.startswith("-"):
            style = "red"
        elif raw.startswith("@@"):
            style = "cyan"
        out.append(Line(indent + visible(raw), style))
    if len(lines) > DIFF_LINES_SHOWN:
        out.append(Line(f"{indent}… {len(lines) - DIFF_LINES_SHOWN} more diff lines (the transcript has them all)"))
    return out


def arguments_text(arguments: object, error: str | None = None) -> str:
    """Parsed values, not JSON inside a string: `path=src/a.py old_text='x'`."""
    if error is not None or not isinstance(arguments, dict):
        return f"(arguments not usable: {error}) {str(arguments)[:120]}"
    parts = []
    for key, value in arguments.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        text = text if len(text) <= 80 else text[:77] + "…"
        parts.append(
            f"{key}={text!r}"
            if isinstance(value, str) and (" " in text or "\n" in text or not text)
            else f"{key}={text}"
        )
    return " ".join(parts)[:400]


class Painter:
    """Stateful: remembers each call's header, and which call the last line belonged to. `full`
    (`transcript show --full`): every result in full, every line whole, still made visible."""

    def __init__(self, full: bool = False) -> None:
        self.full = full
        self.session_id = ""  # named in the hint at a cut result
        self.said: set[str] = (
            set()
        )  # calls whose whole output a live view printed as it came: their result shows none again
        self._headers: dict[str, str] = {}
        self._last_call: str | None = None
        self._running: set[str] = set()  # parallel reads: a header waits for its own result

    def lines(self, record: dict[str, Any]) -> list[Line]:
        event = parse(record)
        return self.event_lines(event) if event is not None else []

    def _header(self, call_id: str, tool: str) -> list[Line]:
        if not call_id or self._last_call == call_id:  # older transcripts may lack call ids
            return []
        self._last_call = call_id
        return [Line(continued(self._headers.get(call_id) or f"→ {tool}"))]

    def _own(self, text: str, style: str | None = None) -> list[Line]:
        self._last_call = None
        return [Line(continued(text), style)]

    def event_lines(self, event: Event) -> list[Line]:
        who = f" [{event.executor.value}]" if event.executor else ""
        if isinstance(event, SessionStarted):
            self.session_id = event.session_id
            return self._own(f"● task: {event.task}  (model {event.model}, workspace {event.workspace})")
        if isinstance(event, SessionResumed):
            damaged = f"; {event.unreadable} unreadable transcript line(s) passed over" if event.unreadable else ""
            return self._own(
                f"↻ resumed session {event.session_id} after {event.previous_turns} "
                f"turn(s): {event.messages} message(s) of the conversation so far{damaged}"
            )
        if isinstance(event, ModelRetrying):
            return self._own(
                f"  ⟳ model: {event.problem}, retry {event.attempt + 1}/{event.max_attempts} in {event.delay_s:.0f} s"
            )
        if isinstance(event, SandboxStartQueued):
            if event.slot_taken:
                return self._own(f"  ⧗ sandbox: starting, after {event.waited_s:.1f} s in line for a start slot")
            return self._own(
                f"  ⧗ sandbox: waiting for a start slot: {event.ahead} ahead, "
                f"{event.starting} of {event.limit} starting ({event.waited_s:.0f} s)"
            )
        if isinstance(event, ContextCompacted):
            return self._own(
                f"  ⋯ context: elided {event.elided_outputs} older tool output(s), ~{event.tokens_before} "
                f"→ ~{event.tokens_after} tokens of a {event.context_window}-token window"
            )
        if isinstance(event, ModelResponded):
            text = event.text.strip()
            return self._own(f"◆ model: {text[:300]}") if text else []
        if isinstance(event, ToolCallChanged):
            if event.state is ToolCallState.VALIDATING:
                header = f"→ {event.tool} {arguments_text(event.arguments, event.arguments_error)}"
                if not event.call_id:  # an older transcript: nothing to pair it with later
                    return self._own(header)
                self._headers[event.call_id] = header
                return []
            if event.state is ToolCallState.EXECUTING:
                self._running.add(event.call_id)
                return self._header(event.call_id, event.tool) if len(self._running) == 1 else []
            return []
        if isinstance(event, ApprovalDecided):
            if event.decision in QUIET_DECISIONS:
                return []
            return self._header(event.call_id, event.tool) + [
                Line(continued(f"  approval: {event.decision} ({event.level}){who}: {event.reason}"))
            ]
        if isinstance(event, ToolCallFinished):
            self._running.discard(event.call_id)
            return self._header(event.call_id, event.tool) + self._result(event, who)
        if isinstance(event, EgressRecorded):
            sizes = (
                f" ↑{event.bytes_up}B ↓{event.bytes_down}B"
                if event.bytes_up is not None or event.bytes_down is not None
                else ""
            )
            extra = (
                f"{sizes}{' credential injected' if event.credential else ''}{f' [{event.rule}]' if event.rule else ''}"
            )
            why = f" ({event.reason})" if event.reason else ""
            return [
                Line(
                    continued(
                        f"  egress {event.decision}{who}: {event.method or ''} "
                        f"{event.host}:{event.port}{event.path or ''}{extra}{why}"
                    )
                )
            ]
        if isinstance(event, SessionEnded):
            return self._own(f"■ {event.status}{who}: {event.reason}")
        if isinstance(event, HookRan) and (
            event.outcome != "ok" or event.system_message
        ):  # a hook that only said ok stays quiet
            said = f": {event.reason}" if event.reason else ""
            message = f" ({event.system_message})" if event.system_message else ""
            return [
                Line(
                    continued(
                        f"  ⚑ hook {event.hook or ''} {event.hook_event} {event.outcome}{who}{said}{message}"[:2000]
                    )
                )
            ]
        return []

    def _result(self, event: ToolCallFinished, who: str) -> list[Line]:
        exit_code = event.meta.get("exit_code")
        error_type = (event.error or {}).get("type")
        if event.state is ToolCallState.CANCELLED:
            status = "cancelled"
        elif error_type in ("rejected_by_user", "refused_by_policy"):
            status = "refused"
        elif not event.ok:
            status = f"failed: {error_type}"
        elif isinstance(exit_code, int) and exit_code != 0:
            status = f"failed: exit code {exit_code}"
        else:
            status = "ok"
        text = (event.output or str((event.error or {}).get("message") or "")).strip("\n")
        if event.call_id in self.said:
            self.said.discard(event.call_id)
            text = "" if event.ok else text  # a failure's text is its error, never streamed
        out = self.result_lines(f"  ← {status}{who}", text)
        if event.diff:
            out += diff_lines(event.diff)
        return out

    def result_lines(self, status: str, text: str) -> list[Line]:
        """The status line, then the output: one line goes on the status line; more go below it,
        behind the continuation mark, the last RESULT_TAIL_LINES of them (each cut to
        RESULT_LINE_CHARS) unless `full`, with how many came before."""
        lines = text.split("\n") if text.strip() else []
        if len(lines) == 1:
            return [Line(continued(f"{status}: {self._bounded(lines[0])}"))]
        out = [Line(continued(status))]
        shown = lines if self.full else lines[-RESULT_TAIL_LINES:]
        if len(shown) < len(lines):
            earlier = len(lines) - len(shown)
            out.append(
                Line(
                    visible(
                        f"    │ … {earlier} earlier line{'s' if earlier != 1 else ''} "
                        f"(all of it: `oa-sandbox transcript show {self.session_id or 'ID'} --full`)"
                    )
                )
            )
        return out + [Line("    │ " + visible(self._bounded(line))) for line in shown]

    def _bounded(self, line: str) -> str:
        line = line.rstrip("\r")
        if self.full or len(line) <= RESULT_LINE_CHARS:
            return line
        return f"{line[:RESULT_LINE_CHARS]}… ({len(line) - RESULT_LINE_CHARS} more characters)"
