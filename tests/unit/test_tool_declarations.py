"""Issue 36 point 4: a tool's declaration (orchestrator/tools/tooldef.py ToolDef) is data, valid
alone: no sandbox, session or model is needed to check it; its invocation (ToolDef.validate, then
PreparedCall/ToolDef.execute) is built from it and runs against what it is given."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.protocol import BoxCall, BoxRule, ToolResult
from orchestrator.tools import catalog
from orchestrator.tools.declarations import base_declaration
from orchestrator.tools.tooldef import DEFAULT_RULE, KINDS, RunContext, ToolDef

ROOT = Path(__file__).resolve().parents[2]
TOOLS = list(catalog.TOOLS.values())


def problems(tool: ToolDef) -> list[str]:
    """What is wrong with a declaration as data: every reference it makes points at something it has."""
    found: list[str] = []
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", tool.name):
        found.append(f"name {tool.name!r} is not a model-safe identifier")
    if tool.kind not in KINDS:
        found.append(f"kind {tool.kind!r} is not one of ACP's")
    if tool.side not in ("sandbox", "host"):
        found.append(f"side {tool.side!r}")
    if not tool.description or not tool.title or tool.args is None:
        return [*found, "no description, title or argument model"]
    schema = base_declaration(tool.name)["parameters"] if tool.name in catalog.TOOLS else tool.args.model_json_schema()
    props = set(schema.get("properties", {}))
    if schema.get("type") != "object" or schema.get("additionalProperties") is not False:
        found.append("the schema is not a closed object")
    for what, arg in (
        ("files.line_arg", tool.files.line_arg),
        ("files.match_arg", tool.files.match_arg),
        ("approval.command_arg", tool.approval.command_arg),
    ):
        if arg is not None and arg not in props:
            found.append(f"{what} {arg!r} is not an argument")
    if (tool.files.path_arg or tool.files.path_may_be_directory or tool.files.replaces_file) and "path" not in props:
        found.append("says it takes a path but has no path argument")
    if tool.files.path_may_be_directory and not tool.files.path_arg:
        found.append("path_may_be_directory without path_arg")
    if tool.files.replaces_file and (tool.files.propose is None or not tool.mutates):
        found.append("replaces a file without a preview, or without mutating")
    if any(kind not in KINDS for kind in tool.approval.actions.values()):
        found.append("an action's kind is not one of ACP's")
    if bool(tool.approval.actions) != (tool.approval.action_of is not None):
        found.append("actions and action_of come together")
    if tool.side == "sandbox":
        if tool.run is not None or tool.needs_repo:
            found.append("a box tool runs in the box: no host run, no host repository")
        if not tool.bounds:
            found.append("a box tool states the bounds its agent enforces")
    elif tool.run is None or tool.box != DEFAULT_RULE or tool.bounds:
        found.append("a host tool has its own run and no box rule or box bounds")
    if any(not isinstance(v, int) or isinstance(v, bool) or v <= 0 for v in tool.bounds.values()):
        found.append("a bound is not a positive integer")
    if tool.box.writes and not tool.mutates:
        found.append("grows the workspace but is not said to mutate it")
    if tool.mcp.served and not tool.mcp.output_doc:
        found.append("served over MCP without saying what its output holds")
    return found


@pytest.mark.parametrize("tool", TOOLS, ids=[t.name for t in TOOLS])
def test_each_declaration_is_valid_data_alone(tool: ToolDef) -> None:
    assert problems(tool) == []
    with pytest.raises(dataclasses.FrozenInstanceError):
        tool.name = "other"  # type: ignore[misc]
    for part in (tool.box, tool.approval, tool.files, tool.mcp):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(part, dataclasses.fields(part)[0].name, None)


def test_the_check_sees_a_broken_declaration() -> None:
    """The checks above find planted faults, so an empty answer means something."""
    good = catalog.TOOLS["edit_file"]
    assert problems(good) == []
    broken = [
        dataclasses.replace(good, kind="write"),
        dataclasses.replace(good, files=dataclasses.replace(good.files, match_arg="old")),
        dataclasses.replace(good, files=dataclasses.replace(good.files, propose=None)),
        dataclasses.replace(good, bounds={}),
        dataclasses.replace(good, bounds={"max_file_bytes": 0}),
        dataclasses.replace(good, side="host"),
        dataclasses.replace(good, mutates=False),
    ]
    for tool in broken:
        assert problems(tool), tool


def test_declarations_load_without_a_sandbox_session_or_front_end() -> None:
    """The catalog is data: importing it starts nothing and pulls in no sandbox, Docker, session,
    loop, model client or front-end code (a fresh interpreter, so other tests' imports do not count).
    models/base.py, the model-neutral call type and the one argument parser beneath tools/
    (docs/architecture.md), is data too: it alone of models/ may load."""
    code = (
        "import sys; import orchestrator.tools.catalog as c; assert c.TOOLS; print(' '.join(m for "
        "m in sys.modules if m.split('.')[0] == 'docker' or (m.split('.')[:2] in (['orchestrator', "
        "p] for p in ('sandbox', 'session', 'loop', 'pipeline', 'acp', 'mcp', 'cli', 'api', "
        "'models')) and m not in ('orchestrator.models', 'orchestrator.models.base'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == ""


def test_validation_builds_the_invocation_without_running_anything() -> None:
    read = catalog.TOOLS["read_file"].validate('{"path": "src/a.py", "offset": 3}')
    assert (read.kind, read.action, read.args.model_dump()) == (
        "read",
        "read_file",
        {"path": "src/a.py", "offset": 3, "limit": 2000},
    )
    commit = catalog.TOOLS["git"].validate({"subcommand": "commit", "message": "m"})
    assert (commit.kind, commit.action) == ("edit", "git commit")
    with pytest.raises(OpenAgentsError) as bad:
        catalog.TOOLS["shell"].validate({"command": "ls", "cwd": "/"})
    assert bad.value.type == ErrorType.INVALID_ARGUMENTS
    with pytest.raises(OpenAgentsError) as outside:
        catalog.TOOLS["write_file"].validate({"path": "../x", "content": ""})
    assert outside.value.type == ErrorType.PATH_OUTSIDE_WORKSPACE


class _Box:
    """What an invocation needs of a sandbox (tooldef.BoxCaller): the request it was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any], bool]] = []
        self.rules: list[BoxRule] = []

    def run(self, call: BoxCall, on_output: Callable[[str], None] | None = None) -> ToolResult:
        self.sent.append((call.tool, call.args, on_output is not None))
        self.rules.append(call.rule)
        return ToolResult(ok=True, output="done")


def test_an_invocation_runs_in_the_box_its_declaration_names() -> None:
    box, seen = _Box(), list[str]()
    context = RunContext(sandbox=box, on_output=seen.append)
    for name, raw in (("shell", {"command": "ls"}), ("read_file", {"path": "a"})):
        tool = catalog.TOOLS[name]
        assert tool.execute(context, tool.validate(raw).args).output == "done"
    assert box.sent == [
        ("shell", {"command": "ls", "timeout": 60}, True),
        ("read_file", {"path": "a", "offset": 1, "limit": 2000}, False),
    ]
    # each call carries its declaration's rule to the box: the sandbox never looks a tool up by name
    assert box.rules == [catalog.TOOLS["shell"].box, catalog.TOOLS["read_file"].box]
    assert box.rules[0].streams and box.rules[0].timeout_arg == "timeout" and box.rules[1] == DEFAULT_RULE
    with pytest.raises(OpenAgentsError) as nowhere:  # a box tool given no box
        catalog.TOOLS["list_files"].execute(RunContext(), catalog.TOOLS["list_files"].validate({}).args)
    assert nowhere.value.type == ErrorType.INTERNAL_ERROR
