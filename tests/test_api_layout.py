"""Front-ends use the API and other modules' public names only (issue 34): no `from x import _y`,
no `module._y` through an imported module, in the CLI, MCP, ACP, batch and the API itself."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Reaches found when this check was written and left for the lead to decide; none today (the MCP
# client's reach into the declarations' schema cleaner became public: tools/declarations.clean_schema).
KNOWN: dict[str, list[str]] = {}
FRONT_ENDS = ("orchestrator/api", "orchestrator/cli", "orchestrator/mcp", "orchestrator/acp", "orchestrator/batch")


def private_reaches(source: str) -> list[str]:
    tree = ast.parse(source)
    modules: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"from {'.' * node.level}{node.module or ''} import {alias.name}")
                elif node.level or (node.module or "").startswith("orchestrator"):
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):  # the project's modules only: the standard library's _names are its own business
            modules.update((alias.asname or alias.name).split(".")[0] for alias in node.names if alias.name.startswith("orchestrator"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name) and node.value.id in modules):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_the_check_sees_private_reaches():
    assert sorted(private_reaches("from ..session import _model\nimport os\nos._exit(0)\nfrom . import ev\nev._ADAPTER\n")) == [
        "ev._ADAPTER", "from ..session import _model"]
    assert private_reaches("from .x import y\nclass A:\n    def f(self):\n        return self._z\n") == []


def test_no_front_end_reaches_another_modules_private_names():
    found = {}
    for folder in FRONT_ENDS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            reaches = private_reaches(path.read_text())
            known = KNOWN.get(str(path.relative_to(ROOT)), [])
            reaches = [r for r in reaches if r not in known]
            if reaches:
                found[str(path.relative_to(ROOT))] = reaches
    assert not found, f"front-ends reaching private names: {found}"
