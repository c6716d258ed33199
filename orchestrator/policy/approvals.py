"""Who answers the ladder's questions: a person at a terminal, an editor over ACP, or nobody (CI).

On any wire only `allow_once` and `reject_once` exist. Approving a kind for the whole session
(`a` at the terminal), or a shell command's prefix (`A`, policy/prefix.py), is the client's own
policy: it is remembered here, never sent anywhere.
"""

from __future__ import annotations

import json
import sys
import threading
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable, Protocol

import click
from pydantic import BaseModel

from ..ground.text import continued, visible
from ..protocol import Executor
from ..tools.catalog import LAND_ACTION, LAND_KIND, LAND_TOOL
from ..tools.registry import PreparedCall
from .ladder import Ladder, Level
from .prefix import allowed_by, shell_prefix

if TYPE_CHECKING:
    from ..workspace.preview import Preview


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
    diff: str | None = None  # what an edit would change, for the person deciding
    diff_note: str | None = None  # ours, one line: why there is no diff (too large, too slow), or that it was cut
    command_prefix: str | None = None  # the shell prefix an answer may approve for the session (client-side only)


class Answer(BaseModel):
    option: PermissionOption
    remember_for_session: bool = False  # client-side only
    remember_prefix: bool = False  # client-side only: the request's command_prefix, for the rest of the session
    executor: Executor = Executor.USER
    reason: str = ""


class ApprovalOutcome(BaseModel):
    allowed: bool
    decision: str  # automatic | auto_approved | allow_once | reject_once | approved_for_session | refused
    level: Level
    executor: Executor
    reason: str


class Approver(Protocol):
    """Asks someone. An approver whose `shows_diff` is true puts `request.diff` in front of a
    person; for any other (no such attribute) the gate makes no preview."""

    def ask(self, request: ApprovalRequest) -> Answer: ...


def shows_diffs(approver: Approver) -> bool:
    """Whether a preview made for `approver` would be seen by anyone: a preview costs a child
    process and up to its deadline, so it is made only then."""
    return getattr(approver, "shows_diff", False) is True


class NonInteractiveApprover:
    """CI: nobody is there to ask, so whatever would ask is refused (a policy file can allow it).
    It is never asked to widen egress (no `asks_egress`): a non-interactive run never widens."""

    def ask(self, request: ApprovalRequest) -> Answer:
        return Answer(
            option=PermissionOption.REJECT_ONCE,
            executor=Executor.OPENAGENTS,
            reason=f"non-interactive session: {request.action} needs approval "
            f"({request.level.value}); allow it in a policy file",
        )


MAX_REASON_CHARS = 500


def parse_answer(line: str, choices: list[str]) -> tuple[str, str] | None:
    """`y`, `a`, `A`, `n`, or `n` followed by a reason (`n use the fixture instead`, `n: not now`):
    (key, reason), or None for anything else. The reason goes to the model in the refusal. Keys are
    read in either case, but for `A` (a shell prefix for the session), which only `A` itself gives."""
    text = line.strip()
    key, rest = text[:1], text[1:]
    if key != "A" or "A" not in choices:
        key = key.lower()
    if key not in choices:
        return None
    if key != "n":
        return (key, "") if not rest.strip() else None
    if rest and rest[0] not in " :\t-":
        return None  # "no" or "nope": no reason, but not a word we know either
    return key, rest.lstrip(" :\t-").strip()[:MAX_REASON_CHARS]


class TerminalApprover:
    """y: allow once, n [reason]: reject once (the reason goes to the model), a: approve this kind
    for the session (ask-once rungs only), A: approve this shell command's prefix for the session
    (when the gate offers one: request.command_prefix). Ctrl-C at the prompt ends the session: the
    KeyboardInterrupt goes up to the turn loop, which ends it cancelled."""

    asks_egress = True  # a person answers: a refused egress request may be offered (ApprovalGate.widen_egress)

    def __init__(self, show_diff: Callable[[str], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._show_diff = show_diff
        self.shows_diff = show_diff is not None

    def ask(self, request: ApprovalRequest) -> Answer:
        choices = ["y", "n", "a"] if request.level == Level.ASK_ONCE else ["y", "n"]
        if request.command_prefix:
            choices.append("A")
        with self._lock:
            # The title and arguments are the model's: shown with every control character visible and
            # continuation lines marked, so nothing they hold can redraw or fake the prompt below.
            click.echo(f"\n? {continued(request.title, '  │ ')}", err=True)
            if request.diff_note:
                click.echo(f"  ({visible(request.diff_note)[:200]})", err=True)
            if request.diff and self._show_diff:
                self._show_diff(request.diff)
            else:
                preview = json.dumps(request.arguments, ensure_ascii=False)
                click.echo(f"  {visible(preview[:600])}{'…' if len(preview) > 600 else ''}", err=True)
            every = "it for this session" if request.kind == "egress" else f"every {request.kind} this session"
            hint = "y = allow once, n = reject" + (f", a = allow {every}" if "a" in choices else "")
            if "A" in choices:
                hint += f", A = allow every command starting `{visible(request.command_prefix)}` this session"
            while True:
                click.echo(f"  {hint} ({', '.join(choices)}): ", nl=False, err=True)
                line = sys.stdin.readline()  # Ctrl-C raises KeyboardInterrupt here, and it goes up
                if not line:  # stdin closed: nobody can answer
                    return Answer(
                        option=PermissionOption.REJECT_ONCE, reason="rejected: the terminal's input was closed"
                    )
                parsed = parse_answer(line, choices)
                if parsed is not None:
                    break
                click.echo(f"  Error: answer {' or '.join(choices)}", err=True)
        key, reason = parsed
        if key == "n":
            return Answer(
                option=PermissionOption.REJECT_ONCE,
                reason=f"rejected at the terminal: {reason}" if reason else "rejected at the terminal",
            )
        if key == "a":
            return Answer(
                option=PermissionOption.ALLOW_ONCE,
                remember_for_session=True,
                reason=f"approved at the terminal for every {request.kind} this session",
            )
        if key == "A":
            return Answer(
                option=PermissionOption.ALLOW_ONCE,
                remember_prefix=True,
                reason=f"approved at the terminal for every command starting `{request.command_prefix}` this session",
            )
        return Answer(option=PermissionOption.ALLOW_ONCE, reason="approved at the terminal")


class ApprovalGate:
    """`auto_approve` (--auto-approve): whatever would ask and runs inside the sandbox proceeds
    without asking; host-side tools (git, MCP tools) still ask, and a deny still wins.
    `preview(prepared)` gives the diff an edit would make, for the question: called only when the
    approver is about to show it to a person (never for automatic, refused, session-approved or
    auto-approved calls, nor for an approver that shows no diff: CI, an editor, an MCP client).

    A shell prefix is offered only for a sandbox command the default ladder asks about: a policy
    rule that says `ask` means every time, and a host-side tool is never approved wholesale."""

    def __init__(
        self,
        ladder: Ladder,
        approver: Approver,
        auto_approve: bool = False,
        preview: Callable[[PreparedCall], Preview | None] | None = None,
    ) -> None:
        self.ladder = ladder
        self.approver = approver
        self.auto_approve = auto_approve
        self.preview = preview
        self.session_approved: set[str] = set()  # kinds the user approved with `a`
        self.session_prefixes: set[str] = set()  # shell prefixes the user approved with `A`

    def widen_egress(self, call_id: str, what: str, arguments: dict[str, Any]) -> ApprovalOutcome:
        """Offers one request the gate refused by default (no rule matched) to the person: allow it
        once, for this session, or not. Only approvers with a person behind them (`asks_egress`: the
        terminal, an editor over ACP) are asked; anything else (CI, MCP) never widens egress, and
        --auto-approve does not answer this question."""
        if getattr(self.approver, "asks_egress", False) is not True:
            return ApprovalOutcome(
                allowed=False,
                decision="refused",
                level=Level.ASK_ONCE,
                executor=Executor.OPENAGENTS,
                reason="egress is widened only by a person, in an interactive session",
            )
        request = ApprovalRequest(
            call_id=call_id,
            tool="egress",
            kind="egress",
            action=f"egress {what}",
            level=Level.ASK_ONCE,
            title=f"the egress gate refused {what} (no rule allows it): allow it?",
            arguments=arguments,
        )
        answer = self.approver.ask(request)
        allowed = answer.option == PermissionOption.ALLOW_ONCE
        decision = (
            ("approved_for_session" if answer.remember_for_session else "allow_once")
            if allowed
            else answer.option.value
        )
        return ApprovalOutcome(
            allowed=allowed,
            decision=decision,
            level=Level.ASK_ONCE,
            executor=answer.executor,
            reason=answer.reason or "asked to widen egress",
        )

    def decide(self, prepared: PreparedCall) -> ApprovalOutcome:
        level, reason = self.ladder.level(prepared.spec.name, prepared.kind, prepared.action, prepared.command)
        if level == Level.AUTOMATIC:
            return ApprovalOutcome(
                allowed=True, decision="automatic", level=level, executor=Executor.OPENAGENTS, reason=reason
            )
        if level == Level.REFUSE:
            return ApprovalOutcome(
                allowed=False, decision="refused", level=level, executor=Executor.OPENAGENTS, reason=reason
            )
        if level == Level.ASK_ONCE and prepared.kind in self.session_approved:
            return ApprovalOutcome(
                allowed=True,
                decision="approved_for_session",
                level=level,
                executor=Executor.USER,
                reason=f"{prepared.kind} approved for this session",
            )
        offered = self._prefix_offered(prepared)
        covering = allowed_by(self.session_prefixes, prepared.command) if offered else None
        if covering is not None:
            return ApprovalOutcome(
                allowed=True,
                decision="approved_for_session",
                level=level,
                executor=Executor.USER,
                reason=f"commands starting `{covering}` approved for this session",
            )
        if self.auto_approve and prepared.spec.side == "sandbox":
            return ApprovalOutcome(
                allowed=True,
                decision="auto_approved",
                level=level,
                executor=Executor.USER,
                reason=f"--auto-approve: runs inside the sandbox ({reason})",
            )
        preview = None
        if self.preview is not None and shows_diffs(self.approver):
            try:
                preview = self.preview(prepared)
            except Exception:  # noqa: BLE001 - a preview is a courtesy; the question is asked without it
                preview = None
        request = ApprovalRequest(
            call_id=prepared.call.id,
            tool=prepared.spec.name,
            kind=prepared.kind,
            action=prepared.action,
            level=level,
            title=prepared.title,
            arguments=prepared.arguments(),
            diff=preview.text if preview else None,
            diff_note=preview.note if preview else None,
            command_prefix=shell_prefix(prepared.command) if offered and prepared.command is not None else None,
        )
        answer = self.approver.ask(request)
        allowed = answer.option == PermissionOption.ALLOW_ONCE
        remembered = allowed and answer.remember_for_session and level == Level.ASK_ONCE
        if remembered:
            self.session_approved.add(prepared.kind)
        if allowed and answer.remember_prefix and request.command_prefix:
            self.session_prefixes.add(request.command_prefix)
            remembered = True
        decision = "approved_for_session" if remembered else answer.option.value
        return ApprovalOutcome(
            allowed=allowed, decision=decision, level=level, executor=answer.executor, reason=answer.reason or reason
        )

    def decide_landing(self, requested: str | None = None) -> ApprovalOutcome:
        """Whether a copy's changes may land in the real workspace: the one decision every landing
        meets (review.landing.apply_scanned takes its outcome), the ladder's like an edit's. A deny
        (a rule, copy-only, read-only) refuses; an allow, or no rule at all, lets it land; a rule
        that asks is answered by `requested`, the user's own command that asked for this landing
        (`oa-sandbox apply`, `run --apply`), else put to the approver (the editor, MCP elicitation;
        nobody in CI: refused). --auto-approve never answers it: the landing is on the host."""
        level, reason = self.ladder.level(LAND_TOOL, LAND_KIND, LAND_ACTION)
        if level == Level.AUTOMATIC:
            return ApprovalOutcome(
                allowed=True, decision="automatic", level=level, executor=Executor.OPENAGENTS, reason=reason
            )
        if level == Level.REFUSE:
            return ApprovalOutcome(
                allowed=False, decision="refused", level=level, executor=Executor.OPENAGENTS, reason=reason
            )
        if requested:
            return ApprovalOutcome(
                allowed=True,
                decision="allow_once",
                level=level,
                executor=Executor.USER,
                reason=f"asked for by the user's own command ({requested}); {reason}",
            )
        if level == Level.ASK_ONCE and LAND_KIND in self.session_approved:
            return ApprovalOutcome(
                allowed=True,
                decision="approved_for_session",
                level=level,
                executor=Executor.USER,
                reason=f"{LAND_KIND} approved for this session",
            )
        request = ApprovalRequest(
            call_id=LAND_ACTION,
            tool=LAND_TOOL,
            kind=LAND_KIND,
            action=LAND_ACTION,
            level=level,
            title="land the private copy's changes in the real workspace",
            arguments={},
        )
        answer = self.approver.ask(request)
        allowed = answer.option == PermissionOption.ALLOW_ONCE
        remembered = allowed and answer.remember_for_session and level == Level.ASK_ONCE
        if remembered:
            self.session_approved.add(LAND_KIND)
        return ApprovalOutcome(
            allowed=allowed,
            decision="approved_for_session" if remembered else answer.option.value,
            level=level,
            executor=answer.executor,
            reason=answer.reason or reason,
        )

    def _prefix_offered(self, prepared: PreparedCall) -> bool:
        if prepared.command is None or prepared.spec.side != "sandbox":
            return False
        return not any(
            rule.matches(prepared.spec.name, prepared.kind, prepared.action, prepared.command)
            for rule in self.ladder.rules
        )
