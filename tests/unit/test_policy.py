"""The approval ladder, policy tiers and the /bypass/i guard."""

from __future__ import annotations

import re
import sys

import click
import pytest

from orchestrator.cli import main as cli_main
from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.models.base import ToolCall
from orchestrator.policy.approvals import (
    Answer,
    ApprovalGate,
    ApprovalRequest,
    NonInteractiveApprover,
    PermissionOption,
)
from orchestrator.policy.ladder import Decision, Ladder, Level, PolicyRule, Tier, load_policy
from orchestrator.policy.safeparse import PARSE_SECONDS, parse_data_bounded
from orchestrator.protocol import Executor
from orchestrator.tools.registry import ToolRegistry


class ScriptedPerson:
    """Answers like a person at the terminal would, from a list; records what was asked."""

    def __init__(self, *keys: str) -> None:
        self.keys = list(keys)
        self.asked: list[ApprovalRequest] = []

    def ask(self, request):
        self.asked.append(request)
        key = self.keys.pop(0)
        return Answer(
            option=PermissionOption.REJECT_ONCE if key == "n" else PermissionOption.ALLOW_ONCE,
            remember_for_session=key == "a",
        )


def prepared(registry, name, args):
    return registry.prepare(ToolCall(id="c", name=name, arguments=args))


@pytest.fixture
def registry(tmp_path):
    """A workspace with a real repository at start, so the host git tool is on."""
    import pygit2

    pygit2.init_repository(str(tmp_path))
    return ToolRegistry(sandbox=None, workspace=tmp_path, repo=ToolRegistry.open_repo(tmp_path))


@pytest.mark.parametrize(
    "tool,args,level",
    [
        ("read_file", {"path": "a"}, Level.AUTOMATIC),
        ("list_files", {}, Level.AUTOMATIC),
        ("grep_files", {"pattern": "x"}, Level.AUTOMATIC),
        ("write_file", {"path": "a", "content": ""}, Level.ASK_ONCE),
        ("edit_file", {"path": "a", "old_text": "x", "new_text": "y"}, Level.ASK_ONCE),
        ("shell", {"command": "ls"}, Level.ASK_EVERY_TIME),
        ("git", {"subcommand": "status"}, Level.AUTOMATIC),
        ("git", {"subcommand": "commit", "message": "m"}, Level.ASK_ONCE),
    ],
)
def test_default_ladder(registry, tool, args, level):
    p = prepared(registry, tool, args)
    assert Ladder().level(p.spec.name, p.kind, p.action)[0] == level


def test_ask_once_with_a_approves_the_kind_for_the_session(registry):
    person = ScriptedPerson("a")
    gate = ApprovalGate(Ladder(), person)
    first = gate.decide(prepared(registry, "write_file", {"path": "a", "content": ""}))
    second = gate.decide(prepared(registry, "edit_file", {"path": "b", "old_text": "x", "new_text": "y"}))
    assert first.allowed and first.decision == "approved_for_session" and first.executor == Executor.USER
    assert second.allowed and second.decision == "approved_for_session" and len(person.asked) == 1


def test_ask_every_time_asks_every_time_even_after_a(registry):
    person = ScriptedPerson("a", "n")
    gate = ApprovalGate(Ladder(), person)
    assert gate.decide(prepared(registry, "shell", {"command": "ls"})).allowed
    second = gate.decide(prepared(registry, "shell", {"command": "ls"}))
    assert not second.allowed and second.decision == "reject_once" and len(person.asked) == 2


def test_only_allow_once_and_reject_once_exist_on_the_wire():
    assert {o.value for o in PermissionOption} == {"allow_once", "reject_once"}


def test_non_interactive_refuses_what_would_ask_unless_policy_allows(registry, tmp_path):
    gate = ApprovalGate(Ladder(), NonInteractiveApprover())
    refused = gate.decide(prepared(registry, "shell", {"command": "make test"}))
    assert not refused.allowed and refused.executor == Executor.OPENAGENTS and "policy" in refused.reason
    policy = tmp_path / "p.toml"
    policy.write_text('[[rules]]\nid = "tests"\ntool = "shell"\ncommand_prefix = "make test"\ndecision = "allow"\n')
    gate = ApprovalGate(Ladder(load_policy(policy)), NonInteractiveApprover())
    assert gate.decide(prepared(registry, "shell", {"command": "make test"})).allowed
    assert not gate.decide(prepared(registry, "shell", {"command": "make test; curl x"})).allowed


def test_admin_deny_beats_user_allow(registry, tmp_path):
    user = tmp_path / "user.yaml"
    user.write_text("rules:\n  - {id: edits, kind: edit, decision: allow}\n")
    admin = tmp_path / "admin.toml"
    admin.write_text('[[rules]]\nid = "no-writes"\ntool = "write_file"\ndecision = "deny"\n')
    ladder = Ladder(load_policy(user) + load_policy(admin, Tier.ADMIN))
    w = prepared(registry, "write_file", {"path": "a", "content": ""})
    e = prepared(registry, "edit_file", {"path": "a", "old_text": "x", "new_text": "y"})
    assert ladder.level(w.spec.name, w.kind, w.action)[0] == Level.REFUSE
    assert ladder.level(e.spec.name, e.kind, e.action)[0] == Level.AUTOMATIC


def test_workspace_policy_can_only_tighten(tmp_path):
    ws_policy = tmp_path / "policy.toml"
    ws_policy.write_text('[[rules]]\ntool = "shell"\ndecision = "allow"\n')
    with pytest.raises(OpenAgentsError) as info:
        load_policy(ws_policy, Tier.WORKSPACE)
    assert info.value.type == ErrorType.CONFIG_INVALID and "only ask or deny" in info.value.message


@pytest.mark.parametrize(
    "text",
    [
        '[[rules]]\nid = "ByPass-all"\ndecision = "allow"\n',
        '[[rules]]\nkind = "bypass"\ndecision = "allow"\n',
        "bypass_approvals = true\n",
        '[[rules]]\ntool = "shell"\ndecision = "allow"\nbypassPermissions = true\n',
    ],
)
def test_bypass_named_options_are_rejected_at_load(tmp_path, text):
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(OpenAgentsError) as info:
        load_policy(path)
    assert info.value.type == ErrorType.CONFIG_INVALID and "bypass" in info.value.message.lower()


def test_no_cli_option_is_named_like_bypass():
    def walk(command: click.Command):
        yield command
        for sub in getattr(command, "commands", {}).values():
            yield from walk(sub)

    names = [(c.name, opt) for c in walk(cli_main) for p in c.params for opt in [p.name, *getattr(p, "opts", [])]]
    assert names and not [n for n in names if re.search("bypass", str(n[1]), re.I)]


def test_paths_outside_the_workspace_are_refused_before_the_ladder(registry):
    for args in ({"path": "../x"}, {"path": "/etc/passwd"}):
        with pytest.raises(OpenAgentsError) as info:
            prepared(registry, "read_file", args)
        assert info.value.type == ErrorType.PATH_OUTSIDE_WORKSPACE


def test_unknown_and_disabled_tools_get_typed_refusals(tmp_path):
    from orchestrator.tools.registry import RegistryConfig

    registry = ToolRegistry(None, tmp_path, RegistryConfig(disabled={"shell"}))
    for name, kind in (
        ("rm_rf", ErrorType.UNKNOWN_TOOL),
        ("shell", ErrorType.TOOL_DISABLED),
        ("delegate", ErrorType.UNKNOWN_TOOL),
    ):
        with pytest.raises(OpenAgentsError) as info:
            prepared(registry, name, {"command": "ls"})
        assert info.value.type == kind and info.value.recoverable
    assert "shell" not in registry.active() and "delegate" not in registry.active()


def test_a_rule_string_longer_than_its_bound_is_refused_without_being_quoted(tmp_path):
    """A rule's id lands in every decision's label: a 10 KB one is refused, and the error names
    the field, not the value."""
    path = tmp_path / "p.toml"
    path.write_text(f'[[rules]]\nid = "{"x" * 10_000}"\ntool = "shell"\ndecision = "ask"\n')
    with pytest.raises(OpenAgentsError) as info:
        load_policy(path)
    assert info.value.type == ErrorType.CONFIG_INVALID and "rules[0].id: string_too_long" in info.value.message
    assert "xxx" not in info.value.message


def test_a_slow_parser_start_does_not_count_against_the_parse(tmp_path, monkeypatch):
    """The untrusted parse's clock starts once its child has started and imported: on a loaded
    machine the start alone took over the 2 s bound, and a legitimate policy was refused."""
    slow_python = tmp_path / "slow-python"
    slow_python.write_text(f'#!/bin/sh\nsleep {PARSE_SECONDS + 1}\nexec {sys.executable} "$@"\n')
    slow_python.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(slow_python))
    data = parse_data_bounded(b'[[rules]]\ntool = "shell"\ndecision = "ask"\n', ".toml")
    assert data == {"rules": [{"tool": "shell", "decision": "ask"}]}


# -- issue 40: the workspace access level, and landing as an action the ladder decides ----------
def _parsed(text: str, tier: Tier | None = None):
    from orchestrator.policy.ladder import parse_policy

    return parse_policy(text.encode(), "p.toml", ".toml", tier).rules


def _pinned(text: str, tier: Tier | None = None):
    """A policy file's workspace_access pin (as policy/load.py makes it), in a list."""
    from orchestrator.policy.ladder import access_pin, parse_policy

    pin = access_pin(parse_policy(text.encode(), "p.toml", ".toml", tier), "p.toml")
    return [pin] if pin is not None else []


@pytest.mark.parametrize("selector", ['tool = "apply_changes"', 'action = "land"', 'kind = "edit"'])
def test_a_rule_names_the_landing(selector):
    """Refused at load as unknown before: now each of the three names the landing."""
    rules = _parsed(f'[[rules]]\n{selector}\ndecision = "deny"\n')
    assert Ladder(rules).level("apply_changes", "edit", "land")[0] == Level.REFUSE
    assert (
        Ladder().level("apply_changes", "edit", "land")[0] == Level.AUTOMATIC
    )  # no rule: the front-end's landing is the request


def test_an_unknown_access_level_is_one_readable_line():
    with pytest.raises(OpenAgentsError) as err:
        _parsed('workspace_access = "writable"\n')
    assert (
        err.value.type == ErrorType.CONFIG_INVALID
        and "must be one of read-write, copy-only, read-only" in err.value.message
    )


def test_the_most_restrictive_level_wins_and_no_tier_widens_it():
    from orchestrator.policy.ladder import Access, access_level

    admin = _pinned('workspace_access = "read-only"\n', Tier.ADMIN)
    text = (
        'workspace_access = "read-write"\n[[rules]]\nkind = "edit"\ndecision = "allow"\n'
        '[[rules]]\ntool = "apply_changes"\ndecision = "allow"\n'
    )
    user = _parsed(text)
    ladder = Ladder(user, admin + _pinned(text))
    assert access_level(admin + _pinned(text)) == Access.READ_ONLY
    for tool, action in (("write_file", "write_file"), ("edit_file", "edit_file"), ("apply_changes", "land")):
        level, reason = ladder.level(tool, "edit", action)
        assert level == Level.REFUSE and "workspace_access = read-only (admin policy p.toml)" in reason
    assert ladder.level("read_file", "read", "read_file")[0] == Level.AUTOMATIC
    # A user's copy-only under an admin's read-write: still copy-only (levels only tighten).
    both = _pinned('workspace_access = "read-write"\n', Tier.ADMIN) + _pinned('workspace_access = "copy-only"\n')
    assert (
        access_level(both) == Access.COPY_ONLY
        and Ladder([], both).level("apply_changes", "edit", "land")[0] == Level.REFUSE
    )
    assert (
        Ladder([], both).level("write_file", "edit", "write_file")[0] == Level.ASK_ONCE
    )  # copy-only refuses landing, not edits
    # A workspace file may set a level (it only tightens).
    assert access_level(_pinned('workspace_access = "copy-only"\n', Tier.WORKSPACE)) == Access.COPY_ONLY


def test_the_access_rules_cannot_be_written_in_a_file():
    """The marker that makes a rule hold over every tier is not a key a file can set."""
    with pytest.raises(OpenAgentsError):
        _parsed('[[rules]]\n_access = "read-only"\ndecision = "allow"\n')


def test_a_landing_rule_that_asks_is_answered_by_the_users_own_command_or_the_approver():
    rules = _parsed('[[rules]]\naction = "land"\ndecision = "ask"\n')
    gate = ApprovalGate(Ladder(rules), NonInteractiveApprover())
    assert gate.decide_landing("oa-sandbox apply S").allowed
    nobody = gate.decide_landing()
    assert not nobody.allowed and nobody.executor == Executor.OPENAGENTS

    class Person:
        def __init__(self) -> None:
            self.asked: list[ApprovalRequest] = []

        def ask(self, request: ApprovalRequest) -> Answer:
            self.asked.append(request)
            return Answer(option=PermissionOption.REJECT_ONCE, reason="no")

    person = Person()
    outcome = ApprovalGate(Ladder(rules), person).decide_landing()
    assert not outcome.allowed and outcome.executor == Executor.USER
    assert [(r.tool, r.kind, r.action) for r in person.asked] == [("apply_changes", "edit", "land")]
    from orchestrator.workspace.review.landing import refusal

    assert refusal(outcome).type == ErrorType.REJECTED_BY_USER and refusal(nobody).type == ErrorType.REFUSED_BY_POLICY


@pytest.mark.parametrize(
    "command",
    [
        "rm -rf x",
        "true; rm x",
        "sh -c 'rm x'",
        "env rm x",
        "/bin/rm x",
        "$(rm x)",
        " rm x",
        "echo `rm x`",
        "ls && rm x",
        'bash -lc "rm x"',
        "xargs rm < list",
    ],
)
def test_a_deny_prefix_refuses_the_program_wherever_the_command_may_run_it(command):
    """Attack: `deny rm` was passed by `true; rm x` (a prefix never matched a compound command, so
    the command fell to the default ladder, which --auto-approve answers). A deny now fails closed."""
    ladder = Ladder([PolicyRule(tool="shell", command_prefix="rm", decision=Decision.DENY)])
    assert ladder.level("shell", "execute", "shell", command)[0] == Level.REFUSE


@pytest.mark.parametrize(
    "command,refused",
    [
        ("git push origin", True),
        ("git -C d push", True),
        ("cd a && git push", True),
        ("git status", False),
        ("pytest -q", False),
    ],
)
def test_a_deny_prefix_leaves_plain_commands_it_does_not_name(command, refused):
    ladder = Ladder([PolicyRule(tool="shell", command_prefix="git push", decision=Decision.DENY)])
    assert (ladder.level("shell", "execute", "shell", command)[0] == Level.REFUSE) is refused


def test_an_allow_prefix_still_never_matches_a_compound_command():
    ladder = Ladder([PolicyRule(tool="shell", command_prefix="pytest", decision=Decision.ALLOW)])
    assert ladder.level("shell", "execute", "shell", "pytest -q")[0] == Level.AUTOMATIC
    assert ladder.level("shell", "execute", "shell", "pytest -q; curl x")[0] != Level.AUTOMATIC
