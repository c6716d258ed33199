"""The caller's sessions by id, from Python, without opening a box (issue 46): list them (by label),
read one's record, see, apply or discard a copy session's changes, list its checkpoints and roll
it back, write its report, fork it, prune old ones. `oa-sandbox sessions`, `changes`, `apply`,
`discard`, `checkpoints`, `rollback`, `report`, `fork` and `sessions prune` are these, printed.

    from orchestrator import sessions
    for record in sessions.list_sessions(labels={"task": "fix-42"}):
        print(record.id, record.status, sessions.changes(record.id).stat)

Each acts on host-kept state of an ended session (never one still running), as the user's own
command: so none is a pipeline call and none appends to the ended session's transcript (it ends
at its session_end); `apply` meets the ladder's landing decision (a deny still refuses it) and its
outcome goes to the record. Only the caller's own sessions: another user's is refused
(PERMISSION_DENIED, naming its owner). To go on working in one, open it again: `Sandbox(resume=ID)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from ..errors import ErrorType, OpenAgentsError
from ..workspace import cleanup
from ..workspace import records as records_

if TYPE_CHECKING:
    from ..policy.approvals import ApprovalGate
    from ..workspace.checkpoints import Checkpoint, RestoreReport
    from ..workspace.copy_session import WriteThrough
    from ..workspace.records import SessionRecord
    from ..workspace.review import ApplyReport
    from ..workspace.review.landing import LandingGate
    from .results import ApplyResult, Changes

DEFAULT_PRUNE_AGE_S = 7 * 86400  # `sessions prune`: ended sessions started longer ago than this
UNLANDED_KEEP_S = (
    30 * 86400
)  # and copy sessions never applied nor discarded, longer ago than this (their copy is their only work)


def list_sessions(labels: Mapping[str, str] | None = None, *, all_users: bool = False) -> list[SessionRecord]:
    """The caller's sessions, newest first (`oa-sandbox sessions`), those with every label in
    `labels` only. `all_users`: other users' records this state directory lets the caller read
    too, to list only (any action on one is refused)."""
    wanted = dict(labels or {})
    return [
        r for r in records_.list_sessions(all_users=all_users) if all(r.labels.get(k) == v for k, v in wanted.items())
    ]


def session(session_id: str) -> SessionRecord:
    """The caller's own record of a session (its status, mode, workspace, labels, files changed ...)."""
    return records_.open_own_record(session_id)


def changes(session_id: str) -> Changes:
    """What an ended copy session changed against the real workspace (`oa-sandbox changes ID`)."""
    from ..workspace.copy import CopyManifest
    from ..workspace.copy_session import ended_copy_session
    from ..workspace.review import list_changes, render_diff, shown
    from .results import ChangedFile, Changes

    record = ended_copy_session(session_id, "show")
    manifest = CopyManifest.load(record.manifest_path)
    found = list_changes(manifest)
    return Changes(
        files=[ChangedFile(path=shown(c.path), status=c.status) for c in found],
        diff="\n".join(render_diff(manifest, found)),
        stat="\n".join(render_diff(manifest, found, stat=True)),
    )


def landing_gate(record: SessionRecord) -> ApprovalGate:
    """The gate that decides landing an ended session's copy: its SessionPolicy (the policies in
    force for its workspace and the session's own policy files, as pinned at its start), with
    nobody to ask (a rule that asks is answered only by the request that asked for the landing)."""
    from ..policy.approvals import ApprovalGate, NonInteractiveApprover
    from ..policy.load import load_session_policy

    policy = load_session_policy(Path(record.workspace), list(record.policy_files), record)
    return ApprovalGate(policy.ladder(), NonInteractiveApprover())


def land(
    record: SessionRecord,
    requested: str | None = None,
    gate: LandingGate | None = None,
    write_through: WriteThrough | None = None,
) -> ApplyReport:
    """Land a copy session's changes: the one route every front-end takes (`oa-sandbox apply`, `run
    --apply`, `--attempts --apply`, ACP's end of a prompt turn; MCP's apply_changes and
    Sandbox.apply() reach it as the pipeline's `apply_changes` call). `gate` decides it (an open or
    just-closed Sandbox, whose decision is recorded; ACP's session gate; None: the ended session's
    own, landing_gate), `requested` answering a rule that asks; a refusal is its typed error with
    nothing written. Then the sanitiser lands it through boxfs; a conflict lands nothing. The report
    as the sanitiser gave it (workspace/copy_session.py land_copy)."""
    from ..workspace.copy_session import land_copy

    return land_copy(record, gate if gate is not None else landing_gate(record), requested, write_through)


def apply(session_id: str) -> ApplyResult:
    """`oa-sandbox apply ID`: an ended copy session's changes landed in the real workspace (any
    conflict: nothing applied, `ok` false). A landing the policy refuses raises REFUSED_BY_POLICY."""
    from ..workspace.copy_session import ended_copy_session
    from .results import ApplyResult

    record = ended_copy_session(session_id, "apply")
    return ApplyResult.of(land(record, f"the program's sessions.apply({record.id})"))


def discard(session_id: str) -> int:
    """`oa-sandbox discard ID`: an ended copy session's copy, checkpoints and transcript removed;
    its record stays, marked discarded. The bytes freed."""
    from ..workspace.copy_session import discard_session, ended_copy_session

    record = ended_copy_session(
        session_id, "discard", mount=False
    )  # a fork's overlay that cannot be mounted again is still discarded
    try:
        return discard_session(record)
    except OSError as err:
        raise OpenAgentsError(ErrorType.IO_ERROR, f"could not discard session {record.id}: {err}") from None


def checkpoints(session_id: str) -> list[Checkpoint]:
    """A session's checkpoints (`oa-sandbox checkpoints ID`): turn 0 is the start."""
    from ..workspace.checkpoints import CheckpointStore

    record = session(session_id)
    return CheckpointStore(record.checkpoint_store, Path(record.box_workspace)).list()


def rollback(session_id: str, turn: int) -> RestoreReport:
    """`oa-sandbox rollback ID --turn N`: an ended session's workspace (its copy, or the real one in
    bind mode) as it was after `turn` (a turn that changed nothing: the checkpoint before it). A file
    changed since the session's last checkpoint: nothing restored, the report lists the conflicts."""
    record = session(session_id)
    return restore_at(record, restorable_turn(record, turn))


def restorable_turn(record: SessionRecord, turn: int) -> int:
    """The checkpoint turn that holds the state after `turn` of an ended session (a turn that changed
    nothing has none of its own: the one before it holds); a typed refusal naming why there is none."""
    from ..workspace.checkpoints import CheckpointStore

    if not isinstance(turn, int) or isinstance(turn, bool) or turn < 0:
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"turn must be an int, 0 or more, not {turn!r}"[:200])
    if record.running():
        raise OpenAgentsError(
            ErrorType.INVALID_ARGUMENTS, f"session {record.id} is still running (pid {record.host_pid})"
        )
    if record.discarded:
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"session {record.id} was discarded: its copy is gone")
    points = CheckpointStore(record.checkpoint_store, Path(record.box_workspace)).list()
    turns = [p.turn for p in points if p.ok]
    last = record.turns if record.turns is not None else max((p.turn for p in points), default=0)
    if turn > last:
        said = (
            f"ran {last} turn{'s' if last != 1 else ''}"
            if record.turns is not None
            else f"has checkpoints up to turn {last}"
        )
        raise OpenAgentsError(
            ErrorType.INVALID_ARGUMENTS,
            f"session {record.id} {said}: there is no turn {turn} to restore (`oa-sandbox checkpoints {record.id}`)",
        )
    if turn in turns:
        return turn
    earlier = [t for t in turns if t <= turn]
    if not earlier:
        raise OpenAgentsError(
            ErrorType.INVALID_ARGUMENTS, f"session {record.id} has no checkpoint at or before turn {turn}"
        )
    return max(earlier)


def restore_at(record: SessionRecord, turn: int) -> RestoreReport:
    """Restore the checkpoint of `turn` (restorable_turn's) in the session's workspace."""
    from ..workspace.checkpoints import CheckpointStore

    return CheckpointStore(record.checkpoint_store, Path(record.box_workspace)).restore(turn)


def report(session_id: str, path: str | PathLike[str] | None = None) -> str:
    """The session's self-contained HTML page (`oa-sandbox report ID`), written atomically to `path`
    when given; the page either way."""
    from ..report import build, write

    record = session(session_id)
    page = build(record)
    if path is not None:
        try:
            write(record, Path(path), page=page)
        except OSError as err:
            raise OpenAgentsError(ErrorType.IO_ERROR, f"could not write the report: {err}") from None
    return page


def fork(session_id: str, n: int = 1, turn: int | None = None) -> list[str]:
    """`oa-sandbox fork ID -n N [--turn T]`: an ended copy session forked into `n` copy sessions,
    each its own copy, record and manifest (labels kept); their ids. Open one with `Sandbox(resume=ID)`."""
    from ..sandbox.docker import box_on_copy
    from ..workspace.fork import fork_session

    return [record.id for record in fork_session(session_id, n, turn, box_on_copy=box_on_copy)]


@dataclass(frozen=True)
class Pruned:
    """What `prune` removed (with the bytes each held) and what it kept, and why."""

    removed: list[tuple[SessionRecord, int]]
    kept: list[tuple[SessionRecord, str]]

    @property
    def freed(self) -> int:
        return sum(size for _, size in self.removed)


def prune(
    older_than_s: float = DEFAULT_PRUNE_AGE_S,
    unlanded_older_than_s: float = UNLANDED_KEEP_S,
    *,
    all_users: bool = False,
) -> Pruned:
    """Remove the whole state of the caller's ended sessions started longer ago than `older_than_s`
    (copy, checkpoints, transcript, record). Kept, and said why: sessions still running, and copy
    sessions neither applied nor discarded (their copy is all there is of their work) until they
    are older than `unlanded_older_than_s` as well (30 days by default; 0: with the rest)."""
    removed, kept = cleanup.prune(older_than_s, unlanded_older_than_s=unlanded_older_than_s, all_users=all_users)
    return Pruned(removed=removed, kept=kept)


__all__ = [
    "Pruned",
    "apply",
    "changes",
    "checkpoints",
    "discard",
    "fork",
    "land",
    "landing_gate",
    "list_sessions",
    "prune",
    "report",
    "restorable_turn",
    "restore_at",
    "rollback",
    "session",
]
