"""No dead weight in the product (issue 36, point 5): every top-level name of orchestrator/ and
sandbox_agent/ is used somewhere else (product, tests, bench, scripts), and no function or class
goes by a second module-level name (an alias hides who calls what). Decorated definitions (click
commands, registered by their decorator) are used by being defined. Constants may name another
constant: EXIT_TOOL_ERROR = EXIT_STOPPED says what the code means there."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("orchestrator", "sandbox_agent")
USERS = (*PRODUCT, "tests", "bench", "scripts", "compose")


def _sources(dirs: tuple[str, ...]) -> dict[Path, str]:
    return {p: p.read_text(encoding="utf-8") for d in dirs for p in sorted((ROOT / d).rglob("*.py"))}


def test_every_top_level_name_is_used_somewhere_else() -> None:
    sources = _sources(USERS)
    words = Counter(w for text in sources.values() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
    unused = []
    for path, text in sources.items():
        if path.relative_to(ROOT).parts[0] not in PRODUCT:
            continue
        for node in ast.parse(text).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.decorator_list:
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            else:
                continue
            unused += [
                f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if not n.startswith("__") and words[n] <= 1
            ]
    assert unused == []


def test_no_function_or_class_has_a_second_name() -> None:
    aliases = []
    for path, text in _sources(PRODUCT).items():
        tree = ast.parse(text)
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        imported = {
            (a.asname or a.name).split(".")[0]
            for n in tree.body
            if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in n.names
        }
        for node in tree.body:
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
                continue
            target, value = node.targets[0].id, node.value
            if target.isupper():
                continue  # a constant naming another constant
            if isinstance(value, ast.Name) and value.id in defined | imported and not value.id.isupper():
                aliases.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
            elif (
                isinstance(value, ast.Attribute)
                and isinstance(value.value, ast.Name)
                and value.value.id in imported
                and not value.attr.isupper()
            ):
                aliases.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert aliases == []
