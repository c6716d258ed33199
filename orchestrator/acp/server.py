"""`oa-sandbox acp`: an ACP agent over stdio. The editor drives; our sandbox runs the tools.

The reader thread owns stdin: requests, notifications and the editor's answers to our own
requests (session/request_permission) all arrive there, and it never waits for a session. Each
session/prompt runs in a worker thread, so session/cancel and permission answers are read while it
runs. Each session/new's set-up (policies read from a workspace the box may have written, a
sandbox started: seconds, or worse for a hostile workspace) runs in a worker thread too, so one bad
or slow workspace cannot wedge the other sessions; its answer is sent when set-up ends. The
session's id is in that answer and the session is registered before it is sent, so a prompt can
never reach a session still being set up: an id the editor could not yet know is "unknown". A
malformed frame gets a JSON-RPC error and never ends the process.

The editor's stdio MCP servers (session/new `mcpServers`) are started on the host for the session
(orchestrator/tools/mcp/client.py McpHost), offered to the model as mcp__<server>__<tool>, asked for at
every call, and stopped when the session ends. A prompt the model API fails on ends as a JSON-RPC
error on that session/prompt, with the typed reason in `data`.

In copy mode (a root-owned workspace under `auto`) each prompt turn ends by landing what the turn
changed in the copy, through the sanitiser, and through the editor's fs/write_text_file too when it
offers that (landing.py); the editor is told in a message and in the answer's `_meta`.
"""

from __future__ import annotations

import itertools
import json
import logging
import sys
import threading
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Protocol

from pydantic import BaseModel, ValidationError

from sandbox_agent import jsonbound

from .. import events as ev
from ..errors import ErrorType, OpenAgentsError
from ..loop import SessionStatus
from ..protocol import Executor, ToolResult
from ..tools import catalog
from ..tools.mcp.client import McpHost
from ..tools.registry import HostTools
from ..workspace.records import SessionRecord, WorkspaceMode
from ..workspace.review import shown
from . import models as m
from . import replay
from .approver import AcpApprover, RpcError
from .content import PromptError, prompt_text, roots_of
from .landing import Landing, TurnLander
from .updates import AcpSession, on_event

if TYPE_CHECKING:
    from ..api import Sandbox


log = logging.getLogger(__name__)


SETUP_GRACE = 60.0  # seconds shutdown waits for session set-ups still running (a sandbox start)
EDITOR_WRITE_TIMEOUT_S = 30.0  # an fs/write_text_file the editor has not answered by then counts as refused


class SessionFactory(Protocol):
    """(workspace, approver, on_event, the session's MCP tools, the record of a session to resume) -> its open
    Sandbox (the public API's: the server drives it through its methods, and closes it when the session ends)."""

    def __call__(
        self,
        workspace: Path,
        approver: "AcpApprover",
        on_event: Callable[[dict[str, Any]], None],
        host_tools: HostTools | None,
        /,
        resume: SessionRecord | None = None,
    ) -> Sandbox: ...


class AcpServer:
    def __init__(
        self,
        factory: SessionFactory,
        stdin: BinaryIO | None = None,
        stdout: BinaryIO | None = None,
        workspace: Path | None = None,
    ) -> None:
        self.factory = factory
        self.stdin = stdin or sys.stdin.buffer
        self.stdout = stdout or sys.stdout.buffer
        self.workspace = workspace
        self.sessions: dict[str, AcpSession] = {}
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[Future[Any], str, str]] = {}  # our request id -> (answer, session id, method)
        self.editor_writes = False  # the editor offers fs/write_text_file (initialize's clientCapabilities)
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._setups: set[threading.Thread] = set()
        self._closing = False

    # -- wire --------------------------------------------------------------------------------
    def send(self, message: dict[str, Any]) -> None:
        line = json.dumps({"jsonrpc": "2.0", **message}, ensure_ascii=False).encode() + b"\n"
        with self._write_lock:
            self.stdout.write(line)
            self.stdout.flush()

    def notify(self, method: str, params: BaseModel) -> None:
        self.send({"method": method, "params": params.model_dump(mode="json", exclude_none=True)})

    def request(self, method: str, params: BaseModel, session_id: str) -> Future[Any]:
        future: Future[Any] = Future()
        rid = next(self._ids)
        with self._lock:
            self._pending[rid] = (future, session_id, method)
        self.send({"id": f"oa-{rid}", "method": method, "params": params.model_dump(mode="json", exclude_none=True)})
        return future

    def ask(self, method: str, params: BaseModel, session_id: str, timeout: float) -> Any:
        """A request to the editor, waited for at most `timeout` seconds (TimeoutError; RpcError on its error)."""
        future = self.request(method, params, session_id)
        try:
            return future.result(timeout=timeout)
        except TimeoutError:
            with self._lock:
                for key, (pending, _, _) in list(self._pending.items()):
                    if pending is future:
                        del self._pending[key]
            raise

    def serve(self) -> None:
        try:
            for line in self.stdin:
                if line.strip():
                    self._handle_line(line)
        finally:
            self.shutdown()

    def shutdown(self, setup_grace: float = SETUP_GRACE) -> None:
        """Cancel and close every session. Set-ups still running get `setup_grace` seconds to end;
        each one that ends later closes its own session (see _new_session), so nothing is left."""
        with self._lock:
            self._closing = True
            setups = list(self._setups)
        for thread in setups:
            thread.join(timeout=max(0.0, setup_grace))
        with self._lock:
            sessions = list(self.sessions.values())
            self.sessions.clear()
        for session in sessions:
            self._cancel(session)
            session.close()

    def _handle_line(self, line: bytes) -> None:
        try:
            raw = jsonbound.loads(line)
        except ValueError as err:
            self.send({"id": None, "error": {"code": m.PARSE_ERROR, "message": f"parse error: {err}"}})
            return
        try:
            msg = m.JsonRpcMessage.model_validate(raw)
        except ValidationError as err:
            rid = raw.get("id") if isinstance(raw, dict) and isinstance(raw.get("id"), (int, str)) else None
            self.send(
                {
                    "id": rid,
                    "error": {"code": m.INVALID_REQUEST, "message": f"invalid request: {err.errors()[0]['msg']}"},
                }
            )
            return
        if msg.method is None:
            self._resolve(msg)
            return
        if msg.id is None:
            self._notification(msg)
            return
        if msg.method == "session/prompt":
            threading.Thread(target=self._respond, args=(msg,), daemon=True, name="acp-prompt").start()
        elif msg.method in ("session/new", "session/load"):
            self._start_setup(msg)
        else:
            self._respond(msg)

    def _start_setup(self, msg: m.JsonRpcMessage) -> None:
        """session/new off the reader thread; the thread is tracked so shutdown can wait for it."""

        def run() -> None:
            try:
                self._respond(msg)
            finally:
                with self._lock:
                    self._setups.discard(threading.current_thread())

        thread = threading.Thread(target=run, daemon=True, name="acp-setup")
        with self._lock:
            self._setups.add(thread)
        thread.start()

    def _resolve(self, msg: m.JsonRpcMessage) -> None:
        rid = str(msg.id or "")
        key = int(rid[3:]) if rid.startswith("oa-") and rid[3:].isdigit() else None
        with self._lock:
            entry = self._pending.pop(key, None) if key is not None else None
        if entry is None:
            return
        future = entry[0]
        if msg.error:
            future.set_exception(RpcError(msg.error.code, msg.error.message))
        else:
            future.set_result(msg.result)

    def _respond(self, msg: m.JsonRpcMessage) -> None:
        handler = {
            "initialize": self._initialize,
            "session/new": self._new_session,
            "session/load": self._load_session,
            "session/prompt": self._prompt,
        }.get(msg.method or "")
        try:
            if handler is None:
                raise RpcError(m.METHOD_NOT_FOUND, f"method not found: {msg.method}")
            result = handler(msg.params or {})
            self.send({"id": msg.id, "result": result.model_dump(mode="json", exclude_none=True, by_alias=True)})
        except RpcError as err:
            error = {"code": err.code, "message": str(err)}
            self.send({"id": msg.id, "error": error if err.data is None else {**error, "data": err.data}})
        except ValidationError as err:
            self.send(
                {
                    "id": msg.id,
                    "error": {
                        "code": m.INVALID_PARAMS,
                        "message": f"invalid params: {err.errors()[0]['loc']}: {err.errors()[0]['msg']}",
                    },
                }
            )
        except OpenAgentsError as err:
            self.send(
                {"id": msg.id, "error": {"code": m.INTERNAL_ERROR, "message": err.message, "data": err.to_dict()}}
            )
        except Exception as err:  # never let one request end the agent
            log.exception("ACP request %s failed", msg.method)
            self.send({"id": msg.id, "error": {"code": m.INTERNAL_ERROR, "message": f"{type(err).__name__}: {err}"}})

    def _notification(self, msg: m.JsonRpcMessage) -> None:
        if msg.method == "session/cancel":
            try:
                params = m.CancelParams.model_validate(msg.params or {})
            except ValidationError:
                return
            with self._lock:
                session = self.sessions.get(params.sessionId)
            if session:
                self._cancel(session)

    # -- methods -----------------------------------------------------------------------------
    def _initialize(self, params: dict[str, Any]) -> m.InitializeResult:
        self.editor_writes = m.InitializeParams.model_validate(params).can_write_files()
        return m.InitializeResult()

    def _new_session(self, params: dict[str, Any]) -> m.NewSessionResult:
        p = m.NewSessionParams.model_validate(params)
        if not Path(p.cwd).is_absolute():
            raise RpcError(m.INVALID_PARAMS, f"cwd must be an absolute path, not {p.cwd[:200]!r}")
        workspace = (self.workspace or Path(p.cwd)).resolve()
        if not workspace.is_dir():
            raise RpcError(m.INVALID_PARAMS, f"cwd {p.cwd} is not a directory")
        roots = (
            roots_of(p.cwd, workspace)
            if self.workspace is None
            else roots_of(str(self.workspace.absolute()), workspace)
        )
        session = AcpSession(id=f"sess_{uuid.uuid4().hex}", workspace=workspace, roots=roots)
        self._open(session, p.mcpServers)
        return m.NewSessionResult(sessionId=session.id)

    def _load_session(self, params: dict[str, Any]) -> m.LoadSessionResult:
        """A recorded session (`oa-sandbox sessions`: its id is the ACP session's) continued: its
        workspace, its copy in copy mode, its conversation for the model; the conversation is sent
        again as session/update notifications, then the answer. Refused, typed: a running or
        discarded session, one without a transcript, one of another workspace."""
        from ..transcript.resume import find

        p = m.LoadSessionParams.model_validate(params)
        if not Path(p.cwd).is_absolute():
            raise RpcError(m.INVALID_PARAMS, f"cwd must be an absolute path, not {p.cwd[:200]!r}")
        with self._lock:
            if p.sessionId in self.sessions:
                raise RpcError(m.INVALID_PARAMS, f"session {p.sessionId[:100]} is open already")
        try:
            record = find(p.sessionId)
        except OpenAgentsError as err:
            raise RpcError(m.INVALID_PARAMS, err.message, data=err.to_dict()) from None
        workspace = (self.workspace or Path(p.cwd)).resolve()
        if str(workspace) != record.workspace:
            raise RpcError(m.INVALID_PARAMS, f"session {record.id} worked on {record.workspace}, not {workspace}")
        roots = (
            roots_of(p.cwd, workspace)
            if self.workspace is None
            else roots_of(str(self.workspace.absolute()), workspace)
        )
        session = AcpSession(id=record.id, workspace=workspace, roots=roots)
        self._open(session, p.mcpServers, record)
        return m.LoadSessionResult()

    def _open(
        self, session: AcpSession, mcp_servers: list[dict[str, Any]], resume: SessionRecord | None = None
    ) -> None:
        """A session's parts made (a resumed one's conversation replayed), then registered: before
        the answer is sent (see the module's docstring)."""
        workspace = session.workspace
        session.mcp = McpHost(mcp_servers, workspace=workspace) if mcp_servers else None
        approver = AcpApprover(self, session.id)
        try:
            if session.mcp:
                session.mcp.start()  # the user's own servers, on the host; failures are named in .problems
                for problem in session.mcp.problems:
                    log.warning("session %s: %s", session.id, problem)
            box = session.box = self.factory(
                workspace, approver, lambda event: self._on_event(session, event), session.mcp, resume=resume
            )
            record = box.record
            session.id = approver.session_id = record.id  # the id `oa-sandbox sessions` lists, and session/load takes
            if record.mode == WorkspaceMode.COPY:  # the landing's decision recorded in the transcript, as a call's
                session.lander = TurnLander(record, workspace, box)
            if session.mcp:
                box.emit(
                    ev.McpServersStarted(
                        executor=Executor.OPENAGENTS, tools=session.mcp.names(), problems=session.mcp.problems
                    )
                )
            rebuilt = box.resumed
            if resume is not None and rebuilt is not None:
                for update in replay.updates(rebuilt.replay, workspace):
                    self._update(session, update)
        except BaseException:
            session.close()
            raise
        with self._lock:
            closing = self._closing
            if not closing:
                self.sessions[session.id] = session  # before the answer is sent: see the module's docstring
        if closing:
            session.close()
            raise RpcError(m.INTERNAL_ERROR, "the agent is shutting down")

    def _prompt(self, params: dict[str, Any]) -> m.PromptResult:
        p = m.PromptParams.model_validate(params)
        with self._lock:
            session = self.sessions.get(p.sessionId)
        box = session.box if session is not None else None
        if session is None or box is None:
            raise RpcError(m.INVALID_PARAMS, f"unknown session {p.sessionId}")
        if not session.busy.acquire(blocking=False):
            raise RpcError(m.INVALID_REQUEST, "a prompt is already running in this session")
        try:
            try:
                reader = catalog.file_reader().name

                def read_link(rel: str) -> ToolResult:  # through the pipeline: the ladder, a deny rule, the transcript
                    decided = box.decide(reader, {"path": rel}, f"link_{uuid.uuid4().hex[:12]}")
                    return decided if isinstance(decided, ToolResult) else box.execute(decided, counted=False)

                text = prompt_text(p.prompt, session.roots, read_link)
            except PromptError as err:
                raise RpcError(m.INVALID_PARAMS, str(err)) from None
            result = box.run_turns(text, again=True)
            landing = self._land(session)  # however the turn ended: what was allowed and done lands
        finally:
            session.busy.release()
        meta = landing.meta() if landing else None
        if result.status == SessionStatus.CANCELLED:
            return m.PromptResult(stopReason="cancelled", meta=meta)
        if result.error and result.error.type == ErrorType.MAX_TURNS:
            return m.PromptResult(stopReason="max_turn_requests", meta=meta)
        if result.status == SessionStatus.STOPPED and result.error and result.error.type != ErrorType.LOOP_DETECTED:
            # the model API failed, or the sandbox or the workspace did: an error on this request, typed
            raise RpcError(
                m.INTERNAL_ERROR, result.reason, data={**result.error.model_dump(mode="json"), **(meta or {})}
            )
        if result.status == SessionStatus.STOPPED:
            self._update(session, m.AgentMessageChunk(content=m.TextContent(text=f"[stopped: {result.reason}]")))
        return m.PromptResult(stopReason="end_turn", meta=meta)

    def _land(self, session: AcpSession) -> Landing | None:
        """Copy mode: the turn's changes into the user's workspace (landing.py), said to the editor."""
        if session.lander is None:
            return None

        def write(path: str, content: str) -> None:
            self.ask(
                "fs/write_text_file",
                m.WriteTextFileParams(sessionId=session.id, path=path, content=content),
                session.id,
                EDITOR_WRITE_TIMEOUT_S,
            )

        landing = session.lander.land(write if self.editor_writes else None)
        if session.box is not None and (
            landing.error is None or landing.applied
        ):  # the landing ran: its outcome, as MCP's and the API's
            session.box.emit(
                ev.ChangesApplied(
                    executor=Executor.OPENAGENTS,
                    via="acp",
                    ok=landing.error is None and not landing.conflicts,
                    applied=len(landing.applied),
                    left_out=[shown(lo.path) for lo in landing.left_out[:200]],
                    conflicts=[shown(c.path) for c in landing.conflicts[:200]],
                )
            )
        text = landing.message()
        if text:
            self._update(session, m.AgentMessageChunk(content=m.TextContent(text=text)))
        return landing

    def _cancel(self, session: AcpSession) -> None:
        if session.box is None:
            return
        session.box.cancel()
        with self._lock:
            # only permission requests are answered "cancelled" here; a file write is the editor's to answer
            waiting = [
                (k, f)
                for k, (f, sid, method) in self._pending.items()
                if sid == session.id and method == "session/request_permission"
            ]
            for key, _ in waiting:
                self._pending.pop(key, None)
        for _, future in waiting:
            if not future.done():
                future.set_result({"outcome": {"outcome": "cancelled"}})
        session.box.kill_running()
        if session.mcp:  # a stalled call to the editor's MCP server ends now too, not at its own deadline
            session.mcp.kill_running()

    # -- transcript events -> session/update -------------------------------------------------
    def _update(self, session: AcpSession, update: m.SessionUpdate) -> None:
        self.notify("session/update", m.SessionNotification(sessionId=session.id, update=update))

    def _on_event(self, session: AcpSession, record: dict[str, Any]) -> None:
        on_event(session, record, self._update)
