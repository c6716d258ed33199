"""What a front-end that drives a protocol or a loop of its own needs from an open sandbox (the
CLI's `run`, ACP, MCP, batch, best-of-N attempts), as public methods of `Sandbox`: drive the
model's turn loop in the caller's thread and cancel it, split a call's decision from its run (an
MCP client answers a question between the two), record a front-end's own event, decide a landing.
Each goes through the session's one pipeline, gate and transcript; none hands out the parts."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .. import events as ev
from ..errors import ErrorType, OpenAgentsError
from ..models.base import ToolCall
from ..protocol import ToolResult
from ..tools.catalog import LAND_ACTION, LAND_TOOL

if TYPE_CHECKING:
    from ..config import SandboxLimits
    from ..loop import SessionResult
    from ..policy.approvals import ApprovalGate, ApprovalOutcome
    from ..policy.value import SessionPolicy
    from ..session import OpenSession
    from ..tools.registry import PreparedCall
    from ..transcript.resume import Rebuilt


class DrivingMethods:
    """The class using it provides `_live()` (the open session, or SANDBOX_CLOSED), `_count_call`
    (a call's bookkeeping: turn, copy record, checkpoint) and `_gate` (kept after close)."""

    _gate: ApprovalGate | None
    _turn: int

    def _live(self) -> OpenSession:
        raise NotImplementedError

    def _count_call(self, tool: str, ok: bool) -> None:
        raise NotImplementedError

    # -- the model's turn loop ---------------------------------------------------------------
    def run_turns(self, task: str, *, again: bool = False) -> SessionResult:
        """The model's turn loop on `task`, in the calling thread, to its end (`run()` does the same
        in a thread of its own, for a program). `again`: a cancel of the previous task is forgotten
        (an editor's next prompt); otherwise a cancel() that came first ends this run at once.
        Needs a sandbox opened with a model (SandboxOptions.model)."""
        opened = self._live()
        loop = getattr(opened, "turn_loop", None)
        if loop is None:
            raise OpenAgentsError(
                ErrorType.INVALID_ARGUMENTS, "run_turns: the sandbox was opened without a model (options.model)"
            )
        if again:
            opened.pipeline.cancel.clear()
        loop.turn = max(loop.turn, self._turn)  # turns count on across the session's calls and tasks
        result: SessionResult = loop.run(task)
        self._turn = max(self._turn, result.last_turn)
        return result

    def cancel(self) -> None:
        """End the task in progress (run_turns, or a run()) at its next step, and every call not yet
        started; what runs goes on until kill_running(). Closed already: nothing to do."""
        try:
            opened = self._live()
        except OpenAgentsError:
            return
        opened.pipeline.cancel.set()

    # -- a call decided, then run --------------------------------------------------------------
    def decide(self, tool: str, arguments: dict[str, Any], call_id: str | None = None) -> PreparedCall | ToolResult:
        """A call validated and decided (hooks, the ladder, the approver) but not run: the prepared
        call to give execute(), or the refusal (recorded, typed). A front-end that answers its
        client between the two (MCP's elicitation) uses this pair; anyone else uses call()."""
        opened = self._live()
        call = ToolCall(id=call_id or f"call_{uuid.uuid4().hex[:12]}", name=tool, arguments=arguments)
        return opened.pipeline.validate_and_decide(call)

    def execute(
        self, prepared: PreparedCall, on_output: Callable[[str], None] | None = None, *, counted: bool = True
    ) -> ToolResult:
        """Run a call decide() allowed and record its result. `counted`: a turn of the session, as
        each of call()'s (the turn counted, a copy session's record told, a checkpoint after a call
        that may have changed files); a front-end's own reads and copy mode's review calls are not."""
        opened = self._live()
        result = opened.pipeline.execute(prepared, on_output)
        if counted:
            self._count_call(prepared.call.name, result.ok)
        return result

    # -- the session's own record --------------------------------------------------------------
    def emit(self, event: ev.Event) -> None:
        """Record a front-end's own event in the session's transcript (a landing's outcome, the
        editor's MCP servers started): its watchers see it as they see the session's."""
        self._live().transcript.emit(event)

    def decide_landing(self, requested: str | None = None) -> ApprovalOutcome:
        """The ladder's decision on landing this session's copy in the workspace (the policy's rules
        and workspace_access): `requested` names the user's own request that asked for it (a
        command, a flag), which answers a rule that asks. While the session is open the decision is
        recorded in its transcript, as a call's is; after close (a `run --apply`) it is not."""
        if self._gate is None:
            raise OpenAgentsError(ErrorType.SANDBOX_CLOSED, "the sandbox was never opened: it has no policy yet")
        outcome = self._gate.decide_landing(requested)
        try:
            transcript = self._live().transcript
        except OpenAgentsError:
            return outcome
        transcript.emit(
            ev.ApprovalDecided(
                executor=outcome.executor,
                call_id=LAND_ACTION,
                tool=LAND_TOOL,
                action=LAND_ACTION,
                level=outcome.level.value,
                decision=outcome.decision,
                reason=outcome.reason,
            )
        )
        return outcome

    # -- what it runs on -----------------------------------------------------------------------
    @property
    def box_config(self) -> SandboxLimits:
        """The box's configuration as it was started (the policy's effects on it included)."""
        return self._live().box.config

    @property
    def box_workspace(self) -> Path:
        """The directory the box works on: the workspace in bind mode, its copy in copy mode."""
        return Path(self._live().record.box_workspace)

    @property
    def policy(self) -> SessionPolicy:
        """The session's policy, as resolved once at its open (policy/value.py): its workspace access
        level, approval rules, egress and hooks. Read-only: every effect was derived from it then."""
        return self._live().policy

    @property
    def resumed(self) -> Rebuilt | None:
        """A resumed session's conversation as read back from its transcript (None for a new one)."""
        return self._live().rebuilt
