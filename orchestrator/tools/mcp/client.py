"""MCP tools in: the user's own stdio MCP servers, started on the host, offered to the model as
host-side tools named `mcp__<server>__<tool>`.

The servers are the user's (from ACP's session/new `mcpServers`, or the config): they run on the
host with the user's rights, and nothing of theirs enters the box. Nothing of the box's enters them
either: each program, its `#!` interpreters, its PATH, working directory and HOME are decided once,
at the start, outside every place the box writes (launch.py; `workspace` names the session's). The SDK
is asyncio, the session is threads: one event-loop thread per McpHost runs every server's client, and
the methods here are synchronous, each with its own deadline. A server that crashes or stalls gives a
typed error, never a hung turn; close() stops them all (each server's whole process group is killed).

A server is a peer the user chose, not the user: what it sends is hostile data like the box's.
Every message is bounded before it is parsed (transport.py: MAX_MESSAGE_BYTES; past it the server
is killed and dropped); its text reaches a person or our own messages only through
ground.text.visible() (problems, errors, descriptions, the SDK's log lines); a call's deadline
is the shell's (60 s, never past 240 s) unless configured lower, and a server that passes it is
killed, process group and all, and dropped; Ctrl-C and --max-wall (kill_running) end a call at once.

Approvals: every call is kind `other`, so the default ladder asks every time; policy keys are the
tool name (`tool = "mcp__github__create_issue"`) and the server (`action = "mcp github"`), so a
deny rule switches one tool or a whole server off. The servers' tool annotations are hints from
outside and are never used to loosen that.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import threading
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, TextIO

from pydantic import BaseModel, ConfigDict, ValidationError

from sandbox_agent import jsonbound
from sandbox_agent.limits import SHELL_DEFAULT_TIMEOUT_S, SHELL_MAX_TIMEOUT_S

from ...errors import ErrorType, OpenAgentsError
from ...ground.text import visible
from ...models.base import ToolCall
from ...models.dialects import dialect
from ...protocol import Executor, ToolResult
from .. import declarations as decl
from ..args import parse_arguments
from ..registry import PreparedCall
from ..tooldef import ToolDef
from .launch import Launch, plan
from .names import PREFIX, tool_name
from .names import action as server_action
from .spec import McpServerSpec
from .transport import MAX_MESSAGE_BYTES, ServerProcess, bounded_stdio

log = logging.getLogger(__name__)

MAX_DESCRIPTION = 2000
MAX_SCHEMA_BYTES = 32 * 1024
MAX_SCHEMA_DEPTH = 32  # levels of [ and {; real tool schemas have a handful
MAX_OUTPUT_CHARS = 256 * 1024
MAX_STRUCTURED_BYTES = 64 * 1024


class McpArguments(BaseModel):
    """Whatever object the model passed; the server's own input schema checked it."""

    model_config = ConfigDict(extra="allow")


@dataclass(frozen=True)
class McpTool:
    name: str  # mcp__<server>__<tool>, as the model sees it
    server: str
    tool: str  # the server's own name
    description: str
    schema: dict[str, Any]

    @property
    def action(self) -> str:
        return server_action(self.server)


@dataclass
class _Server:
    spec: McpServerSpec
    launch: Launch
    client: Any = None
    stop: asyncio.Event | None = None
    task: Future[None] | None = None
    lost: str = ""  # why the server is gone, once it is (visible text)
    lost_type: ErrorType = ErrorType.AGENT_LOST
    process: ServerProcess = field(default_factory=ServerProcess)
    waiting: set[threading.Event] = field(default_factory=set)  # one per call in flight
    done: threading.Event = field(default_factory=threading.Event)  # its task has unwound: the process is gone
    tools: list[McpTool] = field(default_factory=list)


class McpHost:
    """The user's MCP servers for one session; a registry's extra host-side tools."""

    def __init__(
        self,
        servers: Sequence[dict[str, Any] | McpServerSpec],
        *,
        start_deadline_s: float = 30.0,
        call_deadline_s: float = SHELL_DEFAULT_TIMEOUT_S,
        log_dir: Path | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        workspace: Path | str | None = None,
    ) -> None:
        """`workspace`: the session's (its servers' programs, PATH, working directory and HOME are
        kept out of it and out of the state directory; without it, out of the state directory only)."""
        self.start_deadline_s = start_deadline_s
        self.call_deadline_s = min(call_deadline_s, SHELL_MAX_TIMEOUT_S)  # the shell's limit, unless lower
        self.max_message_bytes = max_message_bytes
        self.log_dir = log_dir
        self.problems: list[str] = []  # servers that could not start or were refused, one line each, visible()
        self._servers: dict[str, _Server] = {}
        self.roots = launch_roots(workspace)
        self._dir: tempfile.TemporaryDirectory[str] | None = (
            None  # the servers' own working directories (and HOMEs), made at start()
        )
        for raw in servers:
            if isinstance(raw, dict) and (kind := raw.get("type")) not in (None, "stdio"):
                self.problems.append(
                    visible(
                        f"MCP server {str(raw.get('name'))[:64]!r}: only "
                        f"stdio servers are supported (not {str(kind)[:20]})"
                    )
                )
                continue
            try:
                spec = raw if isinstance(raw, McpServerSpec) else McpServerSpec.model_validate(raw)
            except ValidationError as err:
                self.problems.append(
                    visible(f"an MCP server entry is not valid: {err.errors(include_input=False)[0]['msg']}")
                )
                continue
            if spec.key in self._servers:
                self.problems.append(visible(f"MCP server {spec.name!r}: a second server with that name was left out"))
                continue
            try:
                launch = plan(spec, self.roots, _sdk_environment())
            except OpenAgentsError as err:
                self.problems.append(visible(err.message))
                continue
            if launch.resolved.problem:
                self.problems.append(visible(f"MCP server {spec.name!r} not started: {launch.resolved.problem}"))
                continue
            self._servers[spec.key] = _Server(spec, launch)
        self._tools: dict[str, McpTool] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._logs: list[TextIO] = []

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "McpHost":
        """Start every server and list its tools. A server that fails or passes the start deadline
        is left out (named in `problems`); the others go on."""
        if not self._servers or self._loop is not None:
            return self
        _escape_sdk_logs()
        self._dir = tempfile.TemporaryDirectory(prefix="oa-mcp-", ignore_cleanup_errors=True)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-host", daemon=True)
        self._thread.start()
        ready: dict[str, Future[bool]] = {}
        for key, server in self._servers.items():
            ready[key] = Future()
            server.task = asyncio.run_coroutine_threadsafe(self._hold(server, ready[key]), self._loop)
        try:
            for key, server in self._servers.items():
                try:
                    ready[key].result(timeout=self.start_deadline_s)
                except FutureTimeout:
                    self._drop(
                        server, f"MCP server {server.spec.name!r} did not answer within {self.start_deadline_s:.0f}s"
                    )
                except Exception as err:  # noqa: BLE001 - a server the user named failed: say so, go on
                    notes = "; ".join(server.launch.notes())
                    self._drop(
                        server,
                        f"MCP server {server.spec.name!r} failed to start: {server.lost or _why(err)}"
                        + (f" ({notes})" if notes else ""),
                    )
        except BaseException:  # Ctrl-C while they start: the caller never gets this host to close
            for server in self._servers.values():
                server.process.kill_group("interrupted")
            self.close()
            raise
        for server in self._servers.values():
            for tool in server.tools:
                if tool.name in self._tools:
                    self.problems.append(f"MCP tool {tool.name} offered twice: the second was left out")
                    continue
                self._tools[tool.name] = tool
        return self

    def _drop(self, server: _Server, why: str) -> None:
        server.lost = visible(why)
        self.problems.append(server.lost)
        server.process.kill_group("dropped")
        if server.task is not None:
            server.task.cancel()

    def _kill(self, server: _Server, why: str, kind: ErrorType) -> None:
        """A server that stopped answering, or a call the session ends: its process group is
        killed now, the calls waiting on it return, and it is not used again."""
        if not server.lost:
            server.lost, server.lost_type = visible(why), kind
        server.process.kill_group(why)
        for wake in list(server.waiting):
            wake.set()

    def kill_running(self) -> None:
        """Ctrl-C or --max-wall: every server with a call in flight is killed and its call returns."""
        for server in self._servers.values():
            if server.waiting:
                self._kill(
                    server,
                    f"MCP server {server.spec.name!r} was stopped mid-call: "
                    "the session was cancelled or ran out of time",
                    ErrorType.CANCELLED,
                )

    async def _hold(self, server: _Server, ready: Future[bool]) -> None:
        """One server's whole life in one task: the SDK's context managers open and close in the same task."""
        from mcp import Client

        spec, launch = server.spec, server.launch
        server.stop = asyncio.Event()
        errlog = self._errlog(spec)

        def lost(why: str) -> None:
            server.lost, server.lost_type = visible(f"MCP server {spec.name!r} {why}"), ErrorType.PROTOCOL_ERROR

        if self._dir is None:  # start() makes it before any server's task
            raise RuntimeError("the MCP host was not started")
        own = os.path.join(self._dir.name, spec.key)  # an empty directory of its own, in the host's private one
        os.mkdir(own, 0o700)
        env = {**launch.env, **({"HOME": own} if launch.own_home else {})}
        transport = bounded_stdio(
            launch.argv[0],
            list(launch.argv[1:]),
            env,
            launch.cwd or own,
            errlog,
            server.process,
            lost,
            self.max_message_bytes,
        )
        try:
            async with Client(transport, read_timeout_seconds=self.call_deadline_s) as client:
                server.client = client
                listing = await client.list_tools()
                server.tools = [t for t in (_tool(spec.key, raw) for raw in listing.tools) if t is not None]
                ready.set_result(True)
                await server.stop.wait()
        except BaseException as err:
            started = ready.done()
            if not started:  # start() names it
                ready.set_exception(err if isinstance(err, Exception) else RuntimeError("cancelled"))
            if not isinstance(err, Exception):
                raise
            if started:
                server.lost = server.lost or visible(f"MCP server {spec.name!r} stopped: {_why(err)}")
        finally:
            server.client = None
            server.done.set()

    def _errlog(self, spec: McpServerSpec) -> TextIO:
        """The server's stderr: a log file in the session's directory, never our terminal or ACP's stderr."""
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            fh = open(self.log_dir / f"mcp-{spec.key}.log", "a", encoding="utf-8")
        else:
            fh = open(os.devnull, "w", encoding="utf-8")
        self._logs.append(fh)
        return fh

    def close(self) -> None:
        """Stop every server (stdin closed, then its process group killed) and the loop thread."""
        loop = self._loop
        if loop is None:
            return
        for server in self._servers.values():
            if server.stop is not None:
                loop.call_soon_threadsafe(server.stop.set)
        for server in self._servers.values():
            if server.task is not None:
                server.done.wait(timeout=10)  # the SDK's shutdown: stdin closed, 2 s, SIGTERM, 2 s, SIGKILL
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        loop.close()
        self._loop = None
        for fh in self._logs:
            fh.close()
        if self._dir is not None:
            self._dir.cleanup()  # what the servers left there: no link followed
            self._dir = None

    def __enter__(self) -> "McpHost":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def launches(self) -> dict[str, Launch]:
        """Each server that will be started, by name, and what it runs (refused ones are in `problems`)."""
        return {server.spec.name: server.launch for server in self._servers.values()}

    # -- what the registry needs ---------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self._tools)

    def owns(self, name: str) -> bool:
        return name.startswith(PREFIX)

    def declarations(self, family: str) -> list[dict[str, Any]]:
        """Per family, like the built-ins (tools/declarations.py): each in its dialect's shape."""
        shape = dialect(family)
        return [
            shape.declare(tool.name, tool.description, decl.clean_schema(tool.schema)) for tool in self._tools.values()
        ]

    def prepare(self, call: ToolCall) -> PreparedCall:
        tool = self._tools.get(call.name)
        if tool is None:
            raise OpenAgentsError(
                ErrorType.UNKNOWN_TOOL,
                f"unknown tool {call.name!r}; the MCP tools are {', '.join(self._tools) or 'none'}",
            )
        args = parse_arguments(call.arguments)
        try:
            import jsonschema

            jsonschema.validate(args, tool.schema)
        except jsonschema.ValidationError as err:
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"{call.name}: {err.message[:500]}") from None
        except jsonschema.SchemaError:
            pass  # the server's schema is its own business; the server checks the call itself
        return PreparedCall(
            call, ToolDef(call.name, "other", "host"), McpArguments.model_validate(args), "other", tool.action
        )

    def invoke(self, prepared: PreparedCall) -> ToolResult:
        tool = self._tools[prepared.spec.name]
        return self.call(tool.name, prepared.args.model_dump())

    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """One call with the host's deadline; a crash, a stall or the server's own error is typed."""
        tool = self._tools.get(name)
        if tool is None:
            return ToolResult.failure(OpenAgentsError(ErrorType.UNKNOWN_TOOL, f"unknown MCP tool {name!r}"))
        server = self._servers[tool.server]
        if server.client is None or server.lost or self._loop is None:
            return ToolResult.failure(
                OpenAgentsError(ErrorType.AGENT_LOST, server.lost or f"MCP server {server.spec.name!r} is not running")
            )
        # The SDK's own timeout is a little later: the host's deadline decides, and kills.
        coroutine = server.client.call_tool(tool.tool, arguments, read_timeout_seconds=self.call_deadline_s + 5)
        wake = threading.Event()
        server.waiting.add(wake)
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        future.add_done_callback(lambda _: wake.set())
        try:
            answered = wake.wait(self.call_deadline_s)
        except BaseException:  # Ctrl-C while waiting: the server goes with the call
            self._kill(
                server,
                f"MCP server {server.spec.name!r} was stopped mid-call: the session was interrupted",
                ErrorType.CANCELLED,
            )
            future.cancel()
            raise
        finally:
            server.waiting.discard(wake)
        if not answered:
            self._kill(
                server,
                f"MCP server {server.spec.name!r} did not answer {name} within "
                f"{self.call_deadline_s:.0f}s: it was stopped (its process group killed)",
                ErrorType.TIMEOUT,
            )
            future.cancel()
            return ToolResult.failure(OpenAgentsError(ErrorType.TIMEOUT, server.lost))
        if not future.done():  # woken by kill_running or a kill: the call does not wait for the server
            future.cancel()
            return ToolResult.failure(OpenAgentsError(server.lost_type, server.lost))
        try:
            result = future.result(timeout=0)
        except (FutureTimeout, CancelledError):
            return ToolResult.failure(OpenAgentsError(server.lost_type, server.lost or f"{name} was cancelled"))
        except Exception as err:  # noqa: BLE001 - the SDK's errors: a closed connection, a timeout, an MCP error
            return ToolResult.failure(self._call_error(name, server, err))
        return _result(name, tool, result)

    def _call_error(self, name: str, server: _Server, err: Exception) -> OpenAgentsError:
        from mcp import MCPError

        text = visible(_why(err))
        if server.lost:  # the transport or the host ended it (too big a message, a kill): that is the reason
            return OpenAgentsError(server.lost_type, f"{name}: {server.lost}")
        if isinstance(err, TimeoutError) or "timed out" in text.lower():
            self._kill(
                server,
                f"MCP server {server.spec.name!r} did not answer {name} "
                f"within {self.call_deadline_s:.0f}s: it was stopped",
                ErrorType.TIMEOUT,
            )
            return OpenAgentsError(ErrorType.TIMEOUT, server.lost)
        if server.client is None or "closed" in text.lower():
            server.lost = visible(f"MCP server {server.spec.name!r} is gone: {text}")
            server.process.kill_group()  # a child it left behind too
            return OpenAgentsError(
                ErrorType.AGENT_LOST, f"{name}: the MCP server {server.spec.name!r} is gone ({text})"
            )
        if isinstance(err, MCPError):
            return OpenAgentsError(ErrorType.PROTOCOL_ERROR, f"{name}: the MCP server answered with an error: {text}")
        return OpenAgentsError(ErrorType.INTERNAL_ERROR, f"{name}: {text}")


def launch_roots(workspace: Path | str | None) -> list[Path]:
    """Where the box writes, as far as a host of servers knows: the workspace's and the state directory's roots."""
    from ... import state
    from ...programs.reach import box_roots

    return box_roots(workspace) if workspace is not None else [Path(os.path.realpath(state.configured_root()))]


def _sdk_environment() -> dict[str, str]:
    """The SDK's default environment for a stdio server (HOME, LOGNAME,
    PATH, SHELL, TERM, USER; none of PYTHON*, NODE_*, LD_*)."""
    from mcp.client.stdio import get_default_environment

    return get_default_environment()


def _tool(server_key: str, raw: Any) -> McpTool | None:
    """A listed tool as the model will see it; a name no model accepts is made safe, a schema that
    is not an object schema, or far too big, leaves the tool out."""
    name = tool_name(server_key, str(raw.name))
    schema = raw.input_schema if isinstance(raw.input_schema, dict) else {}
    try:
        text = json.dumps(schema)
    except (TypeError, ValueError, RecursionError):
        text = ""
    # Nesting bounded too: validating the model's arguments against the schema, and rewriting it for
    # a model family, recurse once per level (jsonbound.py says why that must stay shallow).
    if (
        schema.get("type") != "object"
        or not text
        or len(text) > MAX_SCHEMA_BYTES
        or jsonbound.deeper_than(text.encode(), MAX_SCHEMA_DEPTH)
    ):
        log.warning("MCP tool %s left out: its input schema is not a bounded object schema", name)
        return None
    description = visible((raw.description or raw.title or raw.name or "")[:MAX_DESCRIPTION])
    return McpTool(
        name=name,
        server=server_key,
        tool=str(raw.name),
        description=f"(MCP server {server_key}) {description}",
        schema=schema,
    )


def _result(name: str, tool: McpTool, result: Any) -> ToolResult:
    parts = []
    for block in result.content or []:
        kind = getattr(block, "type", "?")
        if kind == "text":
            parts.append(block.text)
        else:
            parts.append(f"[{kind} content: {getattr(block, 'mime_type', None) or getattr(block, 'uri', '') or ''}]")
    output = "\n".join(parts)
    note = ""
    if len(output) > MAX_OUTPUT_CHARS:
        note = f"output cut at {MAX_OUTPUT_CHARS} of {len(output)} characters"
        output = output[:MAX_OUTPUT_CHARS]
    meta: dict[str, Any] = {"mcp_server": tool.server, "mcp_tool": tool.tool}
    if result.structured_content is not None:
        encoded = json.dumps(result.structured_content, default=str)
        meta["structured"] = (
            result.structured_content if len(encoded) <= MAX_STRUCTURED_BYTES else f"[{len(encoded)} bytes, left out]"
        )
    if result.is_error:
        err = OpenAgentsError(ErrorType.IO_ERROR, f"{name} reported an error: {visible(output[:2000]) or '(no text)'}")
        return ToolResult.failure(err, executor=Executor.OPENAGENTS, output=output, meta=meta)
    return ToolResult(ok=True, output=output, note=note, meta=meta, executor=Executor.OPENAGENTS)


class _VisibleFormatter(logging.Formatter):
    """The SDK's log lines carry a server's text (a method name, a tool name, a parse error quoting
    the message): made visible, as one line, before they reach stderr."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record)).replace("\n", "\\n")


def _escape_sdk_logs() -> None:
    """The `mcp` logger's records go through _VisibleFormatter (to stderr, at the root's level),
    not raw through the root's handlers."""
    sdk = logging.getLogger("mcp")
    if any(isinstance(h.formatter, _VisibleFormatter) for h in sdk.handlers):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(_VisibleFormatter("oa-sandbox: %(name)s: %(message)s"))
    sdk.addHandler(handler)
    sdk.propagate = False


def _why(err: BaseException) -> str:
    if isinstance(err, BaseExceptionGroup):
        err = err.exceptions[0] if err.exceptions else err
        return _why(err) if not isinstance(err, BaseExceptionGroup) or err.exceptions else str(err)
    return (str(err) or type(err).__name__)[:500]
