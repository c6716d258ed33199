"""Every front-end (cli/, acp/, mcp/, batch/, plugins/) reaches a session through the public API only
(issue 48): an `orchestrator.api.Sandbox` and its documented methods (docs/api.md, "Front-ends").

Read from the source, as tests/test_layering.py reads imports: a front-end module
- imports nothing of the session's machinery (session.py, pipeline.py: the API assembles and
  drives them), and from api/ only names its modules export (no `_private` name);
- touches no session part by attribute (`.parts`, `.record_call`, `.pipeline`, `.turn_loop`,
  `.checkpoints` of an open session) and no private attribute (`x._name`) of anything but itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.layout import PACKAGE

FRONT_ENDS = ("cli", "acp", "mcp", "batch", "plugins")
MACHINERY = frozenset({"session", "pipeline"})  # modules at the package root a front-end never imports
SESSION_PARTS = frozenset({"parts", "record_call", "pipeline", "turn_loop", "open_session"})
OWN = frozenset({"self", "cls"})


def _module(node: ast.ImportFrom, path: Path) -> list[str]:
    """The module an import names, as parts under orchestrator/ (relative imports resolved)."""
    here = list(path.relative_to(PACKAGE).with_suffix("").parts)[:-1] if node.level else []
    if node.level > 1:
        here = here[: len(here) - (node.level - 1)]
    named = (node.module or "").split(".") if node.module else []
    if not node.level:
        if named[:1] != ["orchestrator"]:
            return []
        named = named[1:]
    return here + named


def violations(source: str, path: Path) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = _module(node, path)
            if module[:1] and module[0] in MACHINERY:
                found.append(f"line {node.lineno}: imports {'.'.join(module)} (the session's machinery)")
            if module[:1] == ["api"]:
                found += [
                    f"line {node.lineno}: imports {alias.name} from {'.'.join(module)} (a private name)"
                    for alias in node.names
                    if alias.name.startswith("_")
                ]
        elif isinstance(node, ast.Attribute):
            if node.attr in SESSION_PARTS:
                found.append(f"line {node.lineno}: .{node.attr} (a part of the session, not its API)")
            elif (
                node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in OWN)
            ):
                found.append(f"line {node.lineno}: ._{node.attr[1:]} of another object")
    return found


def test_the_check_sees_each_way_in():
    here = PACKAGE / "cli" / "x.py"
    assert violations("from ..session import open_session\n", here) == [
        "line 1: imports session (the session's machinery)"
    ]
    assert violations("from orchestrator.pipeline import CallPipeline\n", here)
    assert violations("box.parts.pipeline.gate\n", here) == [
        "line 1: .pipeline (a part of the session, not its API)",
        "line 1: .parts (a part of the session, not its API)",
    ]
    assert violations("box.record_call('shell', True)\nbox._live()\n", here) == [
        "line 1: .record_call (a part of the session, not its API)",
        "line 2: ._live of another object",
    ]
    assert violations("from ..api.sandbox import _helper\n", here)
    assert not violations("from ..api import Sandbox\nbox.run_turns('t')\nself._lock\nos.__name__\n", here)


def test_no_front_end_uses_anything_but_the_public_api():
    bad = {}
    for part in FRONT_ENDS:
        for path in sorted((PACKAGE / part).rglob("*.py")):
            found = violations(path.read_text(), path)
            if found:
                bad[str(path.relative_to(PACKAGE))] = found
    assert not bad, f"front-ends reaching past the public API (docs/api.md, 'Front-ends'): {bad}"


# What lands a copy's changes, or moves its record or manifest on: only api/sessions.py `land` (its one
# route, workspace/copy_session.py land_copy) and the pipeline's apply_changes call reach these.
LANDING = frozenset({"land_copy", "apply_session", "apply_scanned", "apply_changes", "move_on", "mark_landed"})


def landings(source: str) -> list[str]:
    """Each import or call of the landing's machinery in a front-end's source (issue 48: no front-end
    lands on its own)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            found += [f"line {node.lineno}: imports {a.name}" for a in node.names if a.name in LANDING]
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in LANDING:
                found.append(f"line {node.lineno}: calls {name}")
    return found


def test_the_landing_check_sees_a_landing():
    assert landings("from ..workspace.review import apply_scanned, shown\n") == ["line 1: imports apply_scanned"]
    assert landings("x = review.apply_changes(manifest)\n") == ["line 1: calls apply_changes"]
    assert not landings("from ..api.sessions import land\nland(record, 'oa-sandbox apply')\n")


def test_no_front_end_lands_on_its_own():
    """Every landing goes through the session's public API (api/sessions.py land, or Sandbox.apply's
    pipeline call): one decision from the session's policy, one sanitiser through boxfs."""
    bad = {}
    for part in FRONT_ENDS:
        for path in sorted((PACKAGE / part).rglob("*.py")):
            found = landings(path.read_text())
            if found:
                bad[str(path.relative_to(PACKAGE))] = found
    assert not bad, f"front-ends landing on their own (use api/sessions.py land): {bad}"
