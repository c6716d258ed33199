"""Typed session events: built once by the turn loop, written by the transcript, consumed by the
terminal, the ACP server and the MCP server.

The loop builds these models; the transcript shapes and redacts each one into a JSONL record
(secrets out, sizes capped) and hands the record on; front-ends turn records back into models
with `parse()`, so each of them reads fields by name and states by enum, and none repeats a
state or kind string of its own.
"""

from __future__ import annotations

from enum import Enum
from functools import cache
from typing import Annotated, Any, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .protocol import EgressRecord, Executor


class ToolCallState(str, Enum):
    """validating -> awaiting_approval -> scheduled -> executing -> success | error | cancelled."""

    VALIDATING = "validating"
    AWAITING_APPROVAL = "awaiting_approval"
    SCHEDULED = "scheduled"
    EXECUTING = "executing"
    SUCCESS = "success"
    ERROR = "error"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self in (ToolCallState.SUCCESS, ToolCallState.ERROR, ToolCallState.CANCELLED)


class _Event(BaseModel):
    # Records read back from a transcript carry seq and ts, and may carry fields of newer versions.
    # defer_build: each event's validator is built when it is first made, not at import (a one-shot
    # command meets a few of the 21; issue 50)
    model_config = ConfigDict(extra="allow", defer_build=True)
    executor: Executor | None = None

    def fields(self) -> dict[str, Any]:
        """What the transcript records besides the type and the executor."""
        return self.model_dump(mode="json", exclude={"type", "executor", "seq", "ts"})


class SessionStarted(_Event):
    type: Literal["session_start"] = "session_start"
    task: str = ""
    model: str = ""
    family: str = ""
    session_id: str = ""
    workspace: str = ""
    workspace_mode: str = ""
    tools: list[str] = Field(default_factory=list)
    runtime: str = ""  # the box's OCI runtime (runsc, runc), when the box has started


class SessionResumed(_Event):
    """A session continued (`run --resume`, `--continue`, ACP session/load): the first record the
    resumed run appends to the session's transcript, before its session_start. The conversation
    given to the model was rebuilt from the records above it (resume.py), which are data."""

    type: Literal["session_resumed"] = "session_resumed"
    session_id: str = ""  # the session continued: the record keeps its one id
    previous_turns: int = 0  # turns before this one; the resumed run's turns count on from here
    messages: int = 0  # messages rebuilt from the transcript (the system prompt not counted)
    unreadable: int = 0  # transcript lines passed over: too long, not JSON, not an event
    missing_results: int = (
        0  # calls the transcript has no result for (the session ended mid-turn), answered "no result"
    )
    model: str = ""
    previous_model: str = ""
    via: str = ""  # run | acp


class ModelRequested(_Event):
    type: Literal["model_request"] = "model_request"
    turn: int = 0
    messages: int = 0
    tools: list[str] = Field(default_factory=list)
    context_tokens: int = 0  # the conversation's estimated size, as compaction measures it


class ModelRetrying(_Event):
    """A model request failed in a way worth trying again (429, 5xx, a transport error): said as it
    happens, so a long wait is never silent."""

    type: Literal["model_retry"] = "model_retry"
    attempt: int = 0  # the attempt that failed, 1-based
    max_attempts: int = 0
    delay_s: float = 0.0
    problem: str = ""


class ModelTextStreamed(_Event):
    """A piece of the model's text as it arrives (a streamed answer): for live views only, never
    written to the transcript (model_response holds the whole text); redacted like every event."""

    type: Literal["model_text"] = "model_text"
    turn: int = 0
    text: str = ""


class ToolOutputStreamed(_Event):
    """A shell call's output while it runs: for live views only, never written to the transcript
    (the result holds the output); redacted like every event."""

    type: Literal["tool_output"] = "tool_output"
    call_id: str = ""
    tool: str = ""
    text: str = ""


class SandboxStartQueued(_Event):
    """The sandbox's start (or its restart after a lost agent) waits for one of the process's start
    slots (sandbox/starts.py). While it waits: live views only, at most once a second. Once it has a
    slot (`slot_taken`), recorded in the transcript with the whole wait."""

    type: Literal["sandbox_start_queued"] = "sandbox_start_queued"
    ahead: int = 0  # starts in line before this one
    starting: int = 0  # starts in flight
    limit: int = 0
    waited_s: float = 0.0
    slot_taken: bool = False


class ContextCompacted(_Event):
    """Older tool outputs were elided from the conversation to stay under the context window."""

    type: Literal["context_compacted"] = "context_compacted"
    turn: int = 0
    elided_outputs: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    context_window: int = 0


class BudgetSpent(_Event):
    """What the session has spent after each model response, against its limits (None: no limit):
    for live views only (model_response holds each usage, session_end the sums)."""

    type: Literal["budget"] = "budget"
    turn: int = 0
    tokens: dict[str, int] = Field(default_factory=dict)  # input, output: summed so far
    max_tokens: int | None = None
    wall_s: float = 0.0
    max_wall_s: float | None = None
    context_tokens: int = 0  # the conversation's estimated size when this turn's request was made
    context_window: int = 0


class ModelResponded(_Event):
    type: Literal["model_response"] = "model_response"
    turn: int = 0
    text: str = ""
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    usage: dict[str, Any] = Field(default_factory=dict)


class ToolCallChanged(_Event):
    """A call's state changed. The first one (validating) announces the call with its arguments,
    parsed at the edge; awaiting_approval carries the kind and action the ladder judged."""

    type: Literal["tool_call"] = "tool_call"
    call_id: str = ""
    tool: str = ""
    state: ToolCallState
    arguments: Any = None
    arguments_error: str | None = None
    kind: str | None = None
    action: str | None = None

    def fields(self) -> dict[str, Any]:
        return {k: v for k, v in super().fields().items() if v is not None}


class ApprovalDecided(_Event):
    type: Literal["approval"] = "approval"
    call_id: str = ""
    tool: str = ""
    action: str = ""
    level: str = ""
    decision: str = ""
    reason: str = ""


class ToolCallFinished(_Event):
    """The result, with the call's final state: the one status every front-end shows last."""

    type: Literal["tool_result"] = "tool_result"
    call_id: str = ""
    tool: str = ""
    state: ToolCallState | None = None  # None in transcripts written before states were recorded here
    ok: bool = False
    output: str = ""
    note: str = ""
    error: dict[str, Any] | None = None
    meta: dict[str, Any] = Field(default_factory=dict)
    diff: str | None = None


class EgressRecorded(_Event):
    type: Literal["egress"] = "egress"
    call_id: str = ""
    decision: str = ""
    method: str | None = None
    host: str = ""
    port: int | None = None
    reason: str = ""
    # The audit record (protocol.EgressRecord, bounded by sandbox/egress.py): when, which path (query
    # stripped), which rule decided, bytes each way, whether the gate injected a credential (never its value).
    time: float | None = None
    path: str | None = None
    rule: str | None = None
    bytes_up: int | None = None
    bytes_down: int | None = None
    credential: bool = False
    tls: str | None = None

    @classmethod
    def of(cls, call_id: str, record: EgressRecord) -> "EgressRecorded":
        """A result's egress record (protocol.EgressRecord, bounded by sandbox/egress.py) as the
        transcript's event: the same fields, the call's id, the host as the one who recorded it."""
        fields = record.model_dump()
        return cls(
            executor=Executor.OPENAGENTS,
            call_id=call_id,
            **{**fields, "host": record.host or "", "reason": record.reason or ""},
        )

    def record(self) -> EgressRecord:
        """The event back as the record it came from (what `transcript show` and ACP carry per call)."""
        fields = {name: getattr(self, name) for name in EgressRecord.model_fields}
        return EgressRecord(
            **{**fields, "host": self.host or None, "reason": self.reason or None}
        )  # of() wrote None as ""


class CheckpointRecorded(_Event):
    """After a turn that may have changed files (session.py). `ok` false: the store failed or went
    over its budget, so the turn's changes are unknown (never "none"); fields not known are left out."""

    type: Literal["checkpoint"] = "checkpoint"
    turn: int = 0
    ok: bool = False
    state: str | None = None
    error_type: str | None = None
    error: str | None = None
    files_changed: list[Any] | None = (
        None  # boxfs.to_store form when made; exact (a str or {"bytes_b64"}) in the record
    )
    skipped: list[dict[str, Any]] | None = None

    def fields(self) -> dict[str, Any]:
        """Names as every machine output gives them (docs/cli.md, Names in machine output): exact, `_shown` beside."""
        from .boxfs.names import stored_exact, stored_shown

        out = {k: v for k, v in super().fields().items() if v is not None}
        if self.files_changed is not None:
            out["files_changed"] = [stored_exact(p) if isinstance(p, str) else p for p in self.files_changed]
            out["files_changed_shown"] = [stored_shown(p) if isinstance(p, str) else "" for p in self.files_changed]
        if self.skipped is not None:
            out["skipped"] = [
                {**s, "path": stored_exact(s["path"]), "path_shown": stored_shown(s["path"])}
                if isinstance(s.get("path"), str)
                else s
                for s in self.skipped
            ]
        return out


class IntegritySwept(_Event):
    """What a sweep of the workspace found after a box went (integrity.py SweepReport's fields)."""

    type: Literal["integrity_sweep"] = "integrity_sweep"
    cleared_bits: list[str] = Field(default_factory=list)
    moved: list[dict[str, Any]] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    unfinished: str | None = None
    error_type: str | None = None
    took_s: float = 0.0


class ContextFileNoted(_Event):
    """An AGENTS.md the session gave the model (`given`) or refused (`refused`: a link, a directory,
    a file too big...), from workspace/context_files.py. Fields a record has not are left out."""

    type: Literal["context_file"] = "context_file"
    outcome: str = ""  # given | refused
    path: str = ""  # the file's path in the workspace, shown form (boxfs.show)
    bytes: int | None = None  # given: the bytes read
    during_session: bool | None = None  # given: read after the box had run (the sandbox may have written it)
    origin: str | None = None  # given: the label the model saw
    error_type: str | None = None  # refused: the ErrorType
    reason: str | None = None  # refused

    def fields(self) -> dict[str, Any]:
        return {k: v for k, v in super().fields().items() if v is not None}


class McpServersStarted(_Event):
    """The editor's MCP servers for an ACP session: the tools they offer, and what failed to start."""

    type: Literal["mcp_servers"] = "mcp_servers"
    tools: list[str] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)


class ChangesApplied(_Event):
    """A copy session's changes landed in the real workspace (`via`: who asked, e.g. mcp)."""

    type: Literal["apply"] = "apply"
    via: str = ""
    ok: bool = False
    applied: int = 0
    left_out: list[Any] = Field(default_factory=list)
    conflicts: list[Any] = Field(default_factory=list)


class HookRan(_Event):
    """One run of a user's hook (docs/hooks.md), executor `user`: its point, what it answered and
    what that did. Every text it printed is escaped and cut (hooks/engine.py) before it lands here."""

    type: Literal["hook"] = "hook"
    hook_event: str = ""
    hook: str = ""  # its id, or its place in its file
    tier: str = ""
    source: str = ""
    call_id: str | None = None
    tool: str | None = None
    outcome: str = ""  # ok | blocked | error | timeout | stopped
    exit_code: int | None = None
    decision: str | None = None
    reason: str = ""
    system_message: str = ""
    rewrote_input: bool = False
    context_chars: int = 0
    error_type: str | None = None
    took_s: float = 0.0
    argv: list[str] = Field(default_factory=list)  # what ran: every program by the absolute path found at the start


class SessionEnded(_Event):
    type: Literal["session_end"] = "session_end"
    status: str = ""
    reason: str = ""
    turns: int = 0  # of this run
    last_turn: int | None = (
        None  # the last turn's number (turns count on across a session's runs); None in older transcripts
    )
    final_text: str = ""
    error: dict[str, Any] | None = None
    tokens: dict[str, int] = Field(default_factory=dict)  # input, output: summed over every model response
    wall_s: float = 0.0


Event = Annotated[
    Union[
        SessionStarted,
        SessionResumed,
        ModelRequested,
        ModelRetrying,
        ModelTextStreamed,
        SandboxStartQueued,
        ContextCompacted,
        ToolOutputStreamed,
        ModelResponded,
        BudgetSpent,
        ToolCallChanged,
        ApprovalDecided,
        ToolCallFinished,
        EgressRecorded,
        CheckpointRecorded,
        IntegritySwept,
        ContextFileNoted,
        McpServersStarted,
        ChangesApplied,
        HookRan,
        SessionEnded,
    ],
    Field(discriminator="type"),
]
EVENT_MODELS: tuple[type[_Event], ...] = get_args(get_args(Event)[0])  # the union's members, for the set of types
KNOWN_TYPES = frozenset(model.model_fields["type"].default for model in EVENT_MODELS)


@cache
def _adapter() -> TypeAdapter[Event]:
    """The union's validator, built on the first parse: a command that only writes events never needs it."""
    return TypeAdapter(Event)


def parse(record: dict[str, Any]) -> Event | None:
    """A transcript record as its typed event; None for records of other types (a newer or older
    version's) and for records too damaged to trust (a transcript is a file anyone could have edited)."""
    if not isinstance(record, dict) or record.get("type") not in KNOWN_TYPES:
        return None
    try:
        return _adapter().validate_python(record)
    except ValidationError:
        return None
