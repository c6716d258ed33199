"""Whether a call runs (`decide`, the one decision) and who answers the ladder's questions: a person
at a terminal, an editor over ACP, or nobody (CI).

Every call of every front-end meets `decide` (pipeline.py, through ApprovalGate.decide), and so does
every landing of a copy's changes (ApprovalGate.decide_landing). Its order is docs/hooks.md's. Before
it, the call's arguments were validated and the BeforeTool hooks ran (pipeline.py: a block refuses the
call, a new input is validated again; a hook's `ask` is brought here). Then:
1. the ladder's rung for the call, from the policy's rules and its access level (ladder.py): a refusal
   or an automatic allow ends it; a hook's `ask` makes an automatic rung ask every time (it never
   undoes a refusal);
2. the user's own command that asked for the call (a landing's `requested`: `oa-sandbox apply`)
   answers the question;
3. what the person approved for this session answers it: a kind (`a`, ask-once rungs), a shell prefix (`A`);
4. --auto-approve answers it for a call that runs inside the sandbox (never for a host-side one);
5. the Notification hook is told (`notify`), and the person is asked, with a preview of the edit when
   the approver shows one.

On any wire only `allow_once` and `reject_once` exist. Approving a kind for the whole session
(`a` at the terminal), or a shell command's prefix (`A`, policy/prefix.py), is the client's own
policy: it is remembered here (Remembered), never sent anywhere.
"""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Question:
    """What the ladder judges of one call (its key: tool, kind, action, command) and the words a person
    is asked with (title, arguments)."""

    call_id: str
    tool: str
    kind: str
    action: str
    title: str
    arguments: dict[str, Any] = field(default_factory=dict)
    command: str | None = None  # what a rule's command_prefix matches, and a shell prefix is offered for
    in_box: bool = False  # runs inside the sandbox: --auto-approve may answer it, a prefix may be offered


@dataclass
class Remembered:
    """What the person approved for the rest of the session (client-side only, never sent anywhere)."""

    kinds: set[str] = field(default_factory=set)  # `a`: every call of a kind, on an ask-once rung
    prefixes: set[str] = field(default_factory=set)  # `A`: every sandbox command starting so


def _outcome(allowed: bool, decision: str, level: Level, executor: Executor, reason: str) -> ApprovalOutcome:
    return ApprovalOutcome(allowed=allowed, decision=decision, level=level, executor=executor, reason=reason)


def prefix_offered(question: Question, ladder: Ladder) -> bool:
    """A shell prefix is offered only for a sandbox command no policy rule names (a rule that says
    `ask` means every time), and a host-side tool is never approved wholesale."""
    if question.command is None or not question.in_box:
        return False
    return not any(
        rule.matches(question.tool, question.kind, question.action, question.command) for rule in ladder.rules
    )


def decide(
    question: Question,
    ladder: Ladder,
    approver: Approver,
    remembered: Remembered,
    *,
    auto_approve: bool = False,
    ask: bool = False,
    requested: str | None = None,
    notify: Callable[[Question, str], None] | None = None,
    preview: Callable[[], Preview | None] | None = None,
) -> ApprovalOutcome:
    """Whether the call runs, who said so and why (the module's steps, in order; the ladder's input is
    only its rules and the access level). `ask`: a BeforeTool
    hook asked for a person; `requested`: the user's own command that asked for this call; `notify`:
    told (with the ladder's reason) just before a person is asked; `preview`: the edit's diff, made only
    when the approver shows one to a person."""
    level, reason = ladder.level(question.tool, question.kind, question.action, question.command)
    if ask and level == Level.AUTOMATIC:
        level, reason = Level.ASK_EVERY_TIME, f"a hook asked for a person ({reason})"
    if level == Level.AUTOMATIC:
        return _outcome(True, "automatic", level, Executor.OPENAGENTS, reason)
    if level == Level.REFUSE:
        return _outcome(False, "refused", level, Executor.OPENAGENTS, reason)
    if requested:
        return _outcome(
            True, "allow_once", level, Executor.USER, f"asked for by the user's own command ({requested}); {reason}"
        )
    if level == Level.ASK_ONCE and question.kind in remembered.kinds:
        return _outcome(
            True, "approved_for_session", level, Executor.USER, f"{question.kind} approved for this session"
        )
    offered = prefix_offered(question, ladder)
    covering = allowed_by(remembered.prefixes, question.command) if offered else None
    if covering is not None:
        return _outcome(
            True,
            "approved_for_session",
            level,
            Executor.USER,
            f"commands starting `{covering}` approved for this session",
        )
    if auto_approve and question.in_box:
        return _outcome(
            True, "auto_approved", level, Executor.USER, f"--auto-approve: runs inside the sandbox ({reason})"
        )
    shown = None
    if preview is not None and shows_diffs(approver):
        try:
            shown = preview()
        except Exception:  # noqa: BLE001 - a preview is a courtesy; the question is asked without it
            shown = None
    request = ApprovalRequest(
        call_id=question.call_id,
        tool=question.tool,
        kind=question.kind,
        action=question.action,
        level=level,
        title=question.title,
        arguments=question.arguments,
        diff=shown.text if shown else None,
        diff_note=shown.note if shown else None,
        command_prefix=shell_prefix(question.command) if offered and question.command is not None else None,
    )
    if notify is not None:
        notify(question, reason)
    answer = approver.ask(request)
    allowed = answer.option == PermissionOption.ALLOW_ONCE
    remember = allowed and answer.remember_for_session and level == Level.ASK_ONCE
    if remember:
        remembered.kinds.add(question.kind)
    if allowed and answer.remember_prefix and request.command_prefix:
        remembered.prefixes.add(request.command_prefix)
        remember = True
    decision = "approved_for_session" if remember else answer.option.value
    return _outcome(allowed, decision, level, answer.executor, answer.reason or reason)


class ApprovalGate:
    """A session's approvals: its ladder (the policy's rules and access level), who answers
    (`approver`), what the person approved for the session (`remembered`), and `auto_approve`
    (--auto-approve: whatever would ask and runs inside the sandbox proceeds without asking;
    host-side tools, git and MCP tools, still ask, and a deny still wins). Each call's decision and
    each landing's is `decide` above. `preview(prepared)` gives the diff an edit would make, for the
    question: called only when the approver is about to show it to a person (never for automatic,
    refused, session-approved or auto-approved calls, nor for an approver that shows no diff: CI, an
    editor, an MCP client)."""

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
        self.remembered = Remembered()

    @property
    def session_approved(self) -> set[str]:
        """Kinds the user approved with `a`."""
        return self.remembered.kinds

    @property
    def session_prefixes(self) -> set[str]:
        """Shell prefixes the user approved with `A`."""
        return self.remembered.prefixes

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

    def decide(
        self, prepared: PreparedCall, *, ask: bool = False, notify: Callable[[Question, str], None] | None = None
    ) -> ApprovalOutcome:
        """A validated call's decision, on the input the BeforeTool hooks left (`ask`: one of them asked
        for a person; `notify`: the Notification hook, told before a person is asked)."""
        question = Question(
            call_id=prepared.call.id,
            tool=prepared.spec.name,
            kind=prepared.kind,
            action=prepared.action,
            title=prepared.title,
            arguments=prepared.arguments(),
            command=prepared.command,
            in_box=prepared.spec.side == "sandbox",
        )
        preview = self.preview
        return decide(
            question,
            self.ladder,
            self.approver,
            self.remembered,
            auto_approve=self.auto_approve,
            ask=ask,
            notify=notify,
            preview=None if preview is None else lambda: preview(prepared),
        )

    def decide_landing(self, requested: str | None = None) -> ApprovalOutcome:
        """Whether a copy's changes may land in the real workspace: the one decision every landing
        meets (review.landing.apply_scanned takes its outcome), the ladder's like an edit's. A deny
        (a rule, copy-only, read-only) refuses; an allow, or no rule at all, lets it land; a rule
        that asks is answered by `requested`, the user's own command that asked for this landing
        (`oa-sandbox apply`, `run --apply`), else put to the approver (the editor, MCP elicitation;
        nobody in CI: refused). --auto-approve never answers it: the landing is on the host."""
        question = Question(
            call_id=LAND_ACTION,
            tool=LAND_TOOL,
            kind=LAND_KIND,
            action=LAND_ACTION,
            title="land the private copy's changes in the real workspace",
        )
        return decide(question, self.ladder, self.approver, self.remembered, requested=requested)
