"""Who answers the ladder's questions in an editor: session/request_permission, and the words our
tools' kinds are announced with (ACP's own kinds; anything else is "other")."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol, TypeGuard, get_args

from pydantic import BaseModel, ValidationError

from ..errors import OpenAgentsError
from ..policy.approvals import Answer, ApprovalRequest
from ..policy.approvals import PermissionOption as WireOption
from ..protocol import Executor
from ..tools import catalog
from . import models as m

PERMISSION_OPTIONS = [
    m.PermissionOption(optionId="allow_once", name="Allow once", kind="allow_once"),
    m.PermissionOption(optionId="reject_once", name="Reject", kind="reject_once"),
]
# Only for a refused egress request (ApprovalGate.widen_egress): the gate's rule widened for this session.
EGRESS_OPTIONS = [
    m.PermissionOption(optionId="allow_once", name="Allow once", kind="allow_once"),
    m.PermissionOption(optionId="allow_session", name="Allow for this session", kind="allow_always"),
    m.PermissionOption(optionId="reject_once", name="Reject", kind="reject_once"),
]


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.data = data


class Requester(Protocol):
    """The server's side of a request to the editor (AcpServer.request)."""

    def request(self, method: str, params: BaseModel, session_id: str) -> Future[Any]: ...


class AcpApprover:
    """Asks the editor with session/request_permission; only allow_once and reject_once exist, but
    for a refused egress request, which may also be allowed for the session (allow_session)."""

    asks_egress = True

    def __init__(self, server: Requester, session_id: str) -> None:
        self.server = server
        self.session_id = session_id

    def ask(self, request: ApprovalRequest) -> Answer:
        params = m.RequestPermissionParams(
            sessionId=self.session_id,
            toolCall=m.PermissionToolCall(
                toolCallId=request.call_id,
                title=request.title,
                kind=acp_kind(request.kind),
                status="pending",
                rawInput=request.arguments,
            ),
            options=EGRESS_OPTIONS if request.kind == "egress" else PERMISSION_OPTIONS,
        )
        future = self.server.request("session/request_permission", params, self.session_id)
        try:
            raw = future.result()
            result = m.RequestPermissionResult.model_validate(raw)
        except (ValidationError, RpcError, OpenAgentsError) as err:
            return Answer(
                option=WireOption.REJECT_ONCE,
                executor=Executor.OPENAGENTS,
                reason=f"no valid answer from the editor: {err}",
            )
        if isinstance(result.outcome, m.SelectedOutcome) and result.outcome.optionId == "allow_once":
            return Answer(option=WireOption.ALLOW_ONCE, reason="allowed in the editor")
        if (
            isinstance(result.outcome, m.SelectedOutcome)
            and result.outcome.optionId == "allow_session"
            and request.kind == "egress"
        ):
            return Answer(
                option=WireOption.ALLOW_ONCE, remember_for_session=True, reason="allowed in the editor for this session"
            )
        if isinstance(result.outcome, m.CancelledOutcome):
            return Answer(option=WireOption.REJECT_ONCE, reason="the prompt was cancelled")
        return Answer(option=WireOption.REJECT_ONCE, reason="rejected in the editor")


_TOOL_KINDS = frozenset(get_args(m.ToolKind))


def _is_tool_kind(kind: str) -> TypeGuard[m.ToolKind]:
    return kind in _TOOL_KINDS


def acp_kind(kind: str) -> m.ToolKind:
    """Our tool's kind as ACP's: the kinds are ACP's own words; anything else is "other"."""
    return kind if _is_tool_kind(kind) else "other"


def announced_kind(tool: str, arguments: Any) -> m.ToolKind:
    """The kind a call is announced with, before it is validated: the tool's, except that a
    multi-action tool's reading actions (git status, diff, log: its ToolDef's table) are `read`. A
    mutating one keeps the tool's kind until its permission request names the judged one."""
    return acp_kind(catalog.announced_kind(tool, arguments))
