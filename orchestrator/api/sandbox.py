"""`Sandbox`: one session on a workspace, for a program. The one place a session is put together
(open_session: policies, copy, box, gate, ladder, transcript, checkpoints, record) and taken apart
(kill, remove, sweep, record), whichever front-end asks.

Every tool call goes through the session's CallPipeline (validate -> ladder -> execute -> record),
as a model's call does in `oa-sandbox run`: a policy's deny refuses it with REFUSED_BY_POLICY, and
the transcript has it. Each call is one turn of the session (a checkpoint after one that may have
changed files, so `rollback(turn)` and `oa-sandbox rollback --turn` reach it).
"""

from __future__ import annotations

import contextlib
import threading
import uuid
import weakref
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .. import events as ev
from ..errors import ErrorType, OpenAgentsError
from ..models.base import ToolCall
from ..policy.approvals import ApprovalGate, Approver, NonInteractiveApprover
from ..protocol import Executor, ToolResult
from ..sandbox.docker import box_on_copy
from ..session import OpenSession, attach_model, open_session
from .approval import CallbackApprover
from .box_files import WRITE_BYTES, BoxFiles
from .box_processes import BoxProcesses
from .driving import DrivingMethods
from .environment import exports, looks_secret, never_passed, screened
from .file_methods import FileMethods
from .lifecycle import (
    Deadlines,
    close_quietly,
    close_scratch,
    hold_interrupts,
    make_scratch,
    quietly,
    release_interrupts,
)
from .options import CLI_KINDS, SandboxOptions, in_keywords
from .own_calls import OwnCallApprover, OwnCalls
from .processes import ProcessMethods
from .review import ReviewMethods
from .tool_calls import SHELL, WRITE, ToolMethods
from .turns import BoxTurns, CallToken

if TYPE_CHECKING:
    from ..loop import TurnLoop
    from ..sandbox.base import Box
    from ..workspace.copy_tools import Landing
    from ..workspace.records import SessionRecord
    from .agent import AgentRun


class Sandbox(ToolMethods, FileMethods, ProcessMethods, ReviewMethods, DrivingMethods):
    """`with Sandbox("repo", auto_approve=True) as box: box.shell("make test")`.

    `options` (a SandboxOptions) and keyword settings (its fields) say how; `kind` is what the
    session record calls it (`oa-sandbox sessions` lists it). Opened on `with` or `open()`; closed
    on leaving the block, on `close()`, on an exception or Ctrl-C, and at interpreter exit at the
    latest. After close every method raises OpenAgentsError(SANDBOX_CLOSED).

    For the project's own front-ends (docs/api.md, "Front-ends"), keyword-only: `box`, a box a warm
    pool started for this workspace and config; `any_caller_lands`, copy mode's `changes` and
    `apply_changes` callable by whoever calls through the pipeline (the MCP server's client), not
    only by this object's own methods."""

    def __init__(
        self,
        workspace: str | PathLike[str] | None = None,
        options: SandboxOptions | None = None,
        *,
        kind: str = "api",
        box: Box | None = None,
        any_caller_lands: bool = False,
        **settings: Any,
    ) -> None:
        if not isinstance(kind, str) or not kind.isidentifier():
            raise OpenAgentsError(
                ErrorType.INVALID_ARGUMENTS, f"kind must be a short name such as 'api', not {kind!r}"[:200]
            )
        if workspace is not None and not isinstance(workspace, (str, PathLike)):
            raise OpenAgentsError(
                ErrorType.INVALID_ARGUMENTS, f"workspace must be a path, not {type(workspace).__name__}"
            )
        self.options = SandboxOptions.of(options, settings)
        # None: a scratch directory made at open and removed at close (or the resumed session's own workspace)
        self.workspace: Path | None = Path(workspace) if workspace is not None else None
        self._scratch: Path | None = None
        self.kind = kind
        self._box = box  # a front-end's box already started for this workspace and config (a warm pool's): bind mode
        self._any_caller_lands = (
            any_caller_lands  # copy mode's changes/apply_changes for every caller (the MCP server's client)
        )
        self._opened: OpenSession | None = None
        self._gate: ApprovalGate | None = None  # the session's, kept after close (decide_landing)
        self._record: SessionRecord | None = None  # kept after close: the session's id and record stay readable
        self._closed = False
        self._turn = 0
        self._lock = threading.Lock()
        self._books = threading.Lock()  # a call's bookkeeping (turn, checkpoint, record) against close
        self._sinks: list[Callable[[dict[str, Any]], None]] = []
        self._finalizer: weakref.finalize | None = None  # type: ignore[type-arg]
        self._status = ("closed", "the program closed the sandbox")
        self._run: AgentRun | None = None
        self._agent: tuple[tuple[str, str | None, str | None], TurnLoop] | None = (
            None  # the last run's model and turn loop
        )
        self._landing: Landing | None = (
            None  # copy mode: changes and apply_changes, host tools of the session's registry
        )
        self._issued: set[str] = set()  # the ids of this program's own calls of them (a model's are unknown tools)
        self._asked: set[str] = set()  # the ids of every call of this program's own (what would ask runs, as `exec`'s)
        self._review = (
            threading.Lock()
        )  # one changes()/apply()/rollback() at a time: each reads its own call's typed outcome
        self._own_calls: OwnCalls | None = None  # rollback(): a host tool of the session's registry, the program's own
        self._files: BoxFiles | None = (
            None  # read_bytes/write_bytes: host tools of the session's registry, the program's own
        )
        self._current = threading.local()  # the calling thread's CallToken (the async API's), for BoxTurns
        self._turns: BoxTurns | None = None  # whose command the box runs: a cancel ends its own call only
        self._exported: dict[
            str, str
        ] = {}  # env names the agent's shell would drop: exported to each command (BoxTurns)
        self._deadlines: Deadlines | None = None  # idle_timeout, lifetime
        self._closed_why = ""  # what closed it, when not the program (a deadline)

    # -- life cycle ------------------------------------------------------------------------------
    def open(self) -> "Sandbox":
        if self._closed:
            raise self._closed_error()
        if self._opened is not None:
            return self
        options = self.options
        try:
            opened = self._start()
        except BaseException:
            self._drop_scratch()
            if self._box is not None:  # a warm pool's box handed over: it goes with this failed open
                try:
                    self._box.close()
                except Exception:  # noqa: BLE001 - removed already (the session's own clean-up), or the daemon is gone
                    pass
            raise
        self._opened, self._record, self._gate = opened, opened.record, opened.pipeline.gate
        if options.labels is not None:  # the program's names for it, in its record (sessions.list_sessions finds them)
            opened.record.labels = dict(options.labels)
            opened.record.save()
        if self._framed_by_loop:  # run() without a model goes on with the one opened
            self._agent = ((options.model or "", options.base_url, options.api_key_env), opened.turn_loop)
        if opened.record.mode.value == "copy":  # as the MCP server's: through the one pipeline, decided and recorded
            from ..workspace.copy_tools import CopyTools, Landing  # copy mode's review: imported where it is used
            from ..workspace.fork_tool import ForkTools

            registry = opened.pipeline.registry
            self._landing = Landing(opened.record)
            registry.host_tools = CopyTools(
                self._landing, registry.host_tools, None if self._any_caller_lands else self._issued
            )
            registry.host_tools = ForkTools(
                opened.record,
                registry.host_tools,
                None if self._any_caller_lands else self._issued,
                box_on_copy=box_on_copy,
            )
        registry = opened.pipeline.registry
        opened.transcript.redactor.add(self._exported.values())
        self._turns = registry.sandbox = BoxTurns(
            registry.sandbox, self._current, exports(self._exported), lambda: opened.pipeline.cancel
        )
        self._own_calls = OwnCalls(lambda: opened.checkpoints, opened.kill_running, self._issued, registry.host_tools)
        registry.host_tools = self._own_calls
        self._files = BoxFiles(lambda: registry.sandbox, self._issued, registry.host_tools)
        registry.host_tools = self._files
        registry.host_tools = BoxProcesses(lambda: registry.sandbox, self._asked, registry.host_tools)
        # However the program ends (no close, an exception nobody caught), the box goes at exit.
        self._finalizer = weakref.finalize(self, close_quietly, opened, self._scratch)
        if options.idle_timeout is not None or options.lifetime is not None:
            self._deadlines = Deadlines(
                weakref.WeakMethod(self._expire),
                weakref.WeakMethod(self._working),
                options.idle_timeout,
                options.lifetime,
            )
        if not self._framed_by_loop:  # a model's turn loop writes its own session_start and session_end, per run
            opened.transcript.emit(
                ev.SessionStarted(
                    task=f"({self.kind})",
                    model="",
                    family=self.kind,
                    session_id=opened.record.id,
                    workspace=str(opened.pipeline.registry.workspace),
                    workspace_mode=opened.record.mode.value,
                    tools=opened.pipeline.registry.active(),
                )
            )
        return self

    def _start(self) -> OpenSession:
        """open_session with this object's options: the one place a session is put together; a typed
        error for what fails, naming the Python keyword a program passed (not the CLI's flag)."""
        try:
            return self._open_session()
        except OpenAgentsError as err:
            self._closed = True
            if self.kind not in CLI_KINDS:
                in_keywords(err)
            raise
        except ValueError as err:  # a policy or config value open_session's parts refused
            self._closed = True
            raise OpenAgentsError(ErrorType.CONFIG_INVALID, str(err)[:1000]) from None
        except OSError as err:  # the state directory, the transcript's file
            self._closed = True
            raise OpenAgentsError(
                ErrorType.IO_ERROR, f"{err.filename or 'the session'}: {err.strerror or err}"
            ) from None
        except BaseException:
            self._closed = True
            raise

    def _open_session(self) -> OpenSession:
        options = self.options
        approver: Approver = NonInteractiveApprover()
        if options.approver is not None:  # an Approver (a front-end's: MCP, ACP), or a program's callback
            ask = getattr(options.approver, "ask", None)
            approver = options.approver if callable(ask) else CallbackApprover(options.approver)  # type: ignore[assignment]
        # The program's own calls: what would ask runs (as `oa-sandbox
        # exec`'s), unless it asked for the ladder's questions.
        own = (
            self._asked
            if (options.approve or ("ask" if options.approver is not None else "program")) == "program"
            else None
        )
        on_event, on_record, sinks = (
            options.on_event,
            options.on_record,
            self._sinks,
        )  # never `self`: the session's parts
        # must not hold the sandbox, or one dropped without close() would never be collected (and closed)

        def fanout(record: dict[str, Any]) -> None:
            if (
                on_record is not None
            ):  # a front-end's sink (a live view, stream-json, an editor): as the transcript hands it on
                on_record(record)
            if on_event is not None:
                typed = ev.parse(record)
                if typed is not None:
                    quietly(on_event, typed)
            for sink in list(sinks):
                sink(record)

        transcript = Path(options.transcript).absolute() if options.transcript is not None else None
        if transcript is not None and transcript.exists():
            raise OpenAgentsError(
                ErrorType.INVALID_ARGUMENTS, f"transcript {transcript} exists: a transcript is never appended to"
            )
        resume = self._resumed()
        if self.workspace is None:  # the resumed session's own, or a scratch directory (removed at close)
            self.workspace = Path(resume.workspace) if resume is not None else make_scratch()
            self._scratch = self.workspace if resume is None else None
        if not self.workspace.is_dir():
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"workspace {self.workspace} is not a directory")
        config = options.sandbox_config()
        if (
            self.kind not in CLI_KINDS
        ):  # a program's env: all of it reaches the commands (environment.py); the CLI's --env as documented there
            env = screened("env", config.env, never_passed(options))
            self._exported = {name: value for name, value in env.items() if looks_secret(name)}
            config = config.model_copy(
                update={"env": {name: value for name, value in env.items() if name not in self._exported}}
            )
        return open_session(
            options,
            self.workspace,
            config,
            OwnCallApprover(approver, self._issued, own),
            transcript,
            fanout,
            box=self._box,
            mode=options.workspace_mode(),
            kind=self.kind,
            host_tools=options.host_tools,
            copy_limits=options.copy_limits(),
            resume=resume,
        )

    def _resumed(self) -> SessionRecord | None:
        """The record `options.resume` names, if it can be continued (a session opened without a model
        needs no conversation: any of the caller's, a fork's included) and is of this workspace."""
        if self.options.resume is None:
            return None
        from ..transcript.resume import find

        record = find(self.options.resume, conversation=self.options.model is not None)
        if self.workspace is not None and str(self.workspace.resolve()) != record.workspace:
            raise OpenAgentsError(
                ErrorType.INVALID_ARGUMENTS,
                f"session {record.id} worked on {record.workspace}, not {self.workspace.resolve()}",
            )
        return record

    @property
    def _framed_by_loop(self) -> bool:
        """Opened with a model: its turn loop frames the transcript (session_start and session_end per run)."""
        return self._opened is not None and getattr(self._opened, "turn_loop", None) is not None

    def __enter__(self) -> "Sandbox":
        return self.open()

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: object) -> None:
        if isinstance(err, KeyboardInterrupt):
            self._status = ("cancelled", "interrupted (Ctrl-C)")
        elif err is not None:
            self._status = ("stopped", f"{type(err).__name__}: {str(err)[:300]}")
        self.close()

    def close(self, *, status: str | None = None, reason: str = "") -> list[str]:
        """Kill what runs, remove the box (and its egress gate), sweep the workspace, save the record
        (`status`: what it says, default closed). Idempotent. Ctrl-C is held off while it runs (in
        the main thread), so it runs to its end. Returns the integrity sweep's findings, one line each."""
        if status is not None:
            self._status = (status, reason or status)
        with self._lock:
            if self._closed:
                return []
            self._closed = True
            opened, self._opened = self._opened, None
        if opened is None:
            return []
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._deadlines is not None:
            self._deadlines.stop()
        held = hold_interrupts()
        try:
            try:
                opened.kill_running()  # a call still running in another thread ends now, killed
            except Exception:  # noqa: BLE001 - the box may be gone already; close removes what is left
                pass
            with self._books:  # a call's checkpoint still being taken ends first; none starts after
                status, reason = self._status
                opened.record.turns = max(self._turn, opened.record.turns or 0)
                if getattr(opened, "turn_loop", None) is None:  # else its turn loop said how each run ended
                    opened.transcript.emit(
                        ev.SessionEnded(
                            executor=Executor.USER, status=status, reason=reason, turns=self._turn, last_turn=self._turn
                        )
                    )
                opened.finish(status, reason)
                swept = opened.close()
        finally:
            try:
                self._drop_scratch()
            finally:
                release_interrupts(held)
        return swept

    def _expire(self, why: str) -> None:
        """A deadline passed (idle_timeout, lifetime): closed as close() closes it, saying why."""
        self._closed_why = why
        self.close(status="closed", reason=why)

    def _working(self) -> bool:
        """A model's run is going (no idleness while it is)."""
        return self._run is not None and self._run.running

    def _active(self) -> Any:
        """A call runs in the block (for idle_timeout)."""
        return self._deadlines.busy() if self._deadlines is not None else contextlib.nullcontext()

    def _drop_scratch(self) -> None:
        """A scratch workspace (Sandbox() without one) goes at close, and a failed open's too; in copy
        mode its session is discarded with it (there is nothing to land it in any more)."""
        scratch, self._scratch = self._scratch, None
        if scratch is not None:
            close_scratch(scratch, self._record)

    @property
    def closed(self) -> bool:
        return self._closed

    def _count_call(self, tool: str, ok: bool) -> None:
        """The bookkeeping of one call (this object's own, or a front-end's through execute()): a turn
        counted, a copy session's record told, a checkpoint after a call that may have changed files."""
        opened = self._live()
        with self._active(), self._books:  # one at a time, and never after close() took the session apart
            if self._closed:
                raise self._closed_error()
            self._turn += 1
            if opened.record.mode.value == "copy":
                from ..workspace.copy_session import note_call

                note_call(opened.record, tool, ok)
            opened.checkpoint(self._turn, [WRITE if tool == WRITE_BYTES else tool])  # bytes written: a file changed

    def kill_running(self) -> None:
        """Kill every process the box runs (a call in another thread ends, killed); the box stays."""
        opened, turns = self._opened, self._turns
        if turns is not None:  # the commands sent, and the ones being sent (they never start)
            turns.kill_all()
        elif opened is not None:
            opened.kill_running()

    def _calling_as(self, token: CallToken) -> Any:
        """The calls this thread makes in the block are `token`'s: `_cancel_call(token)` ends them alone."""
        return BoxTurns.calling_as(self._current, token)

    def _cancel_call(self, token: CallToken) -> None:
        """End the call of `token` (the async API's cancel): if it has not reached the box it is never
        sent; if its command runs, that command is killed; no other call is touched."""
        turns = self._turns
        if turns is None:
            token.cancelled.set()
        else:
            turns.cancel(token)

    def _box_files(self) -> BoxFiles:
        self._live()
        assert self._files is not None  # made at open
        return self._files

    def _passed_env(self, env: dict[str, str]) -> dict[str, str]:
        """A call's `env` without what never enters the box (warned about); its secret-looking values
        redacted in the transcript from now on."""
        opened = self._live()
        env = screened(SHELL, env, never_passed(self.options))
        opened.transcript.redactor.add(value for name, value in env.items() if looks_secret(name))
        return env

    def _live(self) -> OpenSession:
        opened = self._opened
        if opened is None:
            raise (
                self._closed_error()
                if self._closed
                else OpenAgentsError(
                    ErrorType.SANDBOX_CLOSED,
                    "the sandbox is not open: use `with Sandbox(...) as box:` or call open() first",
                )
            )
        return opened

    def _closed_error(self) -> OpenAgentsError:
        if self._record is None:
            return OpenAgentsError(
                ErrorType.SANDBOX_CLOSED, "the sandbox failed to open (its error said why): open a new Sandbox"
            )
        why = f" ({self._closed_why})" if self._closed_why else ""
        return OpenAgentsError(
            ErrorType.SANDBOX_CLOSED,
            f"the sandbox of session {self._record.id} is closed{why}: its box is removed; "
            f"open a new Sandbox (or Sandbox(resume={self._record.id!r}))",
        )

    # -- what it is --------------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The session id: `oa-sandbox sessions`, `changes ID`, `apply ID`, `rollback ID` know it (after close too)."""
        return self.record.id

    @property
    def record(self) -> SessionRecord:
        """The session's record, as `oa-sandbox sessions` reads it (still readable after close)."""
        if self._record is not None:
            return self._record
        raise OpenAgentsError(ErrorType.SANDBOX_CLOSED, "the sandbox was never opened: it has no session yet")

    @property
    def mode(self) -> str:
        return self.record.mode.value

    @property
    def transcript_path(self) -> Path:
        return Path(self.record.transcript or "")

    # -- the six tools ---------------------------------------------------------------------------
    def _call(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        on_output: Callable[[str], None] | None,
        call_id: str | None = None,
    ) -> tuple[str, ToolResult]:
        """One call through the pipeline; `call_id` (the bytes methods': their data waits under it) marks it one of the
        program's own host-tool calls."""
        opened = self._live()
        if not isinstance(tool, str):
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"tool must be a str, not {type(tool).__name__}")
        if arguments is not None and not isinstance(arguments, dict):
            raise OpenAgentsError(
                ErrorType.INVALID_ARGUMENTS, f"arguments must be a dict, not {type(arguments).__name__}"
            )
        call = ToolCall(id=call_id or f"api_{uuid.uuid4().hex[:12]}", name=tool, arguments=arguments or {})
        shown = (
            (lambda text: quietly(on_output, text)) if on_output is not None else None
        )  # a failing callback never breaks the call
        self._asked.add(call.id)
        if call_id is not None:
            self._issued.add(call.id)
        try:
            with self._active():
                result = opened.pipeline.run(call, shown)
        except KeyboardInterrupt:
            self._status = ("cancelled", "interrupted (Ctrl-C)")
            raise
        finally:
            self._asked.discard(call.id)
            if call_id is not None:
                self._issued.discard(call.id)
        self._count_call(tool, result.ok)
        return call.id, result

    # -- an agent's run --------------------------------------------------------------------------
    def run(
        self, task: str, *, model: str | None = None, base_url: str | None = None, api_key_env: str | None = None
    ) -> AgentRun:
        """The whole loop on this sandbox: `model` (openai:NAME, anthropic:NAME, gemini:NAME, script:FILE;
        default: the options' `model`) works on `task` with the six tools, through the same pipeline
        and ladder. Iterate the returned AgentRun for the typed events (`--output stream-json`'s), or
        call .wait()."""
        if not isinstance(task, str) or not task.strip():
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, "run: task must be a non-empty str")
        if model is None and self.options.model is not None:
            model, base_url, api_key_env = self.options.model, self.options.base_url, self.options.api_key_env
        if not isinstance(model, str):
            raise OpenAgentsError(
                ErrorType.INVALID_ARGUMENTS,
                f"run: model must be a str such as openai:gpt-5, not {type(model).__name__}",
            )
        opened = self._live()
        if self._run is not None and self._run.running:
            raise OpenAgentsError(
                ErrorType.INVALID_ARGUMENTS,
                "run: the sandbox's previous run is still going: iterate it to its end, or leave it",
            )
        wanted = (model, base_url, api_key_env)
        if self._agent is not None and self._agent[0] == wanted:
            session = self._agent[1]  # the same model again: the conversation goes on, as an editor's next prompt
        else:
            session = attach_model(opened, self.options.with_model(model, base_url, api_key_env))
            self._agent = (wanted, session)
        session.turn = max(session.turn, self._turn)

        def ended(last_turn: int) -> None:
            with self._lock:
                self._turn = max(self._turn, last_turn)

        from .agent import AgentRun  # asyncio and the run's machinery only when a model runs

        self._run = AgentRun(session, task, self._sinks, self.kill_running, ended)
        return self._run


__all__ = ["Sandbox"]
