"""One meaning for each policy word (issue 49): the loader that checks a hook's filters and a rule's
keys and the matcher that applies them read every form the same way (hook_spec.filter_test,
ladder.rule_value). A form the loader accepts is one the matcher can apply; a form it refuses is one
the matcher could not; `*` (or empty) filters nothing wherever it is written. And `matcher = "*"`
opens a real session from every tier (admin, the user's config, the workspace's own, --policy)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.policy.hook_spec import EVENTS, TOOL_EVENTS, TRIGGER_EVENTS, HookSpec
from orchestrator.policy.ladder import PolicyRule, Tier, known_actions, known_tools, load_workspace_policy, parse_policy
from orchestrator.tools.mcp import names as mcp_names
from orchestrator.tools.tooldef import KINDS
from tests.helpers import make_workspace

# Every form a user might write in a hook's matcher, kind or command_regex.
FORMS = [
    None,
    "",
    "*",
    " * ",
    "  ",
    "shell",
    "read_file",
    "write_file|edit_file",
    ".*",
    "mcp__.*",
    "startup",
    "startup|resume",
    "ToolPermission",
    "auto",
    "finished",
    "curl|wget",
    "(",
    "*shell",
    "a{2",
    "[",
    "shell)",
    "read",
    "execute",
    "exec",
    "edit",
]
TOOLS = ["shell", "read_file", "write_file", "edit_file", "mcp__github__create_issue", "*", ""]
TRIGGERS = ["startup", "resume", "ToolPermission", "auto", "finished", "startupX", None]


def _hook_toml(event: str, key: str, value: str | None) -> bytes:
    extra = f"{key} = {json.dumps(value)}\n" if value is not None else ""
    return f'[[hooks]]\nevent = "{event}"\ncommand = ["/bin/true"]\n{extra}'.encode()


def _validates(event: str, key: str, value: str | None) -> bool:
    try:
        parse_policy(_hook_toml(event, key, value), "t.toml", ".toml", Tier.USER)
    except OpenAgentsError as err:
        assert err.type is ErrorType.CONFIG_INVALID and f"hooks[0].{key}" in err.message, err.message
        assert (
            value is None or value.strip() == "" or repr(value) not in err.message
        )  # the file's words are never quoted
        return False
    return True


def _applies(event: str, key: str, value: str | None) -> bool:
    """Whether the matcher can apply the form, unvalidated: every call it could meet answers."""
    filters: dict[str, Any] = {"matcher": None, "kind": None, "command_regex": None, key: value}
    hook = HookSpec.model_construct(event=event, command=["/bin/true"], **filters)
    try:
        for tool in TOOLS:
            for kind in KINDS:
                hook.matches(tool=tool, kind=kind, command="curl x", trigger=None)
                hook.matches(tool=tool, kind=kind, command=None, trigger=None)
        for trigger in TRIGGERS:
            hook.matches(trigger=trigger)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("event", EVENTS)
@pytest.mark.parametrize("key", ["matcher", "kind", "command_regex"])
def test_a_hook_filter_validates_exactly_when_the_matcher_can_apply_it(event, key):
    for value in FORMS:
        assert _validates(event, key, value) == _applies(event, key, value), (event, key, value)


@pytest.mark.parametrize("event", EVENTS)
@pytest.mark.parametrize("key", ["matcher", "kind", "command_regex"])
@pytest.mark.parametrize("every", [None, "", "*", " * "])
def test_star_or_empty_filters_nothing_on_every_event(event, key, every):
    assert _validates(event, key, every)
    hook = parse_policy(_hook_toml(event, key, every), "t.toml", ".toml").hooks[0]
    assert all(hook.matches(tool=t, kind="read") for t in TOOLS) and all(hook.matches(trigger=t) for t in TRIGGERS)
    assert hook.matches()


def test_what_each_form_matches():
    def hook(event: str, **filters: str) -> HookSpec:
        body = "".join(f"{k} = {json.dumps(v)}\n" for k, v in filters.items())
        return parse_policy(
            f'[[hooks]]\nevent = "{event}"\ncommand = ["/bin/true"]\n{body}'.encode(), "t.toml", ".toml"
        ).hooks[0]

    shell = hook("BeforeTool", matcher="shell")
    assert shell.matches(tool="shell") and not shell.matches(tool="shell2") and not shell.matches(tool="read_file")
    edits = hook("AfterTool", matcher="write_file|edit_file")
    assert edits.matches(tool="write_file") and edits.matches(tool="edit_file") and not edits.matches(tool="read_file")
    mcp = hook("BeforeTool", matcher="mcp__github__.*")
    assert mcp.matches(tool="mcp__github__create_issue") and not mcp.matches(tool="shell")
    start = hook("SessionStart", matcher="startup|resume")
    assert (
        start.matches(trigger="startup") and start.matches(trigger="resume") and not start.matches(trigger="startupX")
    )
    assert hook("SessionStart", matcher="startup").matches(trigger="startup") and not hook(
        "SessionStart", matcher="resume"
    ).matches(trigger="startup")
    execute = hook("BeforeTool", kind="execute")
    assert execute.matches(tool="shell", kind="execute") and not execute.matches(tool="read_file", kind="read")
    curl = hook("BeforeTool", command_regex="curl|wget")
    assert (
        curl.matches(tool="shell", command="x; wget y")
        and not curl.matches(tool="shell", command="ls")
        and not curl.matches(tool="read_file")
    )


def test_a_matcher_on_an_event_with_nothing_to_match_is_refused_not_silently_never_run():
    for event in set(EVENTS) - TOOL_EVENTS - TRIGGER_EVENTS:
        with pytest.raises(OpenAgentsError) as err:
            parse_policy(_hook_toml(event, "matcher", "shell"), "t.toml", ".toml")
        assert "has nothing to match" in err.value.message and "'*'" in err.value.message
    for event in set(EVENTS) - TOOL_EVENTS:
        for key, value in (("kind", "execute"), ("command_regex", "curl")):
            with pytest.raises(OpenAgentsError) as err:
                parse_policy(_hook_toml(event, key, value), "t.toml", ".toml")
            assert "tool calls only" in err.value.message


@pytest.mark.parametrize("tier", [Tier.WORKSPACE, Tier.USER, Tier.ADMIN])
def test_matcher_star_loads_in_every_tier(tier, tmp_path):
    text = '[[hooks]]\nevent = "BeforeTool"\nmatcher = "*"\ncommand = ["/bin/true"]\n'
    assert parse_policy(text.encode(), "t.toml", ".toml", tier).hooks[0].matches(tool="shell")
    ws = make_workspace(tmp_path / "ws", {".openagents/policy.toml": text})
    assert load_workspace_policy(ws, ".openagents/policy.toml").hooks[0].matches(tool="read_file")


# -- a rule's keys -------------------------------------------------------------------------------------

RULE_FORMS = {
    "tool": [
        *known_tools(),
        "*",
        "",
        "mcp__github__create_issue",
        "mcp__a__",
        "mcp__" + "s" * 59,
        "mcp__github__*",
        "mcp__github",
        "mcp__git hub__x",
        "mcp__",
        "shel",
        "mcp__" + "s" * 57 + "__x" * 2,
    ],
    "kind": [*KINDS, "*", "", "exec", "egress"],
    "action": [
        *known_actions(),
        "*",
        "",
        "mcp github",
        "mcp git-hub_2",
        "mcp git hub",
        "mcp ",
        "mcp github*",
        "git push",
    ],
    "command_prefix": ["*", "", "   ", "pytest", "git push", "rm -rf"],
}


def _rule(key: str, value: str) -> PolicyRule | None:
    try:
        rules = parse_policy(
            f'[[rules]]\n{key} = {json.dumps(value)}\ndecision = "deny"\n'.encode(), "t.toml", ".toml"
        ).rules
    except OpenAgentsError as err:
        assert err.type is ErrorType.CONFIG_INVALID and f"rules[0].{key}" in err.message
        return None
    return rules[0]


def _a_call_it_names(key: str, value: str) -> dict[str, str | None] | None:
    """A call (tool, kind, action, command) the value names, as the product makes them; None if none can."""
    call: dict[str, str | None] = {"tool": "shell", "kind": "execute", "action": "shell", "command": "pytest -x"}
    if value.strip() in ("", "*"):
        return call
    if key == "tool" and (value in known_tools() or mcp_names.could_be_tool_name(value)):
        return {**call, "tool": value}
    if key == "kind" and value in KINDS:
        return {**call, "kind": value}
    if key == "action" and (value in known_actions() or mcp_names.could_be_action(value)):
        return {**call, "action": value}
    if key == "command_prefix":
        return {**call, "command": value}
    return None


@pytest.mark.parametrize("key", sorted(RULE_FORMS))
def test_a_rule_key_validates_exactly_when_some_call_matches_it(key):
    for value in RULE_FORMS[key]:
        rule, call = _rule(key, value), _a_call_it_names(key, value)
        assert (rule is None) == (call is None), (key, value)
        if rule is not None and call is not None:
            assert rule.matches(call["tool"] or "", call["kind"] or "", call["action"] or "", call["command"]), (
                key,
                value,
            )
        if rule is not None and value.strip() in ("", "*"):  # the key filters nothing: as if left out
            assert getattr(rule, key) is None and rule.matches("read_file", "read", "read_file", None)


def test_the_mcp_names_a_rule_accepts_are_the_names_the_client_makes():
    from orchestrator.tools.mcp.client import McpServerSpec, _tool

    servers = ["github", "my server", "ü", "a" * 64, "x-y_z", "__"]
    tools = ["create_issue", "do it", "", "ß" * 10, "t" * 90]
    for server in servers:
        key = McpServerSpec(name=server, command="x").key
        assert mcp_names.could_be_action(mcp_names.action(key))
        for tool in tools:
            made = _tool(key, SimpleNamespace(name=tool, input_schema={"type": "object"}, description="", title=None))
            assert (
                made is not None and mcp_names.could_be_tool_name(made.name) and mcp_names.could_be_action(made.action)
            ), (server, tool)
    for bad in ["mcp__github__*", "mcp__github", "mcp__", "mcp__a b__c", "mcp__x__" + "y" * 60]:
        assert not mcp_names.could_be_tool_name(bad)


# -- through a real session, from every tier ----------------------------------------------------------
