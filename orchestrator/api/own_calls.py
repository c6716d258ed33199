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

from typing import TYPE_CHECKING, Callable

from ..errors import ErrorType, OpenAgentsError
from ..policy.approvals import Answer, ApprovalRequest, Approver, PermissionOption
from ..protocol import Executor, ToolResult
from ..tools.catalog import ROLLBACK_TOOL
from ..tools.owner import ROLLBACK, RollbackArgs
from ..tools.registry import HostTools, OwnHostTools, PreparedCall

if TYPE_CHECKING:
    from ..workspace.checkpoints import CheckpointStore, RestoreReport


class OwnCallApprover:
    """The session's approver, but for the program's own calls: the ladder's question about its
    rollback is answered by the call itself (decision allow_once, by the user: the program asked),
    and so is the question about any of its calls in `program` (their ids, when given: the API's
    default, as `oa-sandbox exec` answers for the user's own call). A deny never reaches here."""

    def __init__(self, inner: Approver, own: set[str], program: set[str] | None = None) -> None:
        self.inner, self.own, self.program = inner, own, program
        # what the gate asks of an approver (policy.approvals): the inner one's answers
        self.asks_egress = getattr(inner, "asks_egress", False) is True
        self.shows_diff = getattr(inner, "shows_diff", False) is True

    def ask(self, request: ApprovalRequest) -> Answer:
        if request.tool == ROLLBACK_TOOL and request.call_id in self.own:
            return Answer(
                option=PermissionOption.ALLOW_ONCE,
                executor=Executor.USER,
                reason="asked for by the program's own call (Sandbox.rollback())",
            )
        if self.program is not None and request.call_id in self.program:
            return Answer(
                option=PermissionOption.ALLOW_ONCE,
                executor=Executor.USER,
                reason="the program's own call: it asked for it (as `oa-sandbox exec`); "
                'approve="ask" puts it to the approver',
            )
        return self.inner.ask(request)


class OwnCalls(OwnHostTools):
    """`rollback` as a host tool of the session's registry (tools/registry.py OwnHostTools), in front
    of the host tools the session had (`inner`: copy mode's, the user's MCP servers), kept as they
    were. Its name is never offered to a model (names() and declarations() are the inner ones')."""

    DECLARED = (ROLLBACK,)
    LISTED = False

    def __init__(
        self,
        checkpoints: Callable[[], CheckpointStore | None],
        kill_running: Callable[[], None],
        issued: set[str],
        inner: HostTools | None = None,
    ) -> None:
        super().__init__(inner, issued)
        self.checkpoints, self.kill = checkpoints, kill_running
        self.last_report: RestoreReport | None = None  # the typed report of the last rollback, for the owner

    def invoke_own(self, prepared: PreparedCall) -> ToolResult:
        assert isinstance(prepared.args, RollbackArgs)
        turn = prepared.args.turn
        store = self.checkpoints()
        if store is None or not any(
            point.turn == turn and point.ok for point in store.list()
        ):  # a hook may have changed the turn
            return ToolResult.failure(
                OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"there is no checkpoint of turn {turn} to restore"),
                executor=Executor.OPENAGENTS,
            )
        self.kill()  # nothing in the box writes while the workspace is put back
        try:
            report = store.restore(turn)
        except OpenAgentsError as err:
            return ToolResult.failure(err, executor=Executor.OPENAGENTS)
        self.last_report = report
        if report.conflicts:
            return ToolResult.failure(
                OpenAgentsError(
                    ErrorType.STALE_CONTENT,
                    f"nothing restored: {len(report.conflicts)} file(s) changed since the last checkpoint",
                ),
                executor=Executor.OPENAGENTS,
            )
        return ToolResult(
            ok=True,
            output=f"restored turn {turn}: {len(report.restored)} restored, {len(report.removed)} removed",
            executor=Executor.OPENAGENTS,
        )
