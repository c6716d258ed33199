"""What a session's transcript says, gathered for the page: the summary, the timeline of model
answers and tool calls, the gate's audit and the checkpoints the transcript recorded.

The transcript is read only through transcript.read_records (no link followed, each line and the
whole file bounded, each parse bounded) and each record through events.parse (a record of no
known shape is counted, never trusted). What is kept is bounded as it is read (Limits), so a
transcript of hundreds of MiB costs the page no more than its bounds; everything kept is text
already made visible and cut (limits.text), for the template to escape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import events as ev
from ..errors import ErrorType, OpenAgentsError
from ..transcript import Unreadable, read_records
from .limits import Budget, Limits, text

_PER_CALL = frozenset({"tool_call", "approval", "tool_result"})
_REFUSED = frozenset({ErrorType.REFUSED_BY_POLICY.value, ErrorType.REJECTED_BY_USER.value})


@dataclass
class Call:
    call_id: str
    tool: str
    turn: int
    kind: str = ""
    action: str = ""
    arguments: str = ""
    states: list[str] = field(default_factory=list)
    approvals: list[tuple[str, str, str, str]] = field(default_factory=list)  # (decision, who decided, level, reason)
    state: str = ""  # the last one
    ok: bool | None = None
    executor: str = ""  # who ran it or refused it (the result's executor)
    output: str = ""
    error: str = ""
    note: str = ""
    diff: str = ""
    egress: int = 0  # audit rows of this call
    refused: bool = False  # by the policy or a person


@dataclass
class Entry:
    """One timeline row: a model answer (`call` None) or a tool call."""

    turn: int
    text: str = ""
    call: Call | None = None


@dataclass
class Egress:
    call_id: str
    decision: str
    method: str
    host: str
    port: str
    path: str
    rule: str
    reason: str
    bytes_up: str
    bytes_down: str
    credential: bool
    tls: str
    time: float | None


@dataclass
class CheckpointRow:
    turn: int
    state: str
    files: list[str]
    more: int
    skipped: list[str]
    error: str = ""


@dataclass
class Gathered:
    task: str = ""
    model: str = ""
    family: str = ""
    workspace_mode: str = ""
    runtime: str = ""
    status: str = ""
    reason: str = ""
    final_text: str = ""
    error: str = ""
    turns: int | None = None
    wall_s: float | None = None
    tokens: dict[str, int] = field(default_factory=dict)
    limits: dict[str, str] = field(default_factory=dict)  # the budget's bounds, as the budget events said them
    entries: list[Entry] = field(default_factory=list)
    entries_left_out: int = 0
    egress: list[Egress] = field(default_factory=list)
    egress_left_out: int = 0
    credentials: dict[str, int] = field(default_factory=dict)  # host:port -> requests it was injected into
    checkpoints: list[CheckpointRow] = field(default_factory=list)
    checkpoints_left_out: int = 0
    records: int = 0
    unreadable: int = 0
    unknown: int = 0
    stopped: str = ""  # why the transcript was not read to its end
    values_cut: int = 0  # texts cut shorter than their bound because the page ran out of room
    calls: dict[str, Call] = field(default_factory=dict)


def _json(value: Any) -> str:
    try:
        return json.dumps(value, indent=1, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def _count(value: int | None) -> str:
    return "" if value is None else str(value)


class _Reader:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.g = Gathered()
        self.turn = 0
        self.budget = Budget(limits.timeline_bytes)
        self.keep = self.budget.take
        self.names = Budget(limits.checkpoint_bytes, floor=60)

    def call(self, call_id: str, tool: str, last: bool = False) -> Call | None:
        """The call of this id; a new one gets a timeline row while there is room. Past it: None,
        and nothing is kept of the call (so a transcript of millions of calls costs no memory); a
        call left out is counted at its result (`last`), which every call has once."""
        found = self.g.calls.get(call_id)
        if found is not None:
            return found
        if len(self.g.entries) >= self.limits.max_entries:
            self.g.entries_left_out += last
            return None
        new = Call(text(call_id, 200), text(tool, 200), self.turn)
        self.g.calls[call_id] = new
        self.g.entries.append(Entry(self.turn, call=new))
        return new

    def passed_over(self, record: dict[str, Any]) -> bool:
        """Once the timeline is full, a record of a call not on it is only counted, never parsed
        into an event (most of a huge transcript's cost)."""
        if len(self.g.entries) < self.limits.max_entries:
            return False
        kind = record.get("type")
        if kind in _PER_CALL and record.get("call_id") not in self.g.calls:
            self.g.entries_left_out += kind == "tool_result"
            return True
        if kind == "model_response":
            self.g.entries_left_out += bool(record.get("text"))
            turn = record.get("turn")
            self.turn = turn if isinstance(turn, int) and not isinstance(turn, bool) else self.turn
            return True
        return False

    def take(self, event: ev._Event) -> None:  # noqa: C901 - one branch per event type, in the order a session writes them
        g, lim = self.g, self.limits
        if isinstance(event, ev.SessionStarted):
            g.task, g.model, g.family = text(event.task, lim.max_text), text(event.model, 300), text(event.family, 100)
            g.workspace_mode = text(event.workspace_mode, 50)
            g.runtime = text(event.runtime, 100)
        elif isinstance(event, ev.ModelResponded):
            self.turn = event.turn
            if event.text:
                if len(g.entries) < lim.max_entries:
                    g.entries.append(Entry(event.turn, text=self.keep(event.text, lim.max_text)))
                else:
                    g.entries_left_out += 1
        elif isinstance(event, ev.ToolCallChanged):
            call = self.call(event.call_id, event.tool)
            if call is not None:
                call.state = event.state.value
                if not call.states or call.states[-1] != call.state:
                    call.states.append(call.state)
                if event.arguments is not None and not call.arguments:
                    call.arguments = self.keep(_json(event.arguments), lim.max_text)
                if event.arguments_error:
                    call.error = self.keep(f"arguments: {event.arguments_error}", lim.max_text)
                call.kind, call.action = text(event.kind or call.kind, 50), text(event.action or call.action, 300)
        elif isinstance(event, ev.ApprovalDecided):
            call = self.call(event.call_id, event.tool)
            if call is not None and len(call.approvals) < 20:
                who = event.executor.value if event.executor is not None else "not recorded"
                call.approvals.append(
                    (text(event.decision, 50), who, text(event.level, 50), self.keep(event.reason, lim.max_text))
                )
        elif isinstance(event, ev.ToolCallFinished):
            call = self.call(event.call_id, event.tool, last=True)
            if call is not None:
                call.ok = event.ok
                call.executor = event.executor.value if event.executor is not None else ""
                if event.state is not None:
                    call.state = event.state.value
                    if not call.states or call.states[-1] != call.state:
                        call.states.append(call.state)
                call.output = self.keep(event.output, lim.max_output, tail=True)
                call.note = self.keep(event.note, lim.max_text)
                if event.error:
                    call.refused = event.error.get("type") in _REFUSED
                    call.error = self.keep(
                        f"{event.error.get('type', '')}: {event.error.get('message', '')}", lim.max_text
                    )
                call.diff = self.keep(event.diff or "", lim.max_output)
        elif isinstance(event, ev.EgressRecorded):
            self.egress(event)
        elif isinstance(event, ev.CheckpointRecorded):
            if len(g.checkpoints) >= lim.max_checkpoints:
                g.checkpoints_left_out += 1
                return
            files = event.files_changed or []
            skipped = [
                f"{s.get('path', '')} ({s.get('reason', '')})"
                for s in (event.skipped or [])[:20]
                if isinstance(s, dict)
            ]
            g.checkpoints.append(
                CheckpointRow(
                    event.turn,
                    text(event.state or ("ok" if event.ok else "failed"), 30),
                    [self.names.take(f, 500) for f in files[: lim.max_checkpoint_files]],
                    max(0, len(files) - lim.max_checkpoint_files),
                    [self.names.take(f, 500) for f in skipped],
                    self.names.take(f"{event.error_type or ''} {event.error or ''}".strip(), lim.max_text),
                )
            )
        elif isinstance(event, ev.BudgetSpent):
            g.tokens = {k: v for k, v in event.tokens.items() if isinstance(v, int)}
            if event.max_tokens is not None:
                g.limits["max tokens"] = str(event.max_tokens)
            if event.max_wall_s is not None:
                g.limits["max wall time"] = f"{event.max_wall_s:g} s"
            if event.context_window:
                g.limits["context window"] = str(event.context_window)
        elif isinstance(event, ev.SessionEnded):
            g.status, g.reason = text(event.status, 50), text(event.reason, lim.max_text)
            g.final_text = text(event.final_text, lim.max_text)
            g.turns = event.last_turn if event.last_turn is not None else event.turns
            g.wall_s = event.wall_s
            g.tokens = {k: v for k, v in event.tokens.items() if isinstance(v, int)} or g.tokens
            if event.error:
                g.error = text(f"{event.error.get('type', '')}: {event.error.get('message', '')}", lim.max_text)

    def egress(self, event: ev.EgressRecorded) -> None:
        g = self.g
        host = text(event.host, 300)
        if event.credential:
            key = f"{host}:{event.port}" if event.port is not None else host
            if key in g.credentials or len(g.credentials) < 100:
                g.credentials[key] = g.credentials.get(key, 0) + 1
        call = g.calls.get(event.call_id)
        if call is not None:
            call.egress += 1
        if len(g.egress) >= self.limits.max_egress:
            g.egress_left_out += 1
            return
        g.egress.append(
            Egress(
                text(event.call_id, 200),
                text(event.decision, 30),
                text(event.method or "", 20),
                host,
                _count(event.port),
                self.keep(event.path or "", 2000),
                text(event.rule or "", 300),
                self.keep(event.reason, 2000),
                _count(event.bytes_up),
                _count(event.bytes_down),
                event.credential,
                text(event.tls or "", 20),
                event.time,
            )
        )


def gather(transcript: Path | None, limits: Limits) -> Gathered:
    """The transcript at `transcript` read into a bounded Gathered; no transcript: an empty one
    saying why."""
    reader = _Reader(limits)
    if transcript is None:
        reader.g.stopped = "the session has no transcript left"
        return reader.g
    try:
        for record in read_records(transcript):
            if isinstance(record, Unreadable):
                reader.g.unreadable += 1
                continue
            reader.g.records += 1
            if reader.passed_over(record):
                continue
            event = ev.parse(record)
            if event is None:
                reader.g.unknown += 1
                continue
            reader.take(event)
    except OpenAgentsError as err:
        if err.type not in (
            ErrorType.RESOURCE_EXHAUSTED,
            ErrorType.FILE_NOT_FOUND,
            ErrorType.UNSAFE_WORKSPACE_FILE,
            ErrorType.NOT_REGULAR_FILE,
            ErrorType.IO_ERROR,
        ):
            raise
        reader.g.stopped = text(err.message, 500)
    reader.g.values_cut = reader.budget.cut
    return reader.g
