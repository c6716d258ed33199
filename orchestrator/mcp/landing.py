"""Copy mode over MCP: what the private copy holds, and landing it, without leaving the client.

In copy mode (a root-owned workspace under `auto`, or `--workspace-mode copy`) the six tools work
on the session's private copy; nothing reaches the real workspace until it is applied. The MCP
server then offers two more tools:

- `changes`: the unified diff of the copy against the real workspace (review.list_changes and
  review.render_diff, as `oa-sandbox changes`);
- `apply_changes`: review.apply_changes, the sanitiser `oa-sandbox apply` runs: regular files,
  directories, deletions and in-workspace symlinks are carried, everything else (FIFOs, devices,
  absolute links, .git entries, box-made hard links...) is left out and listed; a path the user
  changed in the real workspace since the copy was taken is a conflict, and one conflict means
  nothing is applied (an error result listing each conflict).

Both are calls like the six tools': `CopyTools` gives them to the session's registry as host-side
tools (the shape the user's MCP servers' tools and git have), so each goes through the one
CallPipeline: validated, decided by the ladder, run, and recorded in the transcript with who
decided and who ran it. `changes` is a read of the session's own copy (a rule names it `tool =
"changes"`, kind read: automatic by default); `apply_changes` is the landing, judged as every
front-end's landing is (tool apply_changes, kind edit, action land: the ladder's decide_landing
key): a deny rule, copy-only or read-only refuses it, typed (refused_by_policy), nothing written.

After an apply, the session goes on with the same copy. So that a later apply of a file edited
again is not taken for the user's change, the manifest's baseline of every entry that landed is
moved to what landed: the real entry as it is now, the copy's as the scan before the apply saw it
(an entry the box changed after that scan shows as changed again, never as landed).

In bind mode neither tool is listed: every change is already in the real workspace.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import ErrorType, OpenAgentsError
from ..models.base import ToolCall
from ..policy.ladder import CHANGES_ACTION, CHANGES_KIND, CHANGES_TOOL, LAND_ACTION, LAND_KIND, LAND_TOOL
from ..protocol import Executor, ToolResult
from ..terminal.render import visible
from ..tools.registry import HostTools, PreparedCall
from ..tools.tooldef import ToolDef
from ..workspace.copy import CopyManifest
from ..workspace.copy_session import mark_landed
from ..workspace.records import SessionRecord
from ..workspace.review import apply_scanned, list_changes, move_on, render_diff, shown
from ..workspace.review.landing import Permit
from .results import apply_meta, changes_meta

COPY_TOOLS = (CHANGES_TOOL, LAND_TOOL)
MAX_DIFF_CHARS = 512 * 1024  # the diff put in one result; `oa-sandbox changes ID` shows it all
MAX_REPORT_LINES = 1000  # lines of apply's report in the text block; the metadata's lists name their files

CHANGES_DESCRIPTION = ("Copy mode only: the unified diff of what the tools changed in this session's private copy, against the real "
                       "workspace. Nothing in it is in the real workspace until apply_changes lands it. stat=true: one line per file "
                       "with +/- counts.")
APPLY_DESCRIPTION = ("Copy mode only: land the private copy's changes in the real workspace, through the same sanitiser as "
                     "`oa-sandbox apply`: regular files, directories, deletions and symlinks inside the workspace are carried; "
                     "FIFOs, devices, absolute or escaping symlinks, .git entries and hard links made in the sandbox are left out "
                     "and listed. If any file changed in the real workspace since the copy was taken, nothing is applied and each "
                     "conflict is listed. The session goes on with the same copy afterwards.")


def in_copy_note(record: SessionRecord) -> str:
    """What a mutating result says in copy mode."""
    return (f"[copy mode: this change is in the session's private copy, not in {visible(record.workspace)}: "
            f"call apply_changes to land it (changes shows the diff), or after the session `oa-sandbox apply {record.id}`]")


def instructions(record: SessionRecord) -> str:
    base = ("Tools run in a hardened Docker sandbox over the workspace mounted at /workspace; paths are relative to it. "
            "No network unless the user opened egress. ")
    if record.mode.value == "copy":
        return base + (f"Workspace mode: copy. The tools work on a private copy of {visible(record.workspace)} kept in session "
                       f"{record.id}'s state; nothing they change reaches the real workspace until apply_changes lands it "
                       "(changes shows the diff first). apply_changes carries regular files, directories, deletions and in-workspace "
                       "symlinks, lists what it leaves out, and applies nothing when the user changed a file in the meantime.")
    return base + f"Workspace mode: bind. The tools change {visible(record.workspace)} directly; there is nothing to apply."


def bind_mode_refusal(name: str, record: SessionRecord) -> ToolResult:
    return ToolResult.failure(OpenAgentsError(
        ErrorType.UNKNOWN_TOOL, f"{name} exists only in copy mode: this session runs in bind mode, so every change is already in "
                                f"{visible(record.workspace)}; there is nothing to apply"))


@dataclass
class Landing:
    """The copy-mode tools of one MCP session (one apply at a time)."""

    record: SessionRecord
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def manifest_path(self) -> Path:
        return self.record.manifest_path

    def changes(self, stat: bool = False) -> ToolResult:
        try:
            manifest = CopyManifest.load(self.manifest_path)
            found = list_changes(manifest)
            if not found:
                return ToolResult(ok=True, output="no changes: the private copy is as the real workspace",
                                  meta={"changes": [], "count": 0})
            text, cut = _joined(render_diff(manifest, found, stat=stat), MAX_DIFF_CHARS)
        except OpenAgentsError as err:
            return ToolResult.failure(err)
        except OSError as err:
            return ToolResult.failure(OpenAgentsError(ErrorType.IO_ERROR, f"the copy could not be compared: {err.strerror}"))
        note = (f"[diff cut at {MAX_DIFF_CHARS} characters: `oa-sandbox changes {self.record.id}` shows it all]" if cut else
                "[in the private copy only: apply_changes lands it]")
        return ToolResult(ok=True, output=text, note=note, meta=changes_meta(found, self.record.dir / "lists"))

    def apply(self, permit: Permit) -> ToolResult:
        """`permit`: the ladder's decision on this landing (the call pipeline's); a refusal writes nothing."""
        with self._lock:
            try:
                return self._apply(permit)
            except OpenAgentsError as err:
                return ToolResult.failure(err)
            except OSError as err:
                return ToolResult.failure(OpenAgentsError(ErrorType.IO_ERROR, f"apply stopped: {err.strerror}"))

    def _apply(self, permit: Permit) -> ToolResult:
        manifest = CopyManifest.load(self.manifest_path)
        report, scanned = apply_scanned(manifest, permit)
        meta: dict[str, Any] = apply_meta(report, self.record.dir / "lists")
        lines = report.lines(MAX_REPORT_LINES)
        real = visible(self.record.workspace)
        if report.conflicts:
            mark_landed(self.record, False)
            lines.append(f"nothing applied: {len(report.conflicts)} path(s) changed in {real} since the copy was taken")
            return ToolResult.failure(OpenAgentsError(
                ErrorType.STALE_CONTENT, f"nothing applied: {len(report.conflicts)} conflict(s) with the real workspace: "
                + "; ".join(f"{shown(c.path)}: {visible(c.reason)}" for c in report.conflicts[:20])), output="\n".join(lines), meta=meta)
        move_on(manifest, scanned, report)
        manifest.save(self.manifest_path)
        mark_landed(self.record)
        summary = f"applied {len(report.applied)} change(s) to {real}"
        if report.left_out:
            summary += f", left out {len(report.left_out)}"
        if not report.applied and not report.left_out:
            summary = f"nothing to apply: the private copy has no changes for {real}"
        return ToolResult(ok=True, output="\n".join([*lines, summary]), meta=meta)


class ChangesArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    stat: bool = False


class ApplyArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


CHANGES_DEF = ToolDef(CHANGES_TOOL, CHANGES_KIND, "host", ChangesArgs, title="The private copy's changes",
                      title_of=lambda args: "show the private copy's changes against the real workspace")
APPLY_DEF = ToolDef(LAND_TOOL, LAND_KIND, "host", ApplyArgs, title="Land the private copy's changes",
                    title_of=lambda args: "land the private copy's changes in the real workspace")


@dataclass(frozen=True)
class _Decided:
    """The pipeline's allowing decision, as the Permit apply_scanned takes: invoke() is reached only
    after CallPipeline.validate_and_decide allowed the call (the same ladder key as decide_landing)."""

    allowed: bool = True
    reason: str = "allowed by the call pipeline's decision"
    executor: Executor = Executor.OPENAGENTS


class CopyTools:
    """`changes` and `apply_changes` as host-side tools of the session's registry (tools/registry.py
    HostTools), so the CallPipeline validates, decides, runs and records them as any other call;
    `inner`: the host tools the session already had (the user's MCP servers), kept as they were."""

    def __init__(self, landing: Landing, inner: HostTools | None = None) -> None:
        self.landing = landing
        self.inner = inner

    def names(self) -> list[str]:
        return list(COPY_TOOLS) + (self.inner.names() if self.inner is not None else [])

    def owns(self, name: str) -> bool:
        return name in COPY_TOOLS or (self.inner is not None and self.inner.owns(name))

    def declarations(self, family: str) -> list[dict[str, Any]]:
        return self.inner.declarations(family) if self.inner is not None else []  # no model is told of these two

    def kill_running(self) -> None:
        """Cancel reaches the inner host tools' calls as before (loop.py looks for this); the two here end on their own."""
        stop = getattr(self.inner, "kill_running", None)
        if callable(stop):
            stop()

    def prepare(self, call: ToolCall) -> PreparedCall:
        if call.name not in COPY_TOOLS:
            assert self.inner is not None
            return self.inner.prepare(call)
        spec = CHANGES_DEF if call.name == CHANGES_TOOL else APPLY_DEF
        assert spec.args is not None
        try:
            args = spec.args.model_validate(call.arguments if isinstance(call.arguments, dict) else None)
        except ValidationError:
            said = ("changes takes one optional argument, stat (a boolean)" if spec is CHANGES_DEF else
                    "apply_changes takes no arguments: it lands every change the copy holds")
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, said) from None
        if spec is CHANGES_DEF:
            return PreparedCall(call, spec, args, CHANGES_KIND, CHANGES_ACTION)
        return PreparedCall(call, spec, args, LAND_KIND, LAND_ACTION)

    def invoke(self, prepared: PreparedCall) -> ToolResult:
        if prepared.spec.name not in COPY_TOOLS:
            assert self.inner is not None
            return self.inner.invoke(prepared)
        if isinstance(prepared.args, ChangesArgs):
            result = self.landing.changes(prepared.args.stat)
        else:
            result = self.landing.apply(_Decided())
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
