"""An ACP session's state on the server (AcpSession: its Sandbox, the editor's MCP servers, the calls
announced) and what the editor is told of each transcript record (on_event: session/update)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .. import events as ev
from ..events import ToolCallState
from ..tools import catalog
from ..tools.mcp.client import McpHost
from ..workspace.copy_session import note_call
from . import files
from . import models as m
from .approver import acp_kind, announced_kind
from .landing import TurnLander

if TYPE_CHECKING:
    from ..api import Sandbox


@dataclass
class AcpSession:
    id: str
    box: Sandbox | None = None
    calls: dict[str, dict[str, Any]] = field(default_factory=dict)
    workspace: Path = Path(".")  # the editor's path of the workspace: what paths shown to it start with
    roots: list[Path] = field(default_factory=list)  # where a resource link names a workspace file
    mcp: McpHost | None = None
    busy: threading.Lock = field(default_factory=threading.Lock)
    lander: TurnLander | None = None  # copy mode: lands each prompt turn's changes (landing.py)
    streamed: set[int] = field(default_factory=set)  # model turns whose text went out as it arrived

    @property
    def box_root(self) -> Path:
        """The workspace the box works on (a copy in copy mode): where diffs are read."""
        return self.box.box_workspace if self.box else self.workspace

    def close(self) -> None:
        try:
            if self.box:
                self.box.close(status="closed", reason="the editor's session ended")
        finally:
            if self.mcp:
                self.mcp.close()


def on_event(
    session: AcpSession, record: dict[str, Any], update: Callable[[AcpSession, m.SessionUpdate], None]
) -> None:
    """One transcript record told to the editor as the session/update notifications it makes."""
    event = ev.parse(record)
    if isinstance(event, ev.ModelTextStreamed) and event.text:  # a streamed answer, piece by piece
        session.streamed.add(event.turn)
        update(session, m.AgentMessageChunk(content=m.TextContent(text=event.text)))
    elif isinstance(event, ev.ModelRequested):  # a turn (they count on across prompts and resumes)
        session.streamed.discard(event.turn)
    elif isinstance(event, ev.ModelResponded) and event.text and event.turn not in session.streamed:
        update(session, m.AgentMessageChunk(content=m.TextContent(text=event.text)))
    elif isinstance(event, ev.ToolCallChanged):
        if event.state is ToolCallState.VALIDATING:
            session.calls[event.call_id] = {"tool": event.tool, "arguments": event.arguments}
            update(
                session,
                m.ToolCallStart(
                    toolCallId=event.call_id,
                    title=catalog.call_title(event.tool, event.arguments),
                    kind=announced_kind(event.tool, event.arguments),
                    rawInput=event.arguments,
                    locations=files.locations(event.tool, event.arguments, session.workspace),
                ),
            )
        elif event.state is ToolCallState.AWAITING_APPROVAL and event.kind:
            update(session, m.ToolCallUpdate(toolCallId=event.call_id, kind=acp_kind(event.kind)))
        elif event.state is ToolCallState.EXECUTING:
            call = session.calls.get(event.call_id, {})
            where = None
            if call.get("tool") in files.EDIT_TOOLS:  # the file as it is just before the call changes it
                call["before"] = files.read_text(session.box_root, call.get("arguments"))
                line = files.first_changed_line(call["tool"], call["before"], call.get("arguments"))
                where = files.locations(call["tool"], call.get("arguments"), session.workspace, line) if line else None
            update(session, m.ToolCallUpdate(toolCallId=event.call_id, status=_STATUS[event.state], locations=where))
        # final states arrive with the result, once: a cancelled call's last status stays its final one
    elif isinstance(event, ev.ToolOutputStreamed):
        # A running command's output so far (its last LIVE_OUTPUT_CHARS): ACP's content replaces the
        # previous content, so each update carries the tail; the result's update replaces it at the end.
        call = session.calls.setdefault(event.call_id, {})
        call["live"] = (call.get("live", "") + event.text)[-LIVE_OUTPUT_CHARS:]
        update(
            session,
            m.ToolCallUpdate(
                toolCallId=event.call_id,
                status="in_progress",
                content=[m.ContentToolCallContent(content=m.TextContent(text=call["live"]))],
            ),
        )
    elif isinstance(
        event, ev.EgressRecorded
    ):  # the record step emits them before the call's result: kept for its rawOutput
        session.calls.setdefault(event.call_id, {}).setdefault("egress", []).append(
            event.record().model_dump(mode="json")
        )
    elif isinstance(event, ev.ToolCallFinished):
        call = session.calls.get(event.call_id, {})
        if session.lander is not None:  # copy mode: until the turn's landing, its work has not landed
            note_call(session.lander.record, event.tool or str(call.get("tool", "")), event.ok)
        content: list[m.ToolCallContent] = []
        text = event.output
        if event.error:
            text = (text + "\n" if text else "") + f"{event.error.get('type')}: {event.error.get('message')}"
        if text:
            content.append(m.ContentToolCallContent(content=m.TextContent(text=text)))
        diff = None
        if event.ok and call.get("tool") in files.EDIT_TOOLS and "before" in call:
            after = files.read_text(session.box_root, call.get("arguments"))
            diff = files.diff(session.workspace, call.get("arguments"), call["before"], after)
        if diff:
            content.append(diff)
        update(
            session,
            m.ToolCallUpdate(
                toolCallId=event.call_id,
                status=_STATUS[event.state or (ToolCallState.SUCCESS if event.ok else ToolCallState.ERROR)],
                content=content,
                rawOutput={
                    "executor": event.executor.value if event.executor else None,
                    "meta": event.meta,
                    "egress": call.pop("egress", []),
                },
            ),
        )


LIVE_OUTPUT_CHARS = 4000

# ACP's tool call status for each state the loop reports (states before executing show as pending).
_STATUS: dict[ToolCallState, m.ToolCallStatus] = {
    ToolCallState.EXECUTING: "in_progress",
    ToolCallState.SUCCESS: "completed",
    ToolCallState.ERROR: "failed",
    ToolCallState.CANCELLED: "failed",
}
