"""`Sandbox`: one session on a workspace, for a program. The one place a session is put together
(open_session: policies, copy, box, gate, ladder, transcript, checkpoints, record) and taken apart
(kill, remove, sweep, record), whichever front-end asks.

Every tool call goes through the session's CallPipeline (validate -> ladder -> execute -> record),
as a model's call does in `oa-sandbox run`: a policy's deny refuses it with REFUSED_BY_POLICY, and
the transcript has it. Each call is one turn of the session (a checkpoint after one that may have
changed files, so `rollback(turn)` and `oa-sandbox rollback --turn` reach it).
"""
from __future__ import annotations

import signal
import threading
import uuid
import weakref
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .. import events as ev
from ..errors import ErrorType, OpenAgentsError
from ..models.base import ToolCall
from ..policy.approvals import Approver, NonInteractiveApprover
from ..protocol import Executor, ToolResult
from ..sandbox.docker import box_on_copy
from ..session import OpenSession, attach_model, open_session
from ..tools.catalog import CHANGES_TOOL, LAND_TOOL, ROLLBACK_TOOL
from ..tools.defs import edit_file as edit_def
from ..tools.defs import grep_files as grep_def
from ..tools.defs import list_files as list_def
from ..tools.defs import read_file as read_def
from ..tools.defs import shell as shell_def
from ..tools.defs import write_file as write_def
from ..workspace.copy_session import discard_session, note_call
from ..workspace.copy_tools import CopyTools, Landing
from ..workspace.fork_tool import ForkTools
from .agent import AgentRun
from .approval import CallbackApprover
from .names import read_path, write_path
from .options import SandboxOptions
from .own_calls import OwnCallApprover, OwnCalls
from .results import (
    ApplyResult,
    ChangedFile,
    Changes,
    EditResult,
    GrepResult,
    ListResult,
    ReadResult,
    ShellResult,
    ToolError,
    WriteResult,
)

if TYPE_CHECKING:
    from ..loop import TurnLoop
    from ..sandbox.base import Sandbox as BoxBackend
    from ..workspace.checkpoints import Checkpoint, RestoreReport
    from ..workspace.records import SessionRecord

# the tools' names come from their own homes (tools/defs/), as everywhere else
READ, LIST, GREP = read_def.TOOL.name, list_def.TOOL.name, grep_def.TOOL.name
WRITE, EDIT, SHELL = write_def.TOOL.name, edit_def.TOOL.name, shell_def.TOOL.name


def _require(tool: str, name: str, value: Any, kinds: type | tuple[type, ...], what: str) -> None:
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise ToolError(ErrorType.INVALID_ARGUMENTS, f"{tool}: {name} must be {what}, not a bool")
    if not isinstance(value, kinds):
        raise ToolError(ErrorType.INVALID_ARGUMENTS, f"{tool}: {name} must be {what}, not {type(value).__name__}")


class Sandbox:
    """`with Sandbox("repo", auto_approve=True) as box: box.shell("make test")`.

    `options` (a SandboxOptions) and keyword settings (its fields) say how; `kind` is what the
    session record calls it (`oa-sandbox sessions` lists it). Opened on `with` or `open()`; closed
    on leaving the block, on `close()`, on an exception or Ctrl-C, and at interpreter exit at the
    latest. After close every method raises OpenAgentsError(SANDBOX_CLOSED).

    For the project's own front-ends (docs/api.md, "Front-ends"), keyword-only: `box`, a box a warm
    pool started for this workspace and config; `any_caller_lands`, copy mode's `changes` and
    `apply_changes` callable by whoever calls through the pipeline (the MCP server's client), not
    only by this object's own methods."""

    def __init__(self, workspace: str | PathLike[str], options: SandboxOptions | None = None, /, *, kind: str = "api",
                 box: BoxBackend | None = None, any_caller_lands: bool = False, **settings: Any) -> None:
        if not isinstance(kind, str) or not kind.isidentifier():
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"kind must be a short name such as 'api', not {kind!r}"[:200])
        if not isinstance(workspace, (str, PathLike)):
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"workspace must be a path, not {type(workspace).__name__}")
        self.options = SandboxOptions.of(options, settings)
        self.workspace = Path(workspace)
        self.kind = kind
        self._box = box  # a front-end's box already started for this workspace and config (a warm pool's): bind mode
        self._any_caller_lands = any_caller_lands  # copy mode's changes/apply_changes for every caller (the MCP server's client)
        self._opened: OpenSession | None = None
        self._record: SessionRecord | None = None  # kept after close: the session's id and record stay readable
        self._closed = False
        self._turn = 0
        self._lock = threading.Lock()
        self._books = threading.Lock()  # a call's bookkeeping (turn, checkpoint, record) against close
        self._sinks: list[Callable[[dict[str, Any]], None]] = []
        self._finalizer: weakref.finalize | None = None  # type: ignore[type-arg]
        self._status = ("closed", "the program closed the sandbox")
        self._run: AgentRun | None = None
        self._agent: tuple[tuple[str, str | None, str | None], TurnLoop] | None = None  # the last run's model and turn loop
        self._landing: Landing | None = None  # copy mode: changes and apply_changes, host tools of the session's registry
        self._issued: set[str] = set()  # the ids of this program's own calls of them (a model's are unknown tools)
        self._review = threading.Lock()  # one changes()/apply()/rollback() at a time: each reads its own call's typed outcome
        self._own_calls: OwnCalls | None = None  # rollback(): a host tool of the session's registry, the program's own

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
            if self._box is not None:  # a warm pool's box handed over: it goes with this failed open
                try:
                    self._box.close()
                except Exception:  # noqa: BLE001 - removed already (the session's own clean-up), or the daemon is gone
                    pass
            raise
        self._opened, self._record = opened, opened.record
        if self._framed_by_loop:  # run() without a model goes on with the one opened
            self._agent = ((options.model or "", options.base_url, options.api_key_env), opened.turn_loop)
        if opened.record.mode.value == "copy":  # as the MCP server's: through the one pipeline, decided and recorded
            registry = opened.pipeline.registry
            self._landing = Landing(opened.record)
            registry.host_tools = CopyTools(self._landing, registry.host_tools, None if self._any_caller_lands else self._issued)
            registry.host_tools = ForkTools(opened.record, registry.host_tools, None if self._any_caller_lands else self._issued,
                                            box_on_copy=box_on_copy)
        registry = opened.pipeline.registry
        self._own_calls = OwnCalls(lambda: opened.checkpoints, opened.kill_running, self._issued, registry.host_tools)
        registry.host_tools = self._own_calls
        # However the program ends (no close, an exception nobody caught), the box goes at exit.
        self._finalizer = weakref.finalize(self, _close_quietly, opened)
        if not self._framed_by_loop:  # a model's turn loop writes its own session_start and session_end, per run
            opened.transcript.emit(ev.SessionStarted(task=f"({self.kind})", model="", family=self.kind, session_id=opened.record.id,
                                                     workspace=str(opened.pipeline.registry.workspace), workspace_mode=opened.record.mode.value,
                                                     tools=opened.pipeline.registry.active()))
        return self

    def _start(self) -> OpenSession:
        """open_session with this object's options: the one place a session is put together; a typed error for what fails."""
        options = self.options
        if not self.workspace.is_dir():
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"workspace {self.workspace} is not a directory")
        approver: Approver = NonInteractiveApprover()
        if options.approver is not None:  # an Approver (a front-end's: MCP, ACP), or a program's callback
            ask = getattr(options.approver, "ask", None)
            approver = options.approver if callable(ask) else CallbackApprover(options.approver)  # type: ignore[assignment]
        on_event, on_record = options.on_event, options.on_record

        def fanout(record: dict[str, Any]) -> None:
            if on_record is not None:  # a front-end's sink (a live view, stream-json, an editor): as the transcript hands it on
                on_record(record)
            if on_event is not None:
                typed = ev.parse(record)
                if typed is not None:
                    _quietly(on_event, typed)
            for sink in list(self._sinks):
                sink(record)

        transcript = Path(options.transcript).absolute() if options.transcript is not None else None
        if transcript is not None and transcript.exists():
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"transcript {transcript} exists: a transcript is never appended to")
        try:
            resume = self._resumed()
            return open_session(options.session_options(), self.workspace, options.sandbox_config(), OwnCallApprover(approver, self._issued),
                                transcript, fanout, sandbox=self._box, mode=options.workspace_mode(), kind=self.kind,
                                host_tools=options.host_tools, copy_limits=options.copy_limits(), resume=resume)
        except OpenAgentsError:
            self._closed = True
            raise
        except ValueError as err:  # a policy or config value open_session's parts refused
            self._closed = True
            raise OpenAgentsError(ErrorType.CONFIG_INVALID, str(err)[:1000]) from None
        except OSError as err:  # the state directory, the transcript's file
            self._closed = True
            raise OpenAgentsError(ErrorType.IO_ERROR, f"{err.filename or 'the session'}: {err.strerror or err}") from None
        except BaseException:
            self._closed = True
            raise

    def _resumed(self) -> SessionRecord | None:
        """The record `options.resume` names, if it can be continued and is of this workspace."""
        if self.options.resume is None:
            return None
        from ..transcript.resume import find

        record = find(self.options.resume)
        if str(self.workspace.resolve()) != record.workspace:
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"session {record.id} worked on {record.workspace}, not {self.workspace.resolve()}")
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
        held = _hold_interrupts()
        try:
            try:
                opened.kill_running()  # a call still running in another thread ends now, killed
            except Exception:  # noqa: BLE001 - the box may be gone already; close removes what is left
                pass
            with self._books:  # a call's checkpoint still being taken ends first; none starts after
                status, reason = self._status
                opened.record.turns = max(self._turn, opened.record.turns or 0)
                if getattr(opened, "turn_loop", None) is None:  # else its turn loop said how each run ended
                    opened.transcript.emit(ev.SessionEnded(executor=Executor.USER, status=status, reason=reason, turns=self._turn,
                                                           last_turn=self._turn))
                opened.finish(status, reason)
                return opened.close()
        finally:
            _release_interrupts(held)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def parts(self) -> OpenSession:
        """The open session's parts (its pipeline, gate, transcript, checkpoints, turn loop), for the
        project's own front-ends, which drive a loop or a protocol over them (docs/api.md,
        "Front-ends"); a program uses the methods. Not a stable interface."""
        return self._live()

    def record_call(self, tool: str, ok: bool) -> None:
        """The bookkeeping of one call a front-end ran through `parts.pipeline` itself (the MCP server
        splits a call's decision from its run): a turn counted, a copy session's record told, a
        checkpoint after a call that may have changed files, as for this object's own calls."""
        opened = self._live()
        with self._books:  # one at a time, and never after close() took the session apart
            if self._closed:
                raise self._closed_error()
            self._turn += 1
            if opened.record.mode.value == "copy":
                note_call(opened.record, tool, ok)
            opened.checkpoint(self._turn, [tool])

    def kill_running(self) -> None:
        """Kill every process the box runs (a call in another thread ends, killed); the box stays."""
        opened = self._opened
        if opened is not None:
            opened.kill_running()

    def _live(self) -> OpenSession:
        opened = self._opened
        if opened is None:
            raise self._closed_error() if self._closed else OpenAgentsError(
                ErrorType.SANDBOX_CLOSED, "the sandbox is not open: use `with Sandbox(...) as box:` or call open() first")
        return opened

    def _closed_error(self) -> OpenAgentsError:
        if self._record is None:
            return OpenAgentsError(ErrorType.SANDBOX_CLOSED, "the sandbox failed to open (its error said why): open a new Sandbox")
        return OpenAgentsError(ErrorType.SANDBOX_CLOSED, f"the sandbox of session {self._record.id} is closed: its box is removed; open a new Sandbox")

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
    def call(self, tool: str, arguments: dict[str, Any] | None = None, on_output: Callable[[str], None] | None = None) -> ToolResult:
        """One call of any tool by name, through the pipeline; never raises for a tool's failure or
        a refusal (the typed result says it), only for a closed sandbox."""
        return self._call(tool, arguments, on_output)[1]

    def _call(self, tool: str, arguments: dict[str, Any] | None, on_output: Callable[[str], None] | None) -> tuple[str, ToolResult]:
        opened = self._live()
        if not isinstance(tool, str):
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"tool must be a str, not {type(tool).__name__}")
        if arguments is not None and not isinstance(arguments, dict):
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"arguments must be a dict, not {type(arguments).__name__}")
        call = ToolCall(id=f"api_{uuid.uuid4().hex[:12]}", name=tool, arguments=arguments or {})
        shown = (lambda text: _quietly(on_output, text)) if on_output is not None else None  # a failing callback never breaks the call
        try:
            result = opened.pipeline.run(call, shown)
        except KeyboardInterrupt:
            self._status = ("cancelled", "interrupted (Ctrl-C)")
            raise
        self.record_call(tool, result.ok)
        return call.id, result

    def _checked(self, tool: str, arguments: dict[str, Any], on_output: Callable[[str], None] | None = None) -> tuple[str, ToolResult]:
        call_id, result = self._call(tool, arguments, on_output)
        if not result.ok:
            error = result.error
            kind, message = (error.type, error.message) if error is not None else (ErrorType.INTERNAL_ERROR, "the call failed")
            raise ToolError(kind, message, result)
        return call_id, result

    def read_file(self, path: str | bytes | PathLike[str] | PathLike[bytes], offset: int = 1, limit: int | None = None) -> ReadResult:
        """Lines `offset`.. (1-based) of a file, at most `limit` lines and 48 KiB. `path` as
        list_files' entries give it (any name: names.read_path)."""
        rel, name = read_path(READ, path)
        _require(READ, "offset", offset, int, "an int")
        args: dict[str, Any] = {"path": name, "offset": offset}
        if limit is not None:
            _require(READ, "limit", limit, int, "an int")
            args["limit"] = limit
        return ReadResult.of(*self._checked(READ, args), rel)

    def list_files(self, path: str | bytes | PathLike[str] | PathLike[bytes] = ".", recursive: bool = True) -> ListResult:
        """At most 500 entries; .git, node_modules, target, dist skipped."""
        rel, name = read_path(LIST, path)
        _require(LIST, "recursive", recursive, bool, "a bool")
        return ListResult.of(*self._checked(LIST, {"path": name, "recursive": recursive}), rel)

    def grep_files(self, pattern: str, path: str | bytes | PathLike[str] | PathLike[bytes] = ".", glob: str | None = None,
                   ignore_case: bool = False) -> GrepResult:
        """Lines matching a Python regular expression, at most 200."""
        _require(GREP, "pattern", pattern, str, "a str")
        _, name = read_path(GREP, path)
        args: dict[str, Any] = {"pattern": pattern, "path": name, "ignore_case": ignore_case}
        _require(GREP, "ignore_case", ignore_case, bool, "a bool")
        if glob is not None:
            _require(GREP, "glob", glob, str, "a str")
            args["glob"] = glob
        return GrepResult.of(*self._checked(GREP, args), pattern)

    def write_file(self, path: str | PathLike[str], content: str) -> WriteResult:
        """The whole new content of a file (never inside .git)."""
        rel = write_path(WRITE, path)
        _require(WRITE, "content", content, str, "a str")
        return WriteResult.of(*self._checked(WRITE, {"path": rel, "content": content}), rel)

    def edit_file(self, path: str | PathLike[str], old_text: str, new_text: str, allow_multiple: bool = False,
                  expected_sha256: str | None = None) -> EditResult:
        """Replace the exact `old_text` (unique unless allow_multiple); `expected_sha256` (from read_file)
        refuses the edit if the file changed since."""
        rel = write_path(EDIT, path)
        _require(EDIT, "old_text", old_text, str, "a str")
        _require(EDIT, "new_text", new_text, str, "a str")
        _require(EDIT, "allow_multiple", allow_multiple, bool, "a bool")
        args: dict[str, Any] = {"path": rel, "old_text": old_text, "new_text": new_text, "allow_multiple": allow_multiple}
        if expected_sha256 is not None:
            _require(EDIT, "expected_sha256", expected_sha256, str, "a str")
            args["expected_sha256"] = expected_sha256
        return EditResult.of(*self._checked(EDIT, args), rel)

    def shell(self, command: str, timeout: int = 60, on_output: Callable[[str], None] | None = None) -> ShellResult:
        """`/bin/sh -c command` in the workspace, no stdin; `timeout` seconds (at most 240, kept by the
        host too). `on_output(text)` gets the output as it comes. A non-zero exit is a result; a
        timeout raises ToolError(TIMEOUT) with the partial output in `.result`."""
        _require(SHELL, "command", command, str, "a str")
        _require(SHELL, "timeout", timeout, int, "an int (seconds)")
        if on_output is not None and not callable(on_output):
            raise ToolError(ErrorType.INVALID_ARGUMENTS, "shell: on_output must be callable")
        return ShellResult.of(*self._checked(SHELL, {"command": command, "timeout": timeout}, on_output), command)

    # -- a copy session's review -----------------------------------------------------------------
    def changes(self) -> Changes:
        """What the tools changed in the private copy against the real workspace (copy mode): a call of
        `changes` through the pipeline (a rule `tool = "changes"` decides it; a deny raises
        ToolError(REFUSED_BY_POLICY)), recorded in the transcript."""
        self._copy_record("show")
        from ..workspace.review import render_diff, shown

        landing = self._landing
        assert landing is not None
        with self._review:
            landing.last_changes = None
            result = self._own_call(CHANGES_TOOL, {})
            scanned = landing.last_changes
        if not result.ok or scanned is None:
            raise _tool_error(result)
        manifest, found = scanned
        if not found:
            return Changes()
        diff = "\n".join(render_diff(manifest, found))
        stat = "\n".join(render_diff(manifest, found, stat=True))
        return Changes(files=[ChangedFile(path=shown(c.path), status=c.status) for c in found], diff=diff, stat=stat)

    def apply(self) -> ApplyResult:
        """Land the copy's changes in the real workspace through the sanitiser (`oa-sandbox apply`'s),
        a call of `apply_changes` through the pipeline, recorded with its decision and outcome.
        A conflict (a file the user changed since the copy): nothing applied, `ok` false, each listed.
        A landing the policy refuses (a deny rule, copy-only, read-only) raises ToolError(REFUSED_BY_POLICY)."""
        self._copy_record("apply")
        opened = self._live()
        landing = self._landing
        assert landing is not None
        with self._review:
            landing.last_report = None
            result = self._own_call(LAND_TOOL, {})
            report = landing.last_report
        if report is None or (not result.ok and not report.conflicts):  # refused, or stopped before a report
            raise _tool_error(result)
        applied = ApplyResult.of(report)
        opened.transcript.emit(ev.ChangesApplied(executor=Executor.OPENAGENTS, via=self.kind, ok=applied.ok, applied=len(applied.applied),
                                                 left_out=applied.left_out[:200], conflicts=applied.conflicts[:200]))
        return applied

    def _own_call(self, tool: str, arguments: dict[str, Any]) -> ToolResult:
        """This program's own call of a host tool only it may call (changes, apply_changes)."""
        opened = self._live()
        call = ToolCall(id=f"api_{uuid.uuid4().hex[:12]}", name=tool, arguments=arguments)
        self._issued.add(call.id)
        try:
            return opened.pipeline.run(call)
        finally:
            self._issued.discard(call.id)

    def discard(self) -> int:
        """Close the sandbox and remove its copy, checkpoints and transcript (copy mode); returns the
        bytes freed. The record stays, marked discarded."""
        record = self._copy_record("discard")
        self._status = ("closed", "discarded")
        self.close()
        return discard_session(record)

    def report(self, path: str | PathLike[str] | None = None) -> str:
        """The session's self-contained HTML page (`oa-sandbox report ID`'s: orchestrator/report),
        written atomically to `path` when given; the page either way. Open or closed."""
        from ..report import build, write

        page = build(self.record)
        if path is not None:
            write(self.record, Path(path), page=page)
        return page

    def _copy_record(self, action: str) -> SessionRecord:
        record = self._live().record
        if record.mode.value != "copy":
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"session {record.id} runs in bind mode: its changes are already in "
                                                               f"{record.workspace}; nothing to {action}")
        return record

    # -- checkpoints -----------------------------------------------------------------------------
    def checkpoints(self) -> list[Checkpoint]:
        """The session's checkpoints: turn 0 (the start) and one after each call that changed files."""
        store = self._live().checkpoints
        return store.list() if store is not None else []

    def rollback(self, turn: int) -> RestoreReport:
        """The workspace the box sees (the copy, in copy mode) as it was after `turn` (0: the start).
        A file changed since the last checkpoint: nothing restored, the report lists the conflicts.
        A call of `rollback` through the pipeline (own_calls.py): the user's BeforeTool hooks see it,
        the ladder decides it as an edit (a rule `tool = "rollback"` or `kind = "edit"`): a deny or a
        hook's block raises ToolError(REFUSED_BY_POLICY or the hook's type); an ask is answered by this
        call itself (the program asked). Its decision and outcome are in the transcript."""
        _require(ROLLBACK_TOOL, "turn", turn, int, "an int")
        opened = self._live()
        store = opened.checkpoints
        if store is None or not any(point.turn == turn and point.ok for point in store.list()):
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"session {opened.record.id} has no checkpoint of turn {turn} to restore")
        own = self._own_calls
        assert own is not None
        with self._review:
            own.last_report = None
            result = self._own_call(ROLLBACK_TOOL, {"turn": turn})
            report = own.last_report
        if report is None:  # refused, or stopped before a restore
            raise _tool_error(result)
        return report

    def fork(self, n: int = 1, *, turn: int | None = None) -> list[str]:
        """After close: this copy session forked into `n` independent copy sessions (`oa-sandbox fork`'s:
        each its own copy, record and manifest; `oa-sandbox changes/apply/discard ID` work on each);
        their ids. `turn`: the state after that checkpoint instead of the latest. Typed errors: still
        open, bind mode, discarded, `n` out of 1..MAX_FORKS."""
        if not self._closed or self._record is None:
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, "a sandbox is forked once it is closed (its session has ended)")
        from ..workspace.fork import fork_session

        return [record.id for record in fork_session(self._record.id, n, turn, box_on_copy=box_on_copy)]

    # -- an agent's run --------------------------------------------------------------------------
    def run(self, task: str, *, model: str | None = None, base_url: str | None = None, api_key_env: str | None = None) -> AgentRun:
        """The whole loop on this sandbox: `model` (openai:NAME, anthropic:NAME, gemini:NAME, script:FILE;
        default: the options' `model`) works on `task` with the six tools, through the same pipeline
        and ladder. Iterate the returned AgentRun for the typed events (`--output stream-json`'s), or
        call .wait()."""
        if not isinstance(task, str) or not task.strip():
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, "run: task must be a non-empty str")
        if model is None and self.options.model is not None:
            model, base_url, api_key_env = self.options.model, self.options.base_url, self.options.api_key_env
        if not isinstance(model, str):
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"run: model must be a str such as openai:gpt-5, not {type(model).__name__}")
        opened = self._live()
        if self._run is not None and self._run.running:
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, "run: the sandbox's previous run is still going: iterate it to its end, or leave it")
        wanted = (model, base_url, api_key_env)
        if self._agent is not None and self._agent[0] == wanted:
            session = self._agent[1]  # the same model again: the conversation goes on, as an editor's next prompt
        else:
            session = attach_model(opened, self.options.session_options(model, base_url, api_key_env))
            self._agent = (wanted, session)
        session.turn = max(session.turn, self._turn)

        def ended(last_turn: int) -> None:
            with self._lock:
                self._turn = max(self._turn, last_turn)

        self._run = AgentRun(session, task, self._sinks, opened.kill_running, ended)
        return self._run


def _tool_error(result: ToolResult) -> ToolError:
    error = result.error
    kind, message = (error.type, error.message) if error is not None else (ErrorType.INTERNAL_ERROR, "the call failed")
    return ToolError(kind, message, result)


def _quietly(callback: Callable[[Any], None], value: Any) -> None:
    """A program's callback: what it raises is its own business, never the session's (it is called
    from the box's reader and the transcript, mid-call)."""
    try:
        callback(value)
    except Exception:  # noqa: BLE001 - see above
        pass


def _close_quietly(opened: OpenSession) -> None:
    try:
        opened.finish("closed", "the program ended without closing the sandbox")
        opened.close()
    except Exception:  # noqa: BLE001 - at interpreter exit: nothing to tell
        pass


_HELD = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C, and a front-end's SIGTERM (cli.common.terminate_as_interrupt)


def _hold_interrupts() -> Any:
    """While the box is removed and the workspace swept, neither Ctrl-C nor SIGTERM cuts it short."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        return [(sig, signal.signal(sig, signal.SIG_IGN)) for sig in _HELD]
    except ValueError:
        return None


def _release_interrupts(previous: Any) -> None:
    for sig, handler in previous or []:
        signal.signal(sig, handler)


__all__ = ["Sandbox"]
