"""The program's own host-side calls (issue 34): `Sandbox.rollback()` as a call of the session's one
CallPipeline, as `changes` and `apply_changes` are (workspace/copy_tools.py), so the user's BeforeTool
hooks see it, the ladder decides it (a rule `tool = "rollback"`, or any rule on `kind = "edit"`),
and the transcript records its decision, who decided and its outcome.

Only the program's own calls reach it (`issued`: their ids); a model's call of `rollback` in run()
is an unknown tool. A question the ladder asks about it is answered by the call itself (the program
asked for this rollback, as `oa-sandbox rollback` is the user's own command); a deny, or a hook's
block, refuses it before anything is touched.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import ErrorType, OpenAgentsError
from ..models.base import ToolCall
from ..policy.approvals import Answer, ApprovalRequest, Approver, PermissionOption
from ..protocol import Executor, ToolResult
from ..tools.catalog import ROLLBACK_ACTION, ROLLBACK_KIND, ROLLBACK_TOOL
from ..tools.registry import HostTools, PreparedCall
from ..tools.tooldef import Approval, ToolDef

if TYPE_CHECKING:
    from ..workspace.checkpoints import CheckpointStore, RestoreReport


class RollbackArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    turn: int


ROLLBACK_DEF = ToolDef(ROLLBACK_TOOL, ROLLBACK_KIND, "host", RollbackArgs, title="Roll the workspace back to a checkpoint",
                       approval=Approval(describe=lambda args: f"roll the workspace back to its state after turn {args.get('turn')}"))


class OwnCallApprover:
    """The session's approver, but for the program's own rollback: the ladder's question about it is
    answered by the call itself (decision allow_once, by the user: the program asked)."""

    def __init__(self, inner: Approver, own: set[str]) -> None:
        self.inner, self.own = inner, own
        # what the gate asks of an approver (policy.approvals): the inner one's answers
        self.asks_egress = getattr(inner, "asks_egress", False) is True
        self.shows_diff = getattr(inner, "shows_diff", False) is True

    def ask(self, request: ApprovalRequest) -> Answer:
        if request.tool == ROLLBACK_TOOL and request.call_id in self.own:
            return Answer(option=PermissionOption.ALLOW_ONCE, executor=Executor.USER,
                          reason="asked for by the program's own call (Sandbox.rollback())")
        return self.inner.ask(request)


class OwnCalls:
    """`rollback` as a host tool of the session's registry (tools/registry.py HostTools), in front
    of the host tools the session had (`inner`: copy mode's, the user's MCP servers), kept as they
    were. Its name is never offered to a model (names() and declarations() are the inner ones')."""

    def __init__(self, checkpoints: Callable[[], CheckpointStore | None], kill_running: Callable[[], None], issued: set[str],
                 inner: HostTools | None = None) -> None:
        self.checkpoints, self.kill, self.issued, self.inner = checkpoints, kill_running, issued, inner
        self.last_report: RestoreReport | None = None  # the typed report of the last rollback, for the owner

    def names(self) -> list[str]:
        return self.inner.names() if self.inner is not None else []

    def owns(self, name: str) -> bool:
        return name == ROLLBACK_TOOL or (self.inner is not None and self.inner.owns(name))

    def declarations(self, family: str) -> list[dict[str, Any]]:
        return self.inner.declarations(family) if self.inner is not None else []

    def kill_running(self) -> None:
        stop = getattr(self.inner, "kill_running", None)
        if callable(stop):
            stop()

    def prepare(self, call: ToolCall) -> PreparedCall:
        if call.name != ROLLBACK_TOOL:
            assert self.inner is not None
            return self.inner.prepare(call)
        if call.id not in self.issued:  # a model's call (run()): the rollback is the program's, never the model's
            raise OpenAgentsError(ErrorType.UNKNOWN_TOOL, f"unknown tool {call.name!r}: {call.name} is the program's, not a tool of the model")
        try:
            args = RollbackArgs.model_validate(call.arguments if isinstance(call.arguments, dict) else None)
        except ValidationError:
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, "rollback takes one argument, turn (an int)") from None
        return PreparedCall(call, ROLLBACK_DEF, args, ROLLBACK_KIND, ROLLBACK_ACTION)

    def invoke(self, prepared: PreparedCall) -> ToolResult:
        if prepared.spec.name != ROLLBACK_TOOL:
            assert self.inner is not None
            return self.inner.invoke(prepared)
        assert isinstance(prepared.args, RollbackArgs)
        turn = prepared.args.turn
        store = self.checkpoints()
        if store is None or not any(point.turn == turn and point.ok for point in store.list()):  # a hook may have changed the turn
            return ToolResult.failure(OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"there is no checkpoint of turn {turn} to restore"),
                                      executor=Executor.OPENAGENTS)
        self.kill()  # nothing in the box writes while the workspace is put back
        try:
            report = store.restore(turn)
        except OpenAgentsError as err:
            return ToolResult.failure(err, executor=Executor.OPENAGENTS)
        self.last_report = report
        if report.conflicts:
            return ToolResult.failure(OpenAgentsError(
                ErrorType.STALE_CONTENT, f"nothing restored: {len(report.conflicts)} file(s) changed since the last checkpoint"),
                executor=Executor.OPENAGENTS)
        return ToolResult(ok=True, output=f"restored turn {turn}: {len(report.restored)} restored, {len(report.removed)} removed",
                          executor=Executor.OPENAGENTS)
