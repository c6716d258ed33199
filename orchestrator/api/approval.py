"""A program's approver: a callback asked the ladder's questions, as a person at the terminal is."""

from __future__ import annotations

from typing import Any, Callable

from ..policy.approvals import Answer, ApprovalRequest, PermissionOption
from ..protocol import Executor


class CallbackApprover:
    """`decide(request)` returns True (allow once), False (refuse) or an Answer. Anything else, or an
    exception, refuses the call with the reason: a broken approver never lets a call through."""

    def __init__(self, decide: Callable[[ApprovalRequest], Any]) -> None:
        self.decide = decide

    def ask(self, request: ApprovalRequest) -> Answer:
        try:
            said = self.decide(request)
        except Exception as err:  # noqa: BLE001 - a failing approver is a refusal
            return Answer(
                option=PermissionOption.REJECT_ONCE,
                executor=Executor.OPENAGENTS,
                reason=f"the approver raised {type(err).__name__}: {str(err)[:200]}",
            )
        if isinstance(said, Answer):
            return said
        if said is True:
            return Answer(option=PermissionOption.ALLOW_ONCE, reason="allowed by the program's approver")
        if said is False:
            return Answer(option=PermissionOption.REJECT_ONCE, reason="refused by the program's approver")
        return Answer(
            option=PermissionOption.REJECT_ONCE,
            executor=Executor.OPENAGENTS,
            reason=f"the approver answered {type(said).__name__}, not True, False or an Answer",
        )
