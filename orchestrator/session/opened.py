"""An open session's parts (OpenSession): the box, transcript, record, checkpoints, the call pipeline
and, with a model, the turn loop; checkpoints after a call that may have changed files; its close.
Made by open_session (assemble.py); driven through the public API's Sandbox only."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from .. import events as ev
from ..hooks import wiring as hook_wiring
from ..pipeline import CallPipeline
from ..policy.value import SessionPolicy
from ..protocol import Executor
from ..sandbox.base import Box
from ..tools import catalog
from ..transcript import Transcript
from ..transcript.resume import Rebuilt
from ..workspace.context_files import ContextFiles
from ..workspace.records import ResumeLock, SessionRecord

if TYPE_CHECKING:
    from ..loop import TurnLoop
    from ..workspace.checkpoints import Checkpoint, CheckpointStore  # pygit2: imported where a store is made


MUTATING_TOOLS = catalog.mutating()  # the tools that may change workspace files (their ToolDef says)


@dataclass
class OpenSession:
    box: Box
    transcript: Transcript
    record: SessionRecord
    checkpoints: "CheckpointStore | None" = None
    lock: ResumeLock | None = None  # a resumed session's: released when it closes
    # Every call's steps (validate, decide, execute, record), made last with the registry.
    pipeline: CallPipeline = field(init=False)
    # The turn loop over the pipeline, when the session has a model; its after_turn is checkpoint().
    turn_loop: TurnLoop = field(init=False)
    rebuilt: Rebuilt | None = field(init=False, default=None)  # a resumed session's conversation, as read back
    policy: SessionPolicy = field(init=False, default_factory=SessionPolicy)  # resolved once, at the start
    # The root's AGENTS.md (context_files.py), read before the box existed: a turn loop made later gets it too.
    context: ContextFiles | None = field(init=False, default=None)
    root_context: str = field(init=False, default="")
    hook_context: str = field(init=False, default="")  # what SessionStart hooks added, for the model's system prompt
    _ended: bool = field(init=False, default=False)

    def kill_running(self) -> None:
        self.box.kill_processes()

    def checkpoint(self, turn: int, tools: list[str]) -> None:
        """After a turn that may have changed files. A failure is recorded, never fatal."""
        if self.checkpoints is None or (turn and not MUTATING_TOOLS & set(tools)):
            return
        if turn and self.checkpoints.record_later(turn, partial(self._recorded, turn)):
            return  # copy mode while turn 0 is still read: recorded right after it, on its thread
        try:
            point = self.checkpoints.record(turn)
        except Exception as err:  # noqa: BLE001 - a checkpoint must never end the session
            self._recorded(turn, None, err)
            return
        self._recorded(turn, point, None)

    def _recorded(self, turn: int, point: Checkpoint | None, err: Exception | None) -> None:
        """The transcript's event for one record (`err`: it raised)."""
        if err is not None:
            self.transcript.emit(
                ev.CheckpointRecorded(executor=Executor.OPENAGENTS, turn=turn, ok=False, error=str(err)[:500])
            )
            return
        if point is not None and not point.ok:  # failed or over the store's budget: changes unknown, never "none"
            self.transcript.emit(
                ev.CheckpointRecorded(
                    executor=Executor.OPENAGENTS,
                    turn=turn,
                    ok=False,
                    state=point.state,
                    error_type=point.error_type,
                    error=point.error[:500],
                )
            )
        elif point is not None:
            self.transcript.emit(
                ev.CheckpointRecorded(
                    executor=Executor.OPENAGENTS,
                    turn=turn,
                    ok=True,
                    files_changed=point.files_changed[:200],
                    skipped=[s.model_dump() for s in point.skipped[:200]],
                )
            )

    def finish(self, status: str, reason: str) -> None:
        self.record.status, self.record.reason = status, reason

    def close(self) -> list[str]:
        """Removes the sandbox, which sweeps the workspace; records what changed; returns what the
        sweeps found, one line each, for the end of the run (the transcript has them as events).
        A first checkpoint still being recorded is cancelled (in bind mode no call that could change
        files ran: each waits for it; in copy mode the real workspace stays the baseline `apply`
        compares with) and recorded as failed, so the session never claims to know its changes."""
        if self.checkpoints is not None and self.checkpoints.recording:
            self.checkpoints.cancel()
            self.checkpoints.wait()
        if (
            not self._ended and getattr(self, "pipeline", None) is not None
        ):  # SessionEnd: once, also after Ctrl-C or a fatal error
            self._ended = True
            try:
                hook_wiring.session_end(self.pipeline.hooks, self.record.status, self.record.reason)
            except KeyboardInterrupt:  # a second Ctrl-C cuts the hooks short (killed), never the box's removal
                pass
        try:
            self.box.close()
        finally:
            self.transcript.close()
            if self.checkpoints is not None:
                try:
                    changed = {f for point in self.checkpoints.list() for f in point.files_changed}
                    self.record.files_changed = sorted(changed)
                except Exception:  # noqa: BLE001 - the record is still saved
                    pass
                self.checkpoints.close()
            if self.record.status == "running":
                self.record.status = "closed"  # an editor's session, or one that ended without a result
            if getattr(self, "turn_loop", None) is not None and self.turn_loop.turn:
                self.record.turns = self.turn_loop.turn  # turns count on across runs: `rollback --turn` up to here
            self.record.save()
            if self.lock is not None:
                self.lock.release()
        return [line for report in self.box.sweeper.reports for line in report.lines()]


def first_checkpoint(opened: OpenSession, previous_turns: int | None) -> None:
    """The session's first record, on the store's background thread: turn 0 of a new session, or
    the state a resumed one finds. Its failure is recorded (checkpoint()), never raised."""
    try:
        if previous_turns is None:
            opened.checkpoint(0, [])  # the start, before the box changed anything
        else:
            resume_checkpoint(opened, previous_turns)
    except Exception:  # noqa: BLE001 - the transcript was closed under it: the store's index has the record
        pass


def resume_checkpoint(opened: OpenSession, previous_turns: int) -> None:
    """The workspace as the resumed run finds it, as the state after the previous last turn, when
    no checkpoint is at or after that turn (one that is there already holds it; what changed since,
    the user's edits between the runs, joins the next turn's). Unchanged: nothing is recorded."""
    store = opened.checkpoints
    if store is None or any(point.turn >= previous_turns for point in store.list()):
        return
    try:
        point = store.record(previous_turns)
    except Exception as err:  # noqa: BLE001 - as checkpoint(): never the end of the session
        opened.transcript.emit(
            ev.CheckpointRecorded(executor=Executor.OPENAGENTS, turn=previous_turns, ok=False, error=str(err)[:500])
        )
        return
    if point is not None:
        opened.transcript.emit(
            ev.CheckpointRecorded(
                executor=Executor.OPENAGENTS,
                turn=point.turn,
                ok=point.ok,
                state=None if point.ok else point.state,
                error_type=point.error_type,
                error=point.error[:500] or None,
                files_changed=point.files_changed[:200] if point.ok else None,
            )
        )
