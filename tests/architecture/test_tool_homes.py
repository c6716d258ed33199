"""Issue 25's rule for tools: a tool's identity lives in its own file under orchestrator/tools/defs/;
no other product file names a tool (the registry, declarations, front-end lists, approvals, the
sandbox supervisor and the workspace code read it from the catalog)."""

from __future__ import annotations

import ast
from pathlib import Path

from orchestrator.tools import catalog

ROOT = Path(__file__).resolve().parents[2]


def named_tools(path: Path) -> list[tuple[int, str]]:
    """String constants equal to a tool's name (docstrings and comments are prose, not names)."""
    names = set(catalog.TOOLS)
    tree = ast.parse(path.read_text(), str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
    ]


# Words that are a tool's name and also something else: the git program in a shell command line; the
# API's `git` keyword (SandboxOptions.git, the CLI's --no-git) in the table of flags to keywords.
# "git" as a program's name, not the tool: a command prefix, the API's keyword, Debian's package in the image
NOT_TOOLS = {
    "orchestrator/policy/prefix.py": {"git"},
    "orchestrator/api/options.py": {"git"},
    "orchestrator/sandbox/packages.py": {"git"},
}


def test_no_product_file_but_a_tools_own_names_a_tool():
    defs = ROOT / "orchestrator" / "tools" / "defs"
    found = {}
    for path in sorted((ROOT / "orchestrator").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        hits = [hit for hit in named_tools(path) if hit[1] not in NOT_TOOLS.get(rel, set())]
        if defs not in path.parents and hits:
            found[rel] = hits
    assert found == {}, f"tool names outside tools/defs/: {found}"


def test_the_check_sees_a_name(tmp_path):
    """The scan above finds a tool named in code (so an empty answer means something)."""
    planted = tmp_path / "m.py"
    planted.write_text('"""shell is mentioned in prose."""\nTOOLS = {"shell", "read_file"}\n')
    assert sorted(name for _, name in named_tools(planted)) == ["read_file", "shell"]
