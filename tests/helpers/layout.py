"""What tests/architecture/test_layout.py shares with other tests, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


PACKAGE = ROOT / "orchestrator"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(tree: ast.AST, type_only: bool = True) -> list[ast.stmt]:
    """Every import statement: module level, in functions and classes, in try/with/if, and in the
    body of `if TYPE_CHECKING:` unless `type_only` is False (then only what can run: its else branch)."""
    found: list[ast.stmt] = []

    def visit(node: ast.AST) -> None:
        if not type_only and isinstance(node, ast.If) and _type_checking(node.test):
            for branch in node.orelse:
                visit(branch)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def imports_of(name: str, path: Path, known: dict[str, Path], type_only: bool = True) -> set[str]:
    """The orchestrator modules `name` imports, each as the most specific module the statement names:
    `from .x import y` is `x.y` when that is a module, else `x`; `from . import y` likewise.
    `type_only`: `if TYPE_CHECKING:` imports count too (the structure's reading)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _statements(ast.parse(path.read_text(), str(path)), type_only):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        assert isinstance(node, ast.ImportFrom)
        if node.level:
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        for alias in node.names:
            child = f"{source}.{alias.name}"
            targets.add(child if child in known else source)
    # Importing a.b.c runs a/__init__ and a/b/__init__ first: those count too, but for the packages
    # `name` itself is in (already running when `name` does).
    for target in list(targets):
        parts = target.split(".")
        targets.update(
            ".".join(parts[:i]) for i in range(1, len(parts)) if not f"{name}.".startswith(".".join(parts[:i]) + ".")
        )
    return {t for t in targets if t in known and t != name}


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def knots(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan): each module of one
    reaches every other one of it through imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return components
