"""The shape of orchestrator/, checked from its source: no import circles, a root that stays small,
no product file past 600 lines (issue 25). A circle is what makes a module's meaning depend on who
imported first, and what lets a "lazy" import inside a function hide a dependency that runs
backwards; so imports inside functions count here, only `if TYPE_CHECKING:` blocks do not (they
never run)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "orchestrator"
MAX_ROOT_MODULES = 12
MAX_LINES = 600
PRODUCT_DIRS = ("orchestrator", "sandbox_agent", "compose")


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


def _statements(tree: ast.AST) -> list[ast.stmt]:
    """Every import statement that can run: module level, in functions and classes, in try/with/if,
    but not in the body of `if TYPE_CHECKING:` (its else branch runs, so it counts)."""
    found: list[ast.stmt] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node.test):
            for branch in node.orelse:
                visit(branch)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The orchestrator modules `name` imports, each as the most specific module the statement names:
    `from .x import y` is `x.y` when that is a module, else `x`; `from . import y` likewise."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _statements(ast.parse(path.read_text(), str(path))):
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


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One concrete circle through each knot, so that a failure names the imports to cut."""
    return [_circle(graph, set(knot), knot[0]) for knot in knots(graph)]


def _circle(graph: dict[str, set[str]], component: set[str], start: str) -> list[str]:
    """A shortest path from `start` back to itself inside its component (breadth first)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if nxt not in previous:
                    previous[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{start} is in no circle")


def test_no_import_circles() -> None:
    graph = import_graph()
    found = [
        f"{' -> '.join(_circle(graph, set(knot), knot[0]))}  (the knot: {', '.join(knot)})" for knot in knots(graph)
    ]
    assert not found, "import circles in orchestrator/:\n" + "\n".join(found)


def test_the_circle_finder_finds_circles() -> None:
    """The check above, on graphs whose answer is known (a finder that sees nothing would pass it)."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}) == [["a", "b", "a"], ["c", "d", "c"]]


def test_imports_are_read_as_they_run(tmp_path: Path) -> None:
    """Relative forms, imports inside functions, and TYPE_CHECKING blocks, on a module written here."""
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "from .sibling import NAME\n"
        "from ..up import thing\n"
        "if TYPE_CHECKING:\n"
        "    from .hidden import T\n"
        "else:\n"
        "    from .shown import T\n"
        "def f():\n"
        "    import pkg.sub.late\n"
        "    from .sibling import later\n"
    )
    known = {
        name: source
        for name in (
            "pkg.sub.m",
            "pkg.sub.sibling",
            "pkg.up",
            "pkg.up.thing",
            "pkg.sub.hidden",
            "pkg.sub.shown",
            "pkg.sub.late",
            "pkg.sub.sibling.later",
        )
    }
    assert imports_of("pkg.sub.m", source, known) == {
        "pkg.sub.sibling",
        "pkg.up",
        "pkg.up.thing",
        "pkg.sub.shown",
        "pkg.sub.late",
        "pkg.sub.sibling.later",
    }


def test_the_root_stays_small() -> None:
    """The root holds the session's assembly and the types every part shares; a concept gets a folder."""
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, (
        f"{len(root)} modules at the root of orchestrator/ (at most {MAX_ROOT_MODULES}): {root}"
    )


def _product_files() -> dict[str, int]:
    return {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines())
        for d in PRODUCT_DIRS
        for p in sorted((ROOT / d).rglob("*.py"))
    }


def test_no_product_file_over_600_lines() -> None:
    lengths = _product_files()
    assert len(lengths) > 50 and "orchestrator/session.py" in lengths  # the scan sees the product
    over = {path: n for path, n in lengths.items() if n > MAX_LINES}
    assert not over, f"product files over {MAX_LINES} lines: {over}"
