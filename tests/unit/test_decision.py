"""The one decision for a call (policy/approvals.py decide), in docs/hooks.md's order: the ladder on
what the BeforeTool hooks left (a hook's `ask` makes an automatic rung ask, never undoes a refusal),
the user's own request, the session's memory, --auto-approve for a box call, then the Notification
hook and the person. Pure: no box, no hooks' processes."""

from __future__ import annotations

from orchestrator.policy.approvals import (
    Answer,
    ApprovalGate,
    ApprovalRequest,
    PermissionOption,
    Question,
    Remembered,
    decide,
)
from orchestrator.policy.ladder import Decision, Ladder, Level, PolicyRule
from orchestrator.protocol import Executor
from orchestrator.tools.catalog import LAND_ACTION, LAND_KIND, LAND_TOOL


class Person:
    """Answers from a script ('y', 'a', 'n') and keeps what it was asked and what had been said before."""

    def __init__(self, *answers: str, log: list[str] | None = None) -> None:
        self.answers = list(answers)
        self.asked: list[ApprovalRequest] = []
        self.log = log if log is not None else []

    def ask(self, request: ApprovalRequest) -> Answer:
        self.asked.append(request)
        self.log.append(f"asked {request.action}")
        key = self.answers.pop(0)
        if key == "n":
            return Answer(option=PermissionOption.REJECT_ONCE, reason="no")
        return Answer(option=PermissionOption.ALLOW_ONCE, remember_for_session=key == "a")


READ = Question("1", "read_file", "read", "read_file", "read a", {"path": "a"}, in_box=True)
WRITE = Question("2", "write_file", "edit", "write_file", "write a", {"path": "a"}, in_box=True)
SHELL = Question("3", "shell", "execute", "shell", "ls", {"command": "ls"}, command="ls", in_box=True)
LAND = Question(LAND_ACTION, LAND_TOOL, LAND_KIND, LAND_ACTION, "land")


def test_a_hooks_ask_makes_an_automatic_rung_ask_and_never_undoes_a_refusal() -> None:
    person = Person("y")
    asked = decide(READ, Ladder(), person, Remembered(), ask=True)
    assert asked.allowed and asked.level == Level.ASK_EVERY_TIME and "a hook asked for a person" in asked.reason
    deny = Ladder([PolicyRule(tool="read_file", decision=Decision.DENY)])
    refused = decide(READ, deny, person, Remembered(), ask=True, auto_approve=True)
    assert not refused.allowed and refused.decision == "refused" and len(person.asked) == 1
    assert decide(READ, Ladder(), person, Remembered()).decision == "automatic"  # no ask: nobody is asked


def test_notification_comes_just_before_a_person_and_only_then() -> None:
    log: list[str] = []
    person = Person("a", "y", log=log)

    def notify(question: Question, reason: str) -> None:
        log.append(f"notified {question.action}")

    remembered = Remembered()
    assert decide(READ, Ladder(), person, remembered, notify=notify).decision == "automatic"
    assert decide(WRITE, Ladder(), person, remembered, notify=notify).decision == "approved_for_session"
    again = decide(WRITE, Ladder(), person, remembered, notify=notify)  # the session's memory answers
    auto = decide(SHELL, Ladder(), person, remembered, notify=notify, auto_approve=True)
    assert (again.decision, auto.decision) == ("approved_for_session", "auto_approved")
    assert decide(SHELL, Ladder(), person, remembered, notify=notify).allowed
    assert log == ["notified write_file", "asked write_file", "notified shell", "asked shell"]


def test_auto_approve_never_answers_a_host_side_call_and_the_users_request_answers_a_landing() -> None:
    ask_landing = Ladder([PolicyRule(tool=LAND_TOOL, decision=Decision.ASK)])
    person = Person("n")
    assert not decide(LAND, ask_landing, person, Remembered(), auto_approve=True).allowed  # asked, said no
    requested = decide(LAND, ask_landing, person, Remembered(), requested="oa-sandbox apply")
    assert requested.allowed and requested.executor == Executor.USER and "oa-sandbox apply" in requested.reason
    deny = Ladder([PolicyRule(kind="edit", decision=Decision.DENY)])
    assert not decide(LAND, deny, person, Remembered(), requested="oa-sandbox apply").allowed  # a deny still wins
    assert len(person.asked) == 1


def test_a_landing_and_a_call_meet_the_same_decision() -> None:
    """The gate's landing is `decide` on the landing's key: an edit approved for the session lands."""
    gate = ApprovalGate(Ladder([PolicyRule(kind="edit", decision=Decision.ASK)]), Person("a"))
    assert decide(WRITE, gate.ladder, gate.approver, gate.remembered).decision == "approved_for_session"
    landing = gate.decide_landing()
    assert landing.allowed and landing.decision == "approved_for_session" and gate.session_approved == {"edit"}
