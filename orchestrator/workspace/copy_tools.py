"""`changes` and `apply_changes`, copy mode's two host-side tools (issue 34): the session's registry
gets them (CopyTools, a HostTools), so each goes through the one CallPipeline: validated, decided by
the ladder, run, and recorded with who decided and who ran it. The MCP server (mcp/landing.py) and
the Python API (api/sandbox.py) install the same class; their words to a client are their own.

`changes` is a read of the session's own copy (a rule names it `tool = "changes"`, kind read);
`apply_changes` is the landing (tool apply_changes, kind edit, action land: decide_landing's key).
After an apply the session goes on with the same copy: the manifest's baseline of every entry that
landed is moved to what landed (an entry the box changed after the scan shows as changed again).

`issued`: when given, the ids of the calls the owner itself makes; any other call of these names
(a model's, in the API's run()) is an unknown tool, never a landing the model asked for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..boxfs import show
from ..boxfs.names import stored_shown
from ..errors import ErrorType, OpenAgentsError
from ..ground.text import visible
from ..protocol import Executor, ToolResult
from ..terminal.machine import Bounded, name_item, named
from ..tools.catalog import CHANGES_TOOL, LAND_TOOL
from ..tools.owner import CHANGES, LAND, ChangesArgs
from ..tools.registry import HostTools, OwnHostTools, PreparedCall
from .copy import CopyManifest
from .copy_session import land_copy
from .records import SessionRecord
from .review import list_changes, render_diff, shown
from .review.landing import LandingGate, Permit

if TYPE_CHECKING:
    from .review import ApplyReport, Change

COPY_TOOLS = (CHANGES_TOOL, LAND_TOOL)
MAX_DIFF_CHARS = 512 * 1024  # the diff put in one result; `oa-sandbox changes ID` shows it all
MAX_REPORT_LINES = 1000  # lines of apply's report in the text block; the metadata's lists name their files


def _lists(lists_dir: Path | None, kind: str) -> Bounded:
    return Bounded({}, lists_dir, f"mcp-{kind}-{time.time_ns()}")


def changes_meta(found: list[Change], lists_dir: Path | None) -> dict[str, Any]:
    """`changes`' metadata: each entry named exactly, at most 1,000 of them (the rest in a file)."""
    lists = _lists(lists_dir, "changes")
    lists.out["count"] = len(found)
    lists.put("changes", found, lambda c: named(c.path, status=c.status))
    return lists.value()


def apply_meta(report: ApplyReport, lists_dir: Path | None) -> dict[str, Any]:
    """`apply_changes`' metadata: names exact with `_shown` beside them, each list bounded."""
    lists = _lists(lists_dir, "apply")
    lists.put("applied", report.applied, name_item, stored_shown)
    lists.put("left_out", report.left_out, lambda lo: named(lo.path, reason=show(lo.reason)))
    lists.put("conflicts", report.conflicts, lambda c: named(c.path, reason=show(c.reason)))
    lists.put("already", report.already, name_item, stored_shown)
    return lists.value()


@dataclass
class Landing:
    """The copy-mode tools of one MCP session (one apply at a time)."""

    record: SessionRecord
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # What the last call found, typed, for an in-process owner (the API's Changes, ApplyResult):
    # the manifest and changes `changes` listed; the report `apply_changes` made.
    last_changes: "tuple[CopyManifest, list[Change]] | None" = field(default=None, repr=False)
    last_report: "ApplyReport | None" = field(default=None, repr=False)

    @property
    def manifest_path(self) -> Path:
        return self.record.manifest_path

    def changes(self, stat: bool = False) -> ToolResult:
        try:
            manifest = CopyManifest.load(self.manifest_path)
            found = list_changes(manifest)
            self.last_changes = (manifest, found)
            if not found:
                return ToolResult(
                    ok=True,
                    output="no changes: the private copy is as the real workspace",
                    meta={"changes": [], "count": 0},
                )
            text, cut = _joined(render_diff(manifest, found, stat=stat), MAX_DIFF_CHARS)
        except OpenAgentsError as err:
            return ToolResult.failure(err)
        except OSError as err:
            return ToolResult.failure(
                OpenAgentsError(ErrorType.IO_ERROR, f"the copy could not be compared: {err.strerror}")
            )
        note = (
            f"[diff cut at {MAX_DIFF_CHARS} characters: `oa-sandbox changes {self.record.id}` shows it all]"
            if cut
            else "[in the private copy only: apply_changes lands it]"
        )
        return ToolResult(ok=True, output=text, note=note, meta=changes_meta(found, self.record.dir / "lists"))

    def apply(self, gate: LandingGate) -> ToolResult:
        """`gate`: the decision on this landing (the call pipeline's, already made); a refusal writes nothing."""
        with self._lock:
            try:
                return self._apply(gate)
            except OpenAgentsError as err:
                return ToolResult.failure(err)
            except OSError as err:
                return ToolResult.failure(OpenAgentsError(ErrorType.IO_ERROR, f"apply stopped: {err.strerror}"))

    def _apply(self, gate: LandingGate) -> ToolResult:
        report = land_copy(self.record, gate)  # the one landing (copy_session.py): a conflict lands nothing
        self.last_report = report
        meta: dict[str, Any] = apply_meta(report, self.record.dir / "lists")
        lines = report.lines(MAX_REPORT_LINES)
        real = visible(self.record.workspace)
        if report.conflicts:
            lines.append(f"nothing applied: {len(report.conflicts)} path(s) changed in {real} since the copy was taken")
            return ToolResult.failure(
                OpenAgentsError(
                    ErrorType.STALE_CONTENT,
                    f"nothing applied: {len(report.conflicts)} conflict(s) with the real workspace: "
                    + "; ".join(f"{shown(c.path)}: {visible(c.reason)}" for c in report.conflicts[:20]),
                ),
                output="\n".join(lines),
                meta=meta,
            )
        summary = f"applied {len(report.applied)} change(s) to {real}"
        if report.left_out:
            summary += f", left out {len(report.left_out)}"
        if not report.applied and not report.left_out:
            summary = f"nothing to apply: the private copy has no changes for {real}"
        return ToolResult(ok=True, output="\n".join([*lines, summary]), meta=meta)


@dataclass(frozen=True)
class _Decided:
    """The pipeline's allowing decision, as the permit land_copy takes: invoke() is reached only
    after CallPipeline.validate_and_decide allowed the call (the same ladder key as decide_landing)."""

    allowed: bool = True
    reason: str = "allowed by the call pipeline's decision"
    executor: Executor = Executor.OPENAGENTS


class _DecidedGate:
    """The landing gate of a call the pipeline already decided: its decision, whatever is asked."""

    def decide_landing(self, requested: str | None = None) -> Permit:
        return _Decided()


class CopyTools(OwnHostTools):
    """`changes` and `apply_changes` as host-side tools of the session's registry (tools/registry.py
    OwnHostTools), so the CallPipeline validates, decides, runs and records them as any other call;
    `inner`: the host tools the session already had (the user's MCP servers), kept as they were."""

    DECLARED = (CHANGES, LAND)

    def __init__(self, landing: Landing, inner: HostTools | None = None, issued: set[str] | None = None) -> None:
        super().__init__(inner, issued)
        self.landing = landing

    def invoke_own(self, prepared: PreparedCall) -> ToolResult:
        if isinstance(prepared.args, ChangesArgs):
            result = self.landing.changes(prepared.args.stat)
        else:
            result = self.landing.apply(_DecidedGate())
        return result.model_copy(update={"executor": Executor.OPENAGENTS})  # run on the host, by us


def _joined(lines: Iterable[str], limit: int) -> tuple[str, bool]:
    out: list[str] = []
    size = 0
    for line in lines:
        size += len(line) + 1
        if size > limit:
            return "\n".join(out), True
        out.append(line)
    return "\n".join(out), False
