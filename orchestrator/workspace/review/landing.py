"""Landing a copy's changes: every landing (`oa-sandbox apply`, `run --apply`, MCP's apply_changes,
ACP's end of every prompt turn) goes through `apply_scanned`, which takes the ladder's decision
(ApprovalGate.decide_landing: a deny rule, copy-only or read-only refuses it) and writes nothing
unless it allows the landing: the refusal is one typed error, the same on every front-end.

Landing a live copy more than once (MCP's apply_changes, ACP's end of every prompt turn):

The copy keeps changing after a landing, so the manifest must move on with it: otherwise the
user's landed file reads as the user's own later change (a false conflict) on the next landing.
"""

from __future__ import annotations

from typing import Protocol

from ...boxfs import from_store, lstat_workspace
from ...errors import ErrorType, OpenAgentsError
from ...protocol import Executor
from ..copy import CopyManifest, ManifestEntry, Stamp
from .apply import apply_changes
from .report import ApplyReport
from .scan import Change, list_changes


class Permit(Protocol):
    """The ladder's decision on a landing (policy.approvals.ApprovalOutcome)."""

    @property
    def allowed(self) -> bool: ...
    @property
    def reason(self) -> str: ...
    @property
    def executor(self) -> Executor: ...


class LandingGate(Protocol):
    """A session's ApprovalGate (policy.approvals): the one decision on every landing."""

    def decide_landing(self, requested: str | None = None) -> Permit: ...


def refusal(permit: Permit) -> OpenAgentsError:
    """The one error a refused landing gives, whichever front-end asked for it."""
    kind = ErrorType.REJECTED_BY_USER if permit.executor == Executor.USER else ErrorType.REFUSED_BY_POLICY
    return OpenAgentsError(
        kind, f"landing refused: {permit.reason}; nothing was applied (the changes stay in the session's copy)"
    )


def apply_scanned(manifest: CopyManifest, permit: Permit) -> tuple[ApplyReport, dict[str, Change]]:
    """apply_changes, with the copy's changes as scanned just before: what `move_on` needs; raises
    the typed refusal, writing nothing, unless `permit` (the ladder's decision) allows the landing."""
    if not permit.allowed:
        raise refusal(permit)
    scanned = {c.path: c for c in list_changes(manifest)}
    return apply_changes(manifest), scanned


def move_on(manifest: CopyManifest, scanned: dict[str, Change], report: ApplyReport) -> None:
    """After a landing without conflicts, each landed entry's stamps become the real file as it is
    now and the copy as it was scanned before the landing, so the next landing carries only what is
    new: the user's landed file is not taken for their own later change (a false conflict), and a
    change the box made during the landing is seen again. A landed deletion drops its subtree."""
    for rel in [*report.applied, *report.already]:
        change = scanned.get(rel)
        if change is None:
            continue  # made by the box during the landing: judged on its content next time
        if change.after is None:
            below = rel + "/"
            for key in [k for k in manifest.entries if k == rel or k.startswith(below)]:
                del manifest.entries[key]
            continue
        try:
            now = lstat_workspace(manifest.real, from_store(rel))
        except OpenAgentsError:
            now = None
        if now is not None:
            manifest.entries[rel] = ManifestEntry(Stamp.of(now), change.after)
