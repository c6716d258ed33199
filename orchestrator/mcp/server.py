"""`oa-sandbox mcp`: the six sandboxed tools over MCP stdio, with the official `mcp` SDK (lowlevel Server).

One process serves one MCP session, so it owns one warm sandbox: opened before the first message is
read (an orchestrator.api.Sandbox, as every front-end opens one: workspace modes, sweep, quota,
checkpoints, transcript, record), kept
warm and replaced by DockerSandbox itself when the agent dies, and removed when the client goes
away (stdin EOF, SIGTERM or SIGINT). Each call goes through the same CallPipeline as a model's call
in `run` (validate, decide, execute, record: the transcript has the same events); the session has
no model, the MCP client is the caller. Approvals: the policy's deny always holds; a call that would ask asks the
user through MCP elicitation when the client declared it (a form request on handshake-era
connections, an InputRequiredResult on 2026-07-28 ones), and otherwise is left to the client's own
confirmation, which every MCP client shows before it calls a tool.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import secrets
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.to_thread
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from .. import events as ev
from ..errors import ErrorType, OpenAgentsError
from ..ground.text import visible
from ..policy.approvals import Answer, ApprovalRequest, PermissionOption
from ..policy.ladder import Level
from ..protocol import Executor, ToolResult
from ..tools import catalog, declarations
from ..tools.catalog import FORK_TOOL, LAND_TOOL
from ..tools.registry import PreparedCall
from ..workspace.copy_session import note_call
from ..workspace.fork_tool import FORK_DEF, FORK_DESCRIPTION, FORK_INPUT_SCHEMA
from .landing import APPLY_DESCRIPTION, CHANGES_DESCRIPTION, bind_mode_refusal, in_copy_note, instructions
from .landing import COPY_TOOLS as LANDING_TOOLS
from .results import output_schema, to_call_result

COPY_TOOLS = (
    *LANDING_TOOLS,
    FORK_TOOL,
)  # copy mode's host-side tools for the client (through the pipeline, as the six)

if TYPE_CHECKING:  # for annotations only: this module does not load the session machinery itself
    from ..api import Sandbox

log = logging.getLogger(__name__)

TOOLS = tuple(t.name for t in catalog.mcp_tools())  # the tools whose ToolDef says they are served over MCP
PROGRESS_EVERY_S = 1.0
_APPROVAL_KEY = "approval"


def tool_annotations(name: str, open_world: bool = False) -> types.ToolAnnotations:
    """Hints for the client's own confirmation, from the tool's ToolDef: reading tools change
    nothing; the others may overwrite or delete what is there. Nothing reaches the network unless
    --egress opened it."""
    tool = catalog.TOOLS[name]
    return types.ToolAnnotations(
        title=tool.title,
        read_only_hint=tool.read_only,
        destructive_hint=not tool.read_only,
        idempotent_hint=tool.read_only or tool.mcp.idempotent,
        open_world_hint=open_world and tool.reaches_network,
    )


def mcp_tools(open_world: bool = False, copy_mode: bool = False) -> list[types.Tool]:
    """The schemas come from the declarations every model family gets (tools/declarations.py); each
    tool declares the outputSchema its structuredContent conforms to (results.py). In copy mode
    `changes` and `apply_changes` come too (landing.py); in bind mode there is nothing to land."""
    out = []
    for name in TOOLS:
        base = declarations.base_declaration(name)
        out.append(
            types.Tool(
                name=name,
                description=base["description"],
                input_schema=base["parameters"],
                output_schema=output_schema(name),
                annotations=tool_annotations(name, open_world),
            )
        )
    if copy_mode:
        out.append(
            types.Tool(
                name="changes",
                description=CHANGES_DESCRIPTION,
                output_schema=output_schema("changes"),
                input_schema={
                    "type": "object",
                    "properties": {
                        "stat": {
                            "type": "boolean",
                            "description": "One line per file with counts, as git diff --stat.",
                            "default": False,
                        }
                    },
                    "additionalProperties": False,
                },
                annotations=types.ToolAnnotations(
                    title="Show the private copy's changes",
                    read_only_hint=True,
                    destructive_hint=False,
                    idempotent_hint=True,
                    open_world_hint=False,
                ),
            )
        )
        out.append(
            types.Tool(
                name="apply_changes",
                description=APPLY_DESCRIPTION,
                output_schema=output_schema("apply_changes"),
                input_schema={"type": "object", "properties": {}, "additionalProperties": False},
                annotations=types.ToolAnnotations(
                    title="Land the private copy's changes in the real workspace",
                    read_only_hint=False,
                    destructive_hint=True,
                    idempotent_hint=True,
                    open_world_hint=False,
                ),
            )
        )
        out.append(
            types.Tool(
                name=FORK_TOOL,
                description=FORK_DESCRIPTION,
                output_schema=output_schema(FORK_TOOL),
                input_schema=FORK_INPUT_SCHEMA,
                annotations=types.ToolAnnotations(
                    title=FORK_DEF.title,
                    read_only_hint=False,
                    destructive_hint=False,
                    idempotent_hint=False,
                    open_world_hint=False,
                ),
            )
        )
    return out


class NeedsInput(Exception):
    """A 2026-07-28 connection cannot take a server request mid-call: the question goes back to the
    client as an InputRequiredResult and the call is retried with the answer."""

    def __init__(self, request: ApprovalRequest) -> None:
        super().__init__(request.title)
        self.request = request


@dataclass
class _CallContext:
    """What the approver needs to know about the MCP request it answers for (one per worker thread)."""

    elicit: Any  # a coroutine function (message, schema) -> ElicitResult, or None: no elicitation
    modern: bool
    preset: types.ElicitResult | None = None  # the client's answer on a 2026-07-28 retry


class McpApprover:
    """The ladder's questions, put to the MCP client's user."""

    def __init__(self) -> None:
        self._local = threading.local()

    def bind(self, context: _CallContext | None) -> None:
        self._local.context = context

    def ask(self, request: ApprovalRequest) -> Answer:
        context: _CallContext | None = getattr(self._local, "context", None)
        if context is None or context.elicit is None and context.preset is None:
            return Answer(
                option=PermissionOption.ALLOW_ONCE,
                executor=Executor.OPENAGENTS,
                reason=f"{request.action} ({request.level.value}): the MCP client has no elicitation; "
                "left to its own confirmation",
            )
        if context.preset is not None:
            answer = context.preset
        elif context.modern:
            raise NeedsInput(request)
        else:
            try:
                answer = anyio.from_thread.run(context.elicit, elicit_message(request), elicit_schema(request))
            except Exception as err:  # noqa: BLE001 - no answer is a refusal
                return Answer(
                    option=PermissionOption.REJECT_ONCE,
                    executor=Executor.OPENAGENTS,
                    reason=f"no answer from the MCP client: {str(err)[:200]}",
                )
        return answer_of(answer)


def elicit_message(request: ApprovalRequest) -> str:
    """The title and arguments are the model's: every control character made visible."""
    preview = json.dumps(request.arguments, ensure_ascii=False)
    preview = preview[:600] + ("…" if len(preview) > 600 else "")
    return visible(f"oa-sandbox asks ({request.level.value}): {request.title}\n{preview}")


def elicit_schema(request: ApprovalRequest) -> dict[str, Any]:
    props: dict[str, Any] = {
        "allow": {"type": "boolean", "title": "Allow", "description": "Allow this call once", "default": False}
    }
    if request.level == Level.ASK_ONCE:
        props["remember"] = {
            "type": "boolean",
            "title": f"Allow every {request.kind} call this session",
            "default": False,
        }
    return {"type": "object", "properties": props, "required": ["allow"]}


def answer_of(result: types.ElicitResult) -> Answer:
    content = result.content or {}
    if result.action == "accept" and content.get("allow") is True:
        return Answer(
            option=PermissionOption.ALLOW_ONCE,
            remember_for_session=content.get("remember") is True,
            reason="allowed in the MCP client",
        )
    return Answer(option=PermissionOption.REJECT_ONCE, reason=f"rejected in the MCP client ({result.action})")


class SandboxMcpServer:
    """The MCP face of one open sandbox (orchestrator.api.Sandbox, opened with any_caller_lands: in
    copy mode its registry has `changes` and `apply_changes` for the client, through its pipeline)."""

    def __init__(self, box: Sandbox, approver: McpApprover) -> None:
        self.box = box
        self.approver = approver
        self.calls = 0
        self._pending: dict[str, tuple[str, float]] = {}  # request_state -> (digest of the call, when)
        self._lock = threading.Lock()
        open_world = self.open_world = box.box_config.egress is not None
        self.record = box.record
        self.mode = self.record.mode.value
        self.copy_mode = self.mode == "copy"
        self.tools = mcp_tools(open_world, copy_mode=self.copy_mode)
        self.server: Server[Any] = Server(
            "oa-sandbox",
            version=_version(),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            instructions=instructions(self.record),
        )

    async def _list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools)

    async def _call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        arguments = params.arguments or {}
        if params.name in COPY_TOOLS and not self.copy_mode:
            return self._answer(bind_mode_refusal(params.name, self.record))
        if params.name not in TOOLS + COPY_TOOLS:
            names = ", ".join(TOOLS + (COPY_TOOLS if self.copy_mode else ()))
            err = OpenAgentsError(ErrorType.UNKNOWN_TOOL, f"unknown tool {params.name!r}; the tools are {names}")
            return self._answer(ToolResult.failure(err))
        digest = _digest(params.name, arguments)
        context = self._context(ctx, params, digest)
        call_id = f"mcp_{uuid.uuid4().hex[:12]}"
        with self._lock:
            self.calls += 1

        def approve() -> PreparedCall | ToolResult:
            self.approver.bind(context)
            try:
                return self.box.decide(params.name, arguments, call_id)
            finally:
                self.approver.bind(None)

        try:
            prepared = await anyio.to_thread.run_sync(approve)
        except NeedsInput as need:
            return self._input_required(need, digest)
        if isinstance(
            prepared, ToolResult
        ):  # refused or invalid: nothing ran, so no turn, no checkpoint, the copy's record untouched
            return self._answer(prepared)
        # the turn counted, the checkpoint taken (the API's bookkeeping, as for its own calls), but
        # for copy mode's review tools
        result = await self._execute(ctx, prepared, counted=params.name not in COPY_TOOLS)
        if params.name == LAND_TOOL:  # the landing's own record, as every front-end's (its call's are the pipeline's)
            self.box.emit(
                ev.ChangesApplied(
                    executor=Executor.OPENAGENTS,
                    via="mcp",
                    ok=result.ok,
                    applied=result.meta.get("applied_total", 0),
                    left_out=result.meta.get("left_out", [])[:200],
                    conflicts=result.meta.get("conflicts", [])[:200],
                )
            )
        return self._answer(result, params.name)

    def _input_required(self, need: NeedsInput, digest: str) -> types.InputRequiredResult:
        state = secrets.token_urlsafe(18)
        with self._lock:
            self._pending[state] = (digest, time.monotonic())
        ask = types.ElicitRequest(
            params=types.ElicitRequestFormParams(
                message=elicit_message(need.request), requested_schema=elicit_schema(need.request)
            )
        )
        return types.InputRequiredResult(input_requests={_APPROVAL_KEY: ask}, request_state=state)

    def _answer(self, result: ToolResult, name: str = "") -> types.CallToolResult:
        """In copy mode, a call that may have changed files says where the change is and how to land it
        (a failed write or edit changed nothing; a failed command may have)."""
        if not self.copy_mode or not note_call(self.record, name, result.ok):
            return to_call_result(result, self.mode, egress=self.open_world)
        note = in_copy_note(self.record)
        said = result.model_copy(update={"note": "\n".join(p for p in (result.note, note) if p)})
        return to_call_result(said, self.mode, {"in_private_copy": True}, egress=self.open_world)

    def _context(self, ctx: Any, params: types.CallToolRequestParams, digest: str) -> _CallContext:
        caps = ctx.session.client_capabilities
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        elicit = None
        if caps is not None and caps.elicitation is not None and (modern or ctx.session.can_send_request):

            async def elicit(message: str, schema: dict[str, Any]) -> types.ElicitResult:
                answer: types.ElicitResult = await ctx.session.elicit_form(
                    message, schema, related_request_id=ctx.request_id
                )
                return answer

        context = _CallContext(elicit=elicit, modern=modern)
        if modern and params.request_state is not None:
            with self._lock:
                pending = self._pending.pop(params.request_state, None)
            response = (params.input_responses or {}).get(_APPROVAL_KEY)
            # An answer counts only for the very call it was asked about (same tool, same arguments).
            if pending is not None and pending[0] == digest and isinstance(response, types.ElicitResult):
                context.preset = response
            elif elicit is not None:
                context.preset = types.ElicitResult(
                    action="cancel"
                )  # a stale or forged state is a refusal, never a pass
        return context

    async def _execute(self, ctx: Any, prepared: PreparedCall, counted: bool) -> ToolResult:
        """The call in a worker thread; a long-running call (its own deadline) reports its elapsed time
        as MCP progress (a no-op unless the client sent a progressToken); a cancelled request kills
        what the call started."""
        done = anyio.Event()
        outcome: list[ToolResult] = []

        def work() -> None:
            try:
                outcome.append(self.box.execute(prepared, counted=counted))
            finally:
                try:
                    anyio.from_thread.run_sync(done.set)
                except Exception:  # noqa: BLE001 - the loop is gone: nobody waits any more
                    pass

        started = time.monotonic()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(anyio.to_thread.run_sync, work, abandon_on_cancel=True))
                own_deadline = prepared.spec.box.deadline
                if own_deadline is not None:  # a call that runs as long as its arguments say (a command)
                    timeout: float | None = own_deadline(prepared.arguments())
                    while not done.is_set():
                        with anyio.move_on_after(PROGRESS_EVERY_S):
                            await done.wait()
                        if not done.is_set():
                            elapsed = time.monotonic() - started
                            await ctx.session.report_progress(round(elapsed, 1), timeout, f"running for {elapsed:.0f}s")
        except anyio.get_cancelled_exc_class():
            await anyio.to_thread.run_sync(self.box.kill_running)
            raise
        return outcome[0]

    async def serve_stdio(self) -> None:
        """Until the client closes stdin, or SIGTERM/SIGINT/SIGHUP arrives."""
        async with anyio.create_task_group() as tg:

            async def on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
                    async for _ in signals:
                        tg.cancel_scope.cancel()
                        return

            async def serve() -> None:
                async with stdio_server(stdin=StdinLines()) as (read_stream, write_stream):  # type: ignore[arg-type]
                    await self.server.run(read_stream, write_stream, self.server.create_initialization_options())
                tg.cancel_scope.cancel()

            tg.start_soon(on_signal)
            tg.start_soon(serve)


class StdinLines:
    """stdin's lines, read by a daemon thread. The SDK's own reader blocks a worker thread in read(),
    which a SIGTERM cannot interrupt and the interpreter waits for at exit; this one is abandoned."""

    MAX_LINE = 64 << 20

    def __init__(self) -> None:
        self._queue: asyncio.Queue[str | None] | None = None

    def __aiter__(self) -> "StdinLines":
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._queue = queue

        def pump() -> None:
            try:
                while True:
                    raw = sys.stdin.buffer.readline(self.MAX_LINE)
                    loop.call_soon_threadsafe(queue.put_nowait, raw.decode("utf-8", "replace") if raw else None)
                    if not raw:
                        return
            except (RuntimeError, OSError, ValueError):  # the loop is gone, or stdin is
                pass

        threading.Thread(target=pump, name="mcp-stdin", daemon=True).start()
        return self

    async def __anext__(self) -> str:
        assert self._queue is not None
        line = await self._queue.get()
        if line is None:
            raise StopAsyncIteration
        return line


def _digest(name: str, arguments: dict[str, Any]) -> str:
    try:
        text = json.dumps([name, arguments], sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = repr([name, arguments])
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("openagents-sandbox")
    except Exception:  # noqa: BLE001
        return "0"


def serve(box: Sandbox, approver: McpApprover) -> list[str]:
    """Serve until the client goes; then close the sandbox (the API holds SIGINT and SIGTERM off
    while the box is removed and swept). Returns the sweep's lines."""
    server = SandboxMcpServer(box, approver)
    reason = "the MCP client went away"
    try:
        anyio.run(server.serve_stdio)
    except KeyboardInterrupt:
        reason = "interrupted"
    finally:
        swept = box.close(status="closed", reason=reason)
    return swept
