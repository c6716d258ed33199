"""The official ACP Python SDK (`agent-client-protocol`) as the editor of `oa-sandbox acp`.

`run_editor` starts the agent as a real subprocess through the SDK's spawn_agent_process and
drives it with the SDK's ClientSideConnection. Every frame the agent sends is checked by
`FrameChecker` against the SDK's schema model for it: the request, notification or answer must
validate, and the validated model dumped again must give back the frame exactly. That second
check matters: the SDK's models quietly drop unknown fields and replace invalid values (its
salvage validators), so validation alone would let a wrong frame through.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from acp import PROTOCOL_VERSION, RequestError, spawn_agent_process
from acp.connection import StreamDirection, StreamEvent
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    Error,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PromptResponse,
    RequestPermissionRequest,
    RequestPermissionResponse,
    SessionNotification,
    ToolCallProgress,
    ToolCallStart,
    WriteTextFileRequest,
    WriteTextFileResponse,
)
from pydantic import BaseModel

OA = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
ANSWERS: dict[str, type[BaseModel]] = {
    "initialize": InitializeResponse,
    "session/new": NewSessionResponse,
    "session/prompt": PromptResponse,
    "session/load": LoadSessionResponse,
}
REQUESTS: dict[str, type[BaseModel]] = {
    "session/request_permission": RequestPermissionRequest,
    "fs/write_text_file": WriteTextFileRequest,
}
NOTIFICATIONS: dict[str, type[BaseModel]] = {"session/update": SessionNotification}


def exactly(model: type[BaseModel], raw: Any) -> BaseModel:
    parsed = model.model_validate(raw)
    again = parsed.model_dump(mode="json", by_alias=True, exclude_unset=True)
    assert again == raw, f"{model.__name__} does not hold the frame as sent:\n sent {raw}\n kept {again}"
    return parsed


class FrameChecker:
    """A stream observer: every incoming frame against its schema model; problems are kept, since
    the SDK swallows an observer's exceptions."""

    def __init__(self) -> None:
        self.asked: dict[Any, str] = {}  # our request ids -> method
        self.frames: list[dict] = []
        self.problems: list[str] = []

    def __call__(self, event: StreamEvent) -> None:
        msg = event.message
        if event.direction is StreamDirection.OUTGOING:
            if "method" in msg and "id" in msg:
                self.asked[msg["id"]] = msg["method"]
            return
        self.frames.append(msg)
        try:
            self.check(msg)
        except Exception as err:  # noqa: BLE001 - recorded, asserted by the test
            self.problems.append(f"{type(err).__name__}: {err}")

    def check(self, msg: dict) -> None:
        assert msg.get("jsonrpc") == "2.0", msg
        rest = {k: v for k, v in msg.items() if k != "jsonrpc"}
        method = rest.get("method")
        if method is not None:
            table = REQUESTS if "id" in rest else NOTIFICATIONS
            assert method in table, f"the agent sent {method!r}, which this editor never offered"
            assert set(rest) <= {"id", "method", "params"}, rest
            exactly(table[method], rest["params"])
            return
        assert rest.get("id") in self.asked, f"an answer to a request never made: {rest}"
        if "error" in rest:
            assert set(rest) == {"id", "error"}, rest
            exactly(Error, rest["error"])
        else:
            assert set(rest) == {"id", "result"}, rest
            exactly(ANSWERS[self.asked[rest["id"]]], rest["result"])


@dataclass
class Editor:
    """The SDK's Client: answers permission requests, keeps every session/update in order."""

    decide: Callable[[Any], str] = lambda tool_call: "allow_once"
    on_update: Callable[[str, Any], Awaitable[None]] | None = None
    updates: list[Any] = field(default_factory=list)
    permissions: list[Any] = field(default_factory=list)
    writes: list[tuple[str, str]] = field(default_factory=list)  # fs/write_text_file: (path, content), in order
    refuse_writes: bool = False
    conn: Any = None

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list, **kwargs: Any
    ) -> RequestPermissionResponse:
        assert [o.kind for o in options] == ["allow_once", "reject_once"]
        self.permissions.append(tool_call)
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=self.decide(tool_call)))

    async def write_text_file(self, session_id: str, path: str, content: str, **kwargs: Any) -> WriteTextFileResponse:
        """As an editor does: the buffer takes the text and is saved to disk."""
        self.writes.append((path, content))
        if self.refuse_writes:
            raise RequestError.invalid_params({"path": path, "reason": "the editor refuses"})
        Path(path).write_text(content)
        return WriteTextFileResponse()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)
        if self.on_update is not None:
            await self.on_update(session_id, update)

    # -- what the tests read ---------------------------------------------------------------------
    def calls(self, call_id: str) -> list[Any]:
        return [
            u for u in self.updates if isinstance(u, (ToolCallStart, ToolCallProgress)) and u.tool_call_id == call_id
        ]

    def statuses(self, call_id: str) -> list[str]:
        return [u.status for u in self.calls(call_id) if u.status is not None]

    def start(self, call_id: str) -> ToolCallStart:
        return next(u for u in self.calls(call_id) if isinstance(u, ToolCallStart))

    def last(self, call_id: str) -> ToolCallProgress:
        return [
            u for u in self.calls(call_id) if isinstance(u, ToolCallProgress) and u.status in ("completed", "failed")
        ][-1]


@dataclass
class Run:
    editor: Editor
    checker: FrameChecker
    pid: int
    returncode: int | None
    result: Any


def run_editor(
    tmp_path: Path,
    agent_args: list[str],
    body: Callable[[Any, Editor], Awaitable[Any]],
    editor: Editor | None = None,
    env: dict[str, str] | None = None,
    capabilities: ClientCapabilities | None = None,
    init: list[Any] | None = None,
) -> Run:
    """Start `oa-sandbox acp AGENT_ARGS`, initialise through the SDK, run `body(conn, editor)`, then
    close stdin and wait for the agent to exit (it removes its sandboxes and MCP servers first)."""
    editor = editor or Editor()
    checker = FrameChecker()
    stderr = open(tmp_path / "agent.stderr", "wb")

    async def main() -> Run:
        # The SDK finds a client's methods with getattr and answers method-not-found for the ones an
        # editor lacks (terminals, reads, elicitation): a partial Client is how it is meant to be used.
        async with spawn_agent_process(
            editor,  # type: ignore[arg-type]
            OA,
            "acp",
            *agent_args,
            env={**os.environ, **(env or {})},
            transport_kwargs={"limit": 16 * 1024 * 1024, "shutdown_timeout": 120, "stderr": stderr.fileno()},
            observers=[checker],
        ) as (conn, process):
            editor.conn = conn
            answer = await conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=capabilities)
            assert answer.protocol_version == PROTOCOL_VERSION
            if init is not None:
                init.append(answer)
            result = await body(conn, editor)
        return Run(editor, checker, process.pid, process.returncode, result)

    try:
        run = asyncio.run(main())
    finally:
        stderr.close()
    assert run.checker.problems == [], run.checker.problems
    return run
