"""Resuming a session (`run --resume ID`, `run --continue`, ACP session/load): which sessions may be
continued, and the conversation so far rebuilt from the session's transcript.

The transcript is data the box and the model shaped (tool outputs, the model's text, a file given
with --transcript may even sit where the box writes): it is read through transcript.read_records
(no link followed, lines and the whole file bounded, each parse bounded), every record is taken
through events.parse (a record of no known shape is passed over and counted), and the messages
rebuilt are only what the loop itself would have made of those records: the tasks as user
messages, the model's answers with their calls, each call's result as the model read it. A call
the transcript has no result for (the session ended mid-turn) gets a stated "no result", so no
model API sees a call left unanswered; a result for no call is dropped. The rebuilt conversation
then goes through the loop's compaction like any other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .. import events as ev
from ..errors import ErrorType, OpenAgentsError
from ..models.base import Message, ToolCall
from ..workspace.records import SessionRecord, WorkspaceMode, list_sessions, open_own_record
from . import Unreadable, read_records

RESUMABLE_KINDS = frozenset({"run", "acp"})  # exec and mcp sessions have no conversation of their own
MAX_MESSAGES = 20_000  # rebuilt; past this the oldest go (compaction would elide them anyway)
NO_RESULT = "(no result: the session ended before this call finished; run it again if it is still needed)"


@dataclass
class Rebuilt:
    """The conversation so far, and what the resumed run says about it (events.SessionResumed)."""

    messages: list[Message] = field(default_factory=list)  # without the system prompt
    replay: list[ev.Event] = field(
        default_factory=list
    )  # what an ACP editor is shown again: tasks, answers, calls, results
    previous_turns: int = 0
    last_seq: int = 0
    unreadable: int = 0
    missing_results: int = 0
    dropped: int = 0  # oldest messages over MAX_MESSAGES
    previous_model: str = ""


def resumable(record: SessionRecord, conversation: bool = True) -> SessionRecord:
    """The record, if its session can be continued; a typed refusal naming why not. `conversation`:
    a model goes on with it, so it must have had one (a run or an editor's session); a session
    opened again without a model (the API's) may be of any kind."""
    if conversation and record.kind not in RESUMABLE_KINDS:
        raise OpenAgentsError(
            ErrorType.INVALID_ARGUMENTS,
            f"session {record.id} was an `{record.kind}` session: it has no conversation to continue",
        )
    if record.running():
        raise OpenAgentsError(
            ErrorType.INVALID_ARGUMENTS,
            f"session {record.id} is still running (pid {record.host_pid}): end it first, or start a new session",
        )
    if record.discarded:
        raise OpenAgentsError(
            ErrorType.INVALID_ARGUMENTS, f"session {record.id} was discarded: its copy and transcript are gone"
        )
    if not record.transcript or not os.path.lexists(record.transcript):
        raise OpenAgentsError(
            ErrorType.FILE_NOT_FOUND,
            f"session {record.id} has no transcript left to continue from ({record.transcript or 'none recorded'})",
        )
    for root in {record.workspace, record.box_workspace}:
        if os.path.commonpath([os.path.realpath(record.transcript), os.path.realpath(root)]) == os.path.realpath(root):
            raise OpenAgentsError(
                ErrorType.UNSAFE_WORKSPACE_FILE,
                f"the transcript of session {record.id} is inside the workspace "
                "(the box may have rewritten it): not continued",
            )
    if not Path(record.workspace).is_dir():
        raise OpenAgentsError(
            ErrorType.FILE_NOT_FOUND, f"the workspace of session {record.id} is gone: {record.workspace}"
        )
    if record.mode == WorkspaceMode.COPY and not Path(record.box_workspace).is_dir():
        raise OpenAgentsError(
            ErrorType.FILE_NOT_FOUND, f"the copy of session {record.id} is gone: {record.box_workspace}"
        )
    return record


def find(session_id: str, conversation: bool = True) -> SessionRecord:
    """`--resume ID`, ACP's session/load, the API's `resume=`: the caller's own record (another user's
    is refused, naming its owner)."""
    return resumable(open_own_record(session_id), conversation)


def newest(workspace: Path) -> SessionRecord:
    """`--continue`: the newest, by its own recorded start time, of the caller's sessions of
    `workspace` that had a conversation. Only the caller's: records whose file and directory the
    caller owns (records.list_sessions), whatever uid or id a record's text claims."""
    real = str(Path(workspace).resolve())
    mine = [r for r in list_sessions(all_users=False) if r.workspace == real and r.kind in RESUMABLE_KINDS]
    if mine:
        return resumable(max(mine, key=lambda r: r.created))
    raise OpenAgentsError(ErrorType.FILE_NOT_FOUND, f"no session of {real} to continue (see `oa-sandbox sessions`)")


def rebuild(path: str | Path) -> Rebuilt:
    """The conversation the transcript at `path` records; typed errors (FILE_NOT_FOUND,
    UNSAFE_WORKSPACE_FILE, NOT_REGULAR_FILE, RESOURCE_EXHAUSTED) for a file that cannot be read."""
    out = Rebuilt()
    pending: dict[str, str] = {}  # call id -> tool, of the last answer's calls still without a result

    def settle() -> None:
        for call_id, tool in pending.items():
            out.messages.append(Message(role="tool", tool_call_id=call_id, name=tool, content=NO_RESULT))
            out.missing_results += 1
        pending.clear()

    for record in read_records(path):
        if isinstance(record, Unreadable):
            out.unreadable += 1
            continue
        seq = record.get("seq")
        if isinstance(seq, int) and not isinstance(seq, bool):
            out.last_seq = max(out.last_seq, seq)
        event = ev.parse(record)
        if event is None:  # another version's record, or one of ours too damaged to trust
            if not isinstance(record.get("type"), str) or record.get("type") in ev.KNOWN_TYPES:
                out.unreadable += 1
            continue
        if isinstance(event, ev.SessionStarted):
            settle()
            out.messages.append(Message(role="user", content=event.task))
            out.previous_model = event.model or out.previous_model
            out.replay.append(event)
        elif isinstance(event, ev.ModelRequested):
            out.previous_turns = max(out.previous_turns, event.turn)
        elif isinstance(event, ev.ModelResponded):
            settle()
            out.previous_turns = max(out.previous_turns, event.turn)
            calls = _calls(event.tool_calls)
            out.messages.append(Message(role="assistant", content=event.text, tool_calls=calls))
            pending.update((call.id, call.name) for call in calls)
            out.replay.append(event)
        elif isinstance(event, ev.ToolCallChanged) and event.state is ev.ToolCallState.VALIDATING:
            out.replay.append(event)
        elif isinstance(event, ev.ToolCallFinished):
            if event.call_id in pending:
                out.messages.append(
                    Message(
                        role="tool",
                        tool_call_id=event.call_id,
                        name=pending.pop(event.call_id),
                        content=for_model(event),
                    )
                )
            out.replay.append(event)
    settle()
    if len(out.messages) > MAX_MESSAGES:
        out.dropped = len(out.messages) - MAX_MESSAGES
        kept = out.messages[out.dropped :]
        while kept and kept[0].role == "tool":  # never a result whose call went
            kept.pop(0)
            out.dropped += 1
        out.messages = kept
    if len(out.replay) > MAX_MESSAGES:
        out.replay = out.replay[-MAX_MESSAGES:]
    return out


def _calls(raw: Sequence[object]) -> list[ToolCall]:
    """The answer's calls as the model made them; one the record mangled beyond a call is left out."""
    calls = []
    seen: set[str] = set()
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not isinstance(item.get("name"), str):
            continue
        if item["id"] in seen:
            continue
        arguments = item.get("arguments") if isinstance(item.get("arguments"), dict) else item.get("raw_arguments")
        try:
            call = ToolCall.model_validate(
                {"id": item["id"], "name": item["name"], "arguments": arguments if arguments is not None else {}}
            )
        except ValueError:
            continue
        seen.add(call.id)
        calls.append(call)
    return calls


def for_model(event: ev.ToolCallFinished) -> str:
    """A result as the model read it (protocol.ToolResult.for_model), from its recorded fields."""
    parts = [p for p in (event.output, event.note) if p]
    error = event.error or {}
    if error:
        kind = ErrorType.parse(error.get("type"))
        parts.append(
            f"ERROR {kind.value} ({'recoverable' if kind.recoverable else 'fatal'}): {str(error.get('message', ''))}"
        )
    return "\n".join(parts) if parts else "(no output)"
