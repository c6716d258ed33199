"""session/load's replay: a recorded conversation told to the editor again as session/update
notifications, in order, before the answer (the ACP spec's Loading Sessions).

The events come from the session's transcript, read back bounded (resume.rebuild): the user's
prompts as user_message_chunk, the model's text as agent_message_chunk, each call as tool_call with
its final tool_call_update (the result's text, or its typed error). Text is sent as recorded, as the
live session sent it; only the model's and the box's words, nothing read from the workspace now."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, TypeGuard, get_args

from .. import events as ev
from ..events import ToolCallState
from ..tools import catalog
from . import files
from . import models as m

_FINAL: dict[ToolCallState, m.ToolCallStatus] = {
    ToolCallState.SUCCESS: "completed",
    ToolCallState.ERROR: "failed",
    ToolCallState.CANCELLED: "failed",
}


def updates(events: Iterable[ev.Event], workspace: Path) -> list[m.SessionUpdate]:
    """The notifications' updates, in the transcript's order; a result whose call was never
    announced is announced with it (a transcript cut short keeps each call whole)."""
    out: list[m.SessionUpdate] = []
    announced: set[str] = set()
    for event in events:
        if isinstance(event, ev.SessionStarted) and event.task:
            out.append(m.UserMessageChunk(content=m.TextContent(text=event.task)))
        elif isinstance(event, ev.ModelResponded) and event.text:
            out.append(m.AgentMessageChunk(content=m.TextContent(text=event.text)))
        elif isinstance(event, ev.ToolCallChanged) and event.call_id and event.call_id not in announced:
            announced.add(event.call_id)
            out.append(_start(event.call_id, event.tool, event.arguments, workspace))
        elif isinstance(event, ev.ToolCallFinished) and event.call_id:
            if event.call_id not in announced:
                announced.add(event.call_id)
                out.append(_start(event.call_id, event.tool, None, workspace))
            text = event.output
            if event.error:
                text = (text + "\n" if text else "") + f"{event.error.get('type')}: {event.error.get('message')}"
            content: list[m.ToolCallContent] = (
                [m.ContentToolCallContent(content=m.TextContent(text=text))] if text else []
            )
            state = event.state or (ToolCallState.SUCCESS if event.ok else ToolCallState.ERROR)
            out.append(m.ToolCallUpdate(toolCallId=event.call_id, status=_FINAL.get(state, "failed"), content=content))
    return out


def _start(call_id: str, tool: str, arguments: object, workspace: Path) -> m.ToolCallStart:
    kind = catalog.announced_kind(tool, arguments)
    return m.ToolCallStart(
        toolCallId=call_id,
        title=catalog.call_title(tool, arguments),
        kind=kind if _is_kind(kind) else "other",
        rawInput=arguments,
        locations=files.locations(tool, arguments, workspace),
    )


def _is_kind(kind: str) -> TypeGuard[m.ToolKind]:
    return kind in get_args(m.ToolKind)
