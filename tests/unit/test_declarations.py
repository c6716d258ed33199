"""The exact declarations each model family receives, snapshotted. Rewrite the snapshots on
purpose with UPDATE_SNAPSHOTS=1 and review the diff."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.tools.declarations import FAMILIES, declarations
from orchestrator.tools.registry import SPECS

SNAPSHOTS = Path(__file__).parent / "snapshots"
TOOLS = ["read_file", "list_files", "grep_files", "write_file", "edit_file", "shell", "git"]


@pytest.mark.parametrize("family", FAMILIES)
def test_declarations_match_the_snapshot(family):
    current = declarations(TOOLS, family)
    path = SNAPSHOTS / f"declarations_{family}.json"
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        path.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    assert current == json.loads(path.read_text())


def test_gemini_schema_uses_its_own_dialect():
    text = json.dumps(declarations(TOOLS, "gemini"))
    assert "additionalProperties" not in text and '"type": "string"' not in text and '"type": "STRING"' in text


def test_openai_schema_forbids_extra_fields_and_states_bounds():
    by_name = {d["function"]["name"]: d["function"] for d in declarations(TOOLS, "openai")}
    assert set(by_name) == set(TOOLS)
    for decl in by_name.values():
        assert decl["parameters"]["additionalProperties"] is False
    assert "48 KiB" in by_name["read_file"]["description"]
    assert "240s" in by_name["shell"]["description"] and "60s" in by_name["shell"]["description"]
    assert by_name["edit_file"]["parameters"]["required"] == ["path", "old_text", "new_text"]


def test_every_sandbox_tool_has_the_spec_kind():
    kinds = {n: s.kind for n, s in SPECS.items() if s.side == "sandbox"}
    assert kinds == {
        "read_file": "read",
        "list_files": "read",
        "grep_files": "search",
        "write_file": "edit",
        "edit_file": "edit",
        "shell": "execute",
    }


def test_anthropic_declarations_are_the_messages_api_tool_shape():
    """name, description, input_schema (JSON Schema, as OpenAI's parameters): nothing else."""
    anthropic = declarations(TOOLS, "anthropic")
    openai = {d["function"]["name"]: d["function"] for d in declarations(TOOLS, "openai")}
    for decl in anthropic:
        assert set(decl) == {"name", "description", "input_schema"}
        assert decl["input_schema"] == openai[decl["name"]]["parameters"] and decl["input_schema"]["type"] == "object"
