"""Front-ends use the API and other modules' public names only (issue 34): no `from x import _y`,
no `module._y` through an imported module, in the CLI, MCP, ACP, batch and the API itself."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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
        elif isinstance(
            node, ast.Import
        ):  # the project's modules only: the standard library's _names are its own business
            modules.update(
                (alias.asname or alias.name).split(".")[0]
                for alias in node.names
                if alias.name.startswith("orchestrator")
            )
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_the_check_sees_private_reaches():
    assert sorted(
        private_reaches("from ..session import _model\nimport os\nos._exit(0)\nfrom . import ev\nev._ADAPTER\n")
    ) == ["ev._ADAPTER", "from ..session import _model"]
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


def session_openers(source: str) -> list[str]:
    """Where a module calls or imports session.open_session (by name, as an attribute, or imported)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "open_session" for alias in node.names):
            found.append(f"line {node.lineno}: from {node.module} import open_session")
        elif isinstance(node, ast.Attribute) and node.attr == "open_session":
            found.append(f"line {node.lineno}: .open_session")
        elif isinstance(node, ast.Name) and node.id == "open_session":
            found.append(f"line {node.lineno}: open_session")
    return found


def test_the_check_sees_a_session_opened_by_hand():
    assert len(session_openers("from ..session import SessionOptions, open_session\nopen_session(o, ws)\n")) == 2
    assert session_openers("from .. import session\nsession.open_session(o)\n") == ["line 2: .open_session"]
    assert session_openers("from ..api import Sandbox\nSandbox(ws).open()\n") == []


def test_only_the_api_opens_a_session():
    """Issue 34: a session's life cycle (start, sweep, checkpoint, record, close, Ctrl-C) is written
    once, in orchestrator/api/ (Sandbox); every front-end (run, exec, mcp, acp, batch, --attempts,
    the harness plug-ins) opens an orchestrator.api.Sandbox, never session.open_session itself."""
    found = {}
    for path in sorted((ROOT / "orchestrator").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("orchestrator/api/") or rel.startswith("orchestrator/session/"):
            continue
        openers = session_openers(path.read_text())
        if openers:
            found[rel] = openers
    assert not found, f"sessions opened beside the API: {found}"


def test_every_front_end_opens_an_api_sandbox():
    """The other half: each front-end's module does build its session on the API's Sandbox."""
    for rel in (
        "orchestrator/cli/run.py",
        "orchestrator/cli/servers.py",
        "orchestrator/api/attempts.py",
        "orchestrator/batch/runner.py",
    ):
        tree = ast.parse((ROOT / rel).read_text())  # api/attempts.py: the best-of-N of `run --attempts` and `batch`
        imported = any(
            isinstance(node, ast.ImportFrom)
            and (node.module, node.level) in (("api", 2), ("sandbox", 1))
            and any(alias.name == "Sandbox" for alias in node.names)
            for node in ast.walk(tree)
        )
        built = any(
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Sandbox"
            for node in ast.walk(tree)
        )
        assert imported and built, rel
