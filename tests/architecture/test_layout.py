"""The shape of orchestrator/, checked from its source: no import circles, a root that stays small,
no product file past 600 lines (issue 25). A circle is what makes a module's meaning depend on who
imported first, and what lets a "lazy" import inside a function hide a dependency that runs
backwards; so imports inside functions count here, and so do `if TYPE_CHECKING:` blocks (issue 48):
they never run, but a reader follows a type to where it lives as surely as a call, so a type-only
import that runs backwards is a circle all the same."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.layout import (
    PACKAGE,
    ROOT,
    import_graph,
    imports_of,
    knots,
)

MAX_ROOT_MODULES = 12
MAX_LINES = 600
PRODUCT_DIRS = ("orchestrator", "sandbox_agent", "compose")


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
    """Relative forms, imports inside functions, and TYPE_CHECKING blocks (both readings), on a module written here."""
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
    running = {
        "pkg.sub.sibling",
        "pkg.up",
        "pkg.up.thing",
        "pkg.sub.shown",
        "pkg.sub.late",
        "pkg.sub.sibling.later",
    }
    assert imports_of("pkg.sub.m", source, known, type_only=False) == running
    assert imports_of("pkg.sub.m", source, known) == running | {"pkg.sub.hidden"}


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
    assert len(lengths) > 50 and "orchestrator/session/assemble.py" in lengths  # the scan sees the product
    over = {path: n for path, n in lengths.items() if n > MAX_LINES}
    assert not over, f"product files over {MAX_LINES} lines: {over}"
