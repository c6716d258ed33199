"""Who answers the ladder's questions: a person at a terminal, an editor over ACP, or nobody (CI).

On any wire only `allow_once` and `reject_once` exist. Approving a kind for the whole session
(`a` at the terminal) is the client's own policy: it is remembered here, never sent anywhere.
"""
from __future__ import annotations

import json
import threading
from enum import Enum
from typing import Any, Protocol

import click
from pydantic import BaseModel

from ..protocol import Executor
from ..render import continued, visible
from ..tools.registry import PreparedCall, call_title
from .ladder import Ladder, Level


class PermissionOption(str, Enum):
    ALLOW_ONCE = "allow_once"
    REJECT_ONCE = "reject_once"


class ApprovalRequest(BaseModel):
    call_id: str
    tool: str
    kind: str
    action: str
    level: Level
    title: str
    arguments: dict[str, Any]


class Answer(BaseModel):
    option: PermissionOption
    remember_for_session: bool = False  # client-side only
    executor: Executor = Executor.USER
    reason: str = ""


class ApprovalOutcome(BaseModel):
    allowed: bool
    decision: str  # automatic | allow_once | reject_once | approved_for_session | refused
    level: Level
    executor: Executor
    reason: str


class Approver(Protocol):
    def ask(self, request: ApprovalRequest) -> Answer: ...


class NonInteractiveApprover:
    """CI: nobody is there to ask, so whatever would ask is refused (a policy file can allow it)."""

    def ask(self, request: ApprovalRequest) -> Answer:
        return Answer(
            option=PermissionOption.REJECT_ONCE, executor=Executor.OPENAGENTS,
            reason=f"non-interactive session: {request.action} needs approval ({request.level.value}); allow it in a policy file",
        )


class TerminalApprover:
    """y: allow once, n: reject once, a: approve this kind for the session (ask-once rungs only)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def ask(self, request: ApprovalRequest) -> Answer:
        choices = ["y", "n", "a"] if request.level == Level.ASK_ONCE else ["y", "n"]
        with self._lock:
            # The title and arguments are the model's: shown with every control character visible and
            # continuation lines marked, so nothing they hold can redraw or fake the prompt below.
            click.echo(f"\n? {continued(request.title, '  │ ')}", err=True)
            preview = json.dumps(request.arguments, ensure_ascii=False)
            click.echo(f"  {visible(preview[:600])}{'…' if len(preview) > 600 else ''}", err=True)
            hint = "y = allow once, n = reject" + (f", a = allow every {request.kind} this session" if "a" in choices else "")
            try:
                key = click.prompt(f"  {hint}", type=click.Choice(choices), show_choices=True, err=True)
            except (click.Abort, EOFError):
                key = "n"
        if key == "n":
            return Answer(option=PermissionOption.REJECT_ONCE, reason="rejected at the terminal")
        return Answer(option=PermissionOption.ALLOW_ONCE, remember_for_session=key == "a", reason="approved at the terminal")


class ApprovalGate:
    def __init__(self, ladder: Ladder, approver: Approver) -> None:
        self.ladder = ladder
        self.approver = approver
        self.session_approved: set[str] = set()  # kinds the user approved with `a`

    def decide(self, prepared: PreparedCall) -> ApprovalOutcome:
        command = prepared.arguments().get("command") if prepared.spec.name == "shell" else None
        level, reason = self.ladder.level(prepared.spec.name, prepared.kind, prepared.action, command)
        if level == Level.AUTOMATIC:
            return ApprovalOutcome(allowed=True, decision="automatic", level=level, executor=Executor.OPENAGENTS, reason=reason)
        if level == Level.REFUSE:
            return ApprovalOutcome(allowed=False, decision="refused", level=level, executor=Executor.OPENAGENTS, reason=reason)
        if level == Level.ASK_ONCE and prepared.kind in self.session_approved:
            return ApprovalOutcome(allowed=True, decision="approved_for_session", level=level, executor=Executor.USER,
                                   reason=f"{prepared.kind} approved for this session")
        request = ApprovalRequest(
            call_id=prepared.call.id, tool=prepared.spec.name, kind=prepared.kind, action=prepared.action,
            level=level, title=call_title(prepared.spec.name, prepared.arguments()), arguments=prepared.arguments(),
        )
        answer = self.approver.ask(request)
        allowed = answer.option == PermissionOption.ALLOW_ONCE
        if allowed and answer.remember_for_session and level == Level.ASK_ONCE:
            self.session_approved.add(prepared.kind)
        return ApprovalOutcome(allowed=allowed, decision=answer.option.value, level=level, executor=answer.executor, reason=answer.reason or reason)
