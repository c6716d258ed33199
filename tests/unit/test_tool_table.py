"""Issue 36 point 4: the agent's tool table (sandbox_agent/table.py) and the host's catalog
(orchestrator/tools/defs/) list the same box tools with the same bounds; the model is told the
bounds the host declares; and the agent, run for real (a local subprocess on a temporary
workspace, speaking its stdio protocol), keeps the bounds its table states."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Mapping

import pytest

from orchestrator.protocol import DEFAULT_RULE, BoxCall, BoxRule
from orchestrator.tools import catalog
from orchestrator.tools.declarations import base_declaration
from sandbox_agent import table

ROOT = Path(__file__).resolve().parents[2]


def mismatches(agent: Mapping[str, tuple[str, str, Mapping[str, int]]], host: Mapping[str, Any]) -> list[str]:
    """Every difference between the agent's table and the host's box tools: a tool on one side only,
    a bound missing on one side or of another value."""
    box = {name: tool for name, tool in host.items() if tool.side == "sandbox"}
    found = [
        f"{name}: in the agent's table, not a box tool of the host's catalog"
        for name in sorted(agent.keys() - box.keys())
    ]
    found += [
        f"{name}: a box tool of the host's catalog, not in the agent's table"
        for name in sorted(box.keys() - agent.keys())
    ]
    for name in sorted(agent.keys() & box.keys()):
        theirs, ours = dict(agent[name][2]), dict(box[name].bounds)
        found += [
            f"{name}.{bound}: agent {theirs.get(bound)}, host {ours.get(bound)}"
            for bound in sorted(theirs.keys() | ours.keys())
            if theirs.get(bound) != ours.get(bound)
        ]
    return found


def test_the_agent_and_the_host_list_the_same_box_tools_with_the_same_bounds() -> None:
    assert mismatches(table.TOOLS, catalog.TOOLS) == []
    assert {n for n, t in catalog.TOOLS.items() if t.side == "host"}.isdisjoint(table.TOOLS)


def test_the_comparison_fails_when_either_side_adds_drops_or_changes() -> None:
    agent = dict(table.TOOLS)
    extra = {**agent, "fetch_url": ("fetching", "fetch_url", {"max_bytes": 1})}
    assert mismatches(extra, catalog.TOOLS) == ["fetch_url: in the agent's table, not a box tool of the host's catalog"]
    dropped = {k: v for k, v in agent.items() if k != "shell"}
    assert mismatches(dropped, catalog.TOOLS) == ["shell: a box tool of the host's catalog, not in the agent's table"]
    module, function, bounds = agent["read_file"]
    changed = {**agent, "read_file": (module, function, {**bounds, "read_cap_bytes": 1024})}
    assert mismatches(changed, catalog.TOOLS) == [
        f"read_file.read_cap_bytes: agent 1024, host {bounds['read_cap_bytes']}"
    ]
    fewer = {**agent, "read_file": (module, function, {"read_cap_bytes": bounds["read_cap_bytes"]})}
    assert mismatches(fewer, catalog.TOOLS) == [f"read_file.default_lines: agent None, host {bounds['default_lines']}"]


def test_each_box_tool_carries_the_rule_its_agent_states() -> None:
    """How the box runs a call (protocol.BoxRule) is stated once, by the agent's table (RULES); each box
    tool's declaration carries it, and a request by name (the program's own, a self-check) gets the same."""
    assert set(table.RULES) <= set(table.TOOLS) | set(table.OPS)
    for name, tool in catalog.TOOLS.items():
        if tool.side == "sandbox":
            assert tool.box == BoxRule.of_agent(name) == BoxCall.named(name, {}).rule, name
    shell = catalog.TOOLS["shell"].box
    assert (shell.exclusive, shell.streams, shell.writes, shell.spawns) == (True, True, True, True)
    assert catalog.TOOLS["write_file"].box == BoxRule(writes=True) and catalog.TOOLS["read_file"].box == DEFAULT_RULE
    # the program's own operations: the default, but a background process's start spawns (it stays in the box)
    assert BoxCall.named("proc_read", {}).rule == DEFAULT_RULE
    assert BoxCall.named("proc_start", {}).rule == BoxRule(spawns=True)
    from orchestrator.api.box_processes import SPECS

    assert SPECS["process_start"][0].box == BoxRule(spawns=True)
    assert SPECS["process_read"][0].box == DEFAULT_RULE


def test_the_sandbox_layer_knows_no_tool() -> None:
    """sandbox/ runs what a call's rule says (protocol.BoxCall): nothing there imports tools/, type-only
    imports included, so no name can be looked up there again."""
    from tests.helpers.layout import import_graph

    graph = import_graph()
    found = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith("orchestrator.sandbox")
        for target in targets
        if target.startswith("orchestrator.tools")
    )
    assert any(m.startswith("orchestrator.sandbox.") for m in graph)  # the check sees the sandbox layer
    assert found == []


def test_every_table_entry_names_a_function_of_the_agent() -> None:
    import importlib

    for name, (module, function, _) in table.TOOLS.items():
        assert callable(getattr(importlib.import_module(f"sandbox_agent.{module}"), function)), name


def _decl(name: str) -> dict[str, Any]:
    return base_declaration(name)


def test_the_model_is_told_the_bounds_the_host_declares() -> None:
    """What the declarations say (descriptions, schema defaults and maxima) is the declared bounds."""
    bounds = {name: tool.bounds for name, tool in catalog.TOOLS.items()}
    read, listing, grep = _decl("read_file"), _decl("list_files"), _decl("grep_files")
    write, edit, shell = _decl("write_file"), _decl("edit_file"), _decl("shell")
    assert f"{bounds['read_file']['read_cap_bytes'] // 1024} KiB" in read["description"]
    assert read["parameters"]["properties"]["limit"]["default"] == bounds["read_file"]["default_lines"]
    assert f"at most {bounds['list_files']['max_entries']} entries" in listing["description"]
    assert f"at most {bounds['grep_files']['max_lines']} matching lines" in grep["description"]
    assert write["parameters"]["properties"]["content"]["maxLength"] == bounds["write_file"]["max_bytes"]
    for arg in ("old_text", "new_text"):
        assert edit["parameters"]["properties"][arg]["maxLength"] == bounds["edit_file"]["max_file_bytes"]
    timeout = shell["parameters"]["properties"]["timeout"]
    assert timeout["default"] == bounds["shell"]["timeout_default_s"]
    assert f"clamped to {bounds['shell']['timeout_max_s']}" in timeout["description"]
    assert (
        f"Default timeout {bounds['shell']['timeout_default_s']}s, at most {bounds['shell']['timeout_max_s']}s"
        in shell["description"]
    )
    rule = catalog.TOOLS["shell"].box
    assert rule.deadline({"timeout": 10**6}) == bounds["shell"]["timeout_max_s"]  # the host's clock agrees
    assert rule.deadline({"timeout": "x"}) == bounds["shell"]["timeout_default_s"]  # raw arguments: the default
    assert catalog.TOOLS["read_file"].box.deadline({"timeout": 5}) is None  # the fixed per-call deadline


class _Agent:
    """The real agent as a local child process (test-only: no isolation) on `workspace`."""

    def __init__(self, workspace: Path) -> None:
        env = {"PATH": os.environ["PATH"], "OA_AGENT_WORKSPACE": str(workspace), "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sandbox_agent"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=workspace,
            env=env,
            start_new_session=True,
        )
        self.next_id = 0

    def call(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.next_id += 1
        self.proc.stdin.write(json.dumps({"v": 1, "id": self.next_id, "tool": tool, "args": args}).encode() + b"\n")
        self.proc.stdin.flush()
        while True:
            message = json.loads(self.proc.stdout.readline())
            if message.get("id") == self.next_id and "ok" in message:
                return message

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[_Agent, Path]]:
    running = _Agent(tmp_path)
    yield running, tmp_path
    running.close()


def test_the_agent_keeps_the_bounds_its_table_states(agent: tuple[_Agent, Path]) -> None:
    box, ws = agent
    b = {name: entry[2] for name, entry in table.TOOLS.items()}

    (ws / "long.txt").write_text(("x" * 99 + "\n") * (4 * b["read_file"]["read_cap_bytes"] // 100))
    read = box.call("read_file", {"path": "long.txt"})
    assert read["ok"] and read["meta"]["truncated"]
    assert b["read_file"]["read_cap_bytes"] - 100 < len(read["output"].encode()) <= b["read_file"]["read_cap_bytes"]
    (ws / "lines.txt").write_text("a\n" * (b["read_file"]["default_lines"] + 10))
    assert box.call("read_file", {"path": "lines.txt"})["meta"]["last_line"] == b["read_file"]["default_lines"]

    (ws / "many").mkdir()
    for i in range(b["list_files"]["max_entries"] + 5):
        (ws / "many" / f"f{i}").touch()
    listing = box.call("list_files", {"path": "many"})
    assert (listing["meta"]["entries"], listing["meta"]["truncated"]) == (b["list_files"]["max_entries"], True)

    (ws / "hits.txt").write_text(
        "hit " + "y" * (b["grep_files"]["line_chars"] + 50) + "\n" + "hit\n" * b["grep_files"]["max_lines"]
    )
    grep = box.call("grep_files", {"pattern": "hit", "path": "hits.txt"})
    assert (grep["meta"]["matches"], grep["meta"]["truncated"], grep["meta"]["lines_cut"]) == (
        b["grep_files"]["max_lines"],
        True,
        1,
    )
    assert (
        "y" * b["grep_files"]["line_chars"] not in grep["output"]
        and "y" * (b["grep_files"]["line_chars"] - 10) in grep["output"]
    )

    too_big = box.call("write_file", {"path": "big.txt", "content": "a" * (b["write_file"]["max_bytes"] + 1)})
    assert too_big["error"]["type"] == "file_too_large" and not (ws / "big.txt").exists()
    (ws / "huge.txt").write_bytes(b"a" * (b["edit_file"]["max_file_bytes"] + 1))
    assert (
        box.call("edit_file", {"path": "huge.txt", "old_text": "a", "new_text": "b"})["error"]["type"]
        == "file_too_large"
    )

    assert box.call("shell", {"command": "true"})["meta"]["timeout_s"] == b["shell"]["timeout_default_s"]
    assert box.call("shell", {"command": "true", "timeout": 10**6})["meta"]["timeout_s"] == b["shell"]["timeout_max_s"]
    head, tail = b["shell"]["output_head_bytes"], b["shell"]["output_tail_bytes"]
    loud = box.call("shell", {"command": f"yes 0123456789abcdef | head -c {4 * (head + tail)}"})
    assert loud["meta"]["output_truncated"] and loud["meta"]["output_cap_bytes"] == head + tail
    assert (
        head + tail - 200 < len(loud["output"].encode()) < head + tail + 400
    )  # the two kept ends and the marker between
