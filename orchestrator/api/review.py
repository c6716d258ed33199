"""A sandbox's own review and history: copy mode's changes, apply and discard, the session's report,
its checkpoints and rollback, and fork once it closed. `changes`, `apply` and `rollback` are the
program's own calls of host tools through the session's pipeline (the ladder decides each, the
transcript records each); the others act on the session's state on the host."""

from __future__ import annotations

import threading
import uuid
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import events as ev
from ..errors import ErrorType, OpenAgentsError
from ..models.base import ToolCall
from ..protocol import Executor, ToolResult
from ..sandbox.docker import box_on_copy
from ..tools.catalog import CHANGES_TOOL, LAND_TOOL, ROLLBACK_TOOL
from ..workspace.copy_session import discard_session
from .results import ApplyResult, ChangedFile, Changes
from .tool_calls import tool_error

if TYPE_CHECKING:
    from ..session import OpenSession
    from ..workspace.checkpoints import Checkpoint, RestoreReport
    from ..workspace.copy_tools import Landing
    from ..workspace.records import SessionRecord
    from .own_calls import OwnCalls


class ReviewMethods:
    """The class using it provides the session (`_live`, `record`, `close`, `closed`) and the parts
    its open made: `_landing` (copy mode), `_own_calls`, `_issued`, `_review`."""

    kind: str
    _landing: Landing | None
    _own_calls: OwnCalls | None
    _issued: set[str]
    _asked: set[str]
    _review: threading.Lock
    _status: tuple[str, str]
    _record: SessionRecord | None
    _closed: bool

    def _live(self) -> OpenSession:
        raise NotImplementedError

    def _active(self) -> Any:
        raise NotImplementedError

    @property
    def record(self) -> SessionRecord:
        raise NotImplementedError

    def close(self, *, status: str | None = None, reason: str = "") -> list[str]:
        raise NotImplementedError

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
            raise tool_error(result)
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
            raise tool_error(result)
        applied = ApplyResult.of(report)
        opened.transcript.emit(
            ev.ChangesApplied(
                executor=Executor.OPENAGENTS,
                via=self.kind,
                ok=applied.ok,
                applied=len(applied.applied),
                left_out=applied.left_out[:200],
                conflicts=applied.conflicts[:200],
            )
        )
        return applied

    def _own_call(self, tool: str, arguments: dict[str, Any]) -> ToolResult:
        """This program's own call of a host tool only it may call (changes, apply_changes)."""
        opened = self._live()
        call = ToolCall(id=f"api_{uuid.uuid4().hex[:12]}", name=tool, arguments=arguments)
        self._issued.add(call.id)
        self._asked.add(call.id)
        try:
            with self._active():
                return opened.pipeline.run(call)
        finally:
            self._issued.discard(call.id)
            self._asked.discard(call.id)

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
            raise OpenAgentsError(
                ErrorType.INVALID_ARGUMENTS,
                f"session {record.id} runs in bind mode: its changes are already in "
                f"{record.workspace}; nothing to {action}",
            )
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
        opened = self._live()
        store = opened.checkpoints
        valid = isinstance(turn, int) and not isinstance(turn, bool)  # else the pipeline's validation says so
        if valid and (store is None or not any(point.turn == turn and point.ok for point in store.list())):
            raise OpenAgentsError(
                ErrorType.INVALID_ARGUMENTS, f"session {opened.record.id} has no checkpoint of turn {turn} to restore"
            )
        own = self._own_calls
        assert own is not None
        with self._review:
            own.last_report = None
            result = self._own_call(ROLLBACK_TOOL, {"turn": turn})
            report = own.last_report
        if report is None:  # refused, or stopped before a restore
            raise tool_error(result)
        return report

    def fork(self, n: int = 1, *, turn: int | None = None) -> list[str]:
        """After close: this copy session forked into `n` independent copy sessions (`oa-sandbox fork`'s:
        each its own copy, record and manifest; `oa-sandbox changes/apply/discard ID` work on each);
        their ids. `turn`: the state after that checkpoint instead of the latest. Typed errors: still
        open, bind mode, discarded, `n` out of 1..MAX_FORKS."""
        if not self._closed or self._record is None:
            raise OpenAgentsError(
                ErrorType.INVALID_ARGUMENTS, "a sandbox is forked once it is closed (its session has ended)"
            )
        from ..workspace.fork import fork_session

        return [record.id for record in fork_session(self._record.id, n, turn, box_on_copy=box_on_copy)]
