"""`.gitignore` in the checkpoints (ignore.py): what it names is listed as skipped, never silently
left out; the file is the box's data, read through boxfs and parsed and matched within bounds."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from orchestrator.workspace.checkpoints import CheckpointStore
from orchestrator.workspace.checkpoints.ignore import IGNORE_CAP, IGNORED, ignored, parse
from tests.helpers import make_workspace

RULES = b"# comment\n\n*.log\n!keep.log\nbuild/\n/top.txt\ndocs/**/gen\n\\#hash\nsp\\ \nx\\*y\n**/deep\nnested/*.tmp\n"


@pytest.mark.parametrize(
    ("rel", "is_dir", "expected"),
    [
        ("a.log", False, True),
        ("sub/b.log", False, True),
        ("keep.log", False, False),
        ("sub/keep.log", False, False),
        ("build", True, True),
        ("build", False, False),
        ("x/build", True, True),
        ("top.txt", False, True),
        ("sub/top.txt", False, False),
        ("docs/gen", True, True),
        ("docs/a/b/gen", False, True),
        ("other/docs/gen", False, False),
        ("#hash", False, True),
        ("sp ", False, True),
        ("sp", False, False),
        ("x*y", False, True),
        ("xzy", False, False),
        ("a/b/deep", True, True),
        ("nested/a.tmp", False, True),
        ("nested/sub/a.tmp", False, False),
        ("comment", False, False),
        ("ok.txt", False, False),
    ],
)
def test_git_rules(rel: str, is_dir: bool, expected: bool):
    assert ignored(tuple(parse(RULES, "")), rel, is_dir) is expected


def test_a_deeper_file_comes_after_its_parents_and_is_anchored_at_its_own_directory():
    rules = tuple(parse(b"*.gen\n", "") + parse(b"!special.gen\n/local\n", "pkg"))
    assert (
        ignored(rules, "pkg/a.gen", False)
        and not ignored(rules, "pkg/special.gen", False)
        and ignored(rules, "special.gen", False)
    )
    assert (
        ignored(rules, "pkg/local", False)
        and not ignored(rules, "local", False)
        and not ignored(rules, "pkg/sub/local", False)
    )


def test_matching_a_hostile_pattern_stays_bounded():
    rules = tuple(parse(b"*a*a*a*a*a*a*a*a*a*a*a*a*b\n" + b"/".join([b"**"] * 30) + b"/z\n", ""))
    started = time.monotonic()
    assert not ignored(rules, "a" * 250, False)
    assert not ignored(rules, "/".join(["a"] * 60), False)
    assert time.monotonic() - started < 5  # milliseconds in fact: no regex backtracks without bound


def test_ignored_entries_are_listed_and_a_bad_ignore_file_ignores_nothing(tmp_path: Path):
    ws = make_workspace(
        tmp_path / "ws",
        {
            ".gitignore": "node_modules/\n*.o\n",
            "node_modules/x/index.js": "x\n",
            "a.o": "o\n",
            "src/m.c": "int m;\n",
            "src/m.o": "o\n",
            "big/.gitignore": "#" * (IGNORE_CAP + 1) + "\n*\n",
            "big/kept.txt": "k\n",
            "linked/kept.txt": "k\n",
        },
    )
    os.symlink("../.gitignore", ws / "linked" / ".gitignore")  # a link is never followed: it ignores nothing
    (ws / "linked" / "node.o").write_text("o\n")  # still ignored by the root's *.o
    with CheckpointStore(tmp_path / "store", ws) as store:
        first = store.record(0)
        assert first is not None and first.ok
        skipped = {s.path: s.reason for s in first.skipped}
        assert skipped == {"node_modules": IGNORED, "a.o": IGNORED, "src/m.o": IGNORED, "linked/node.o": IGNORED}
        (ws / "src" / "m.o").write_text("changed\n")
        (ws / "src" / "m.c").write_text("int n;\n")
        (ws / ".gitignore").write_text("node_modules/\n")  # an ignore file changed: the next record walks everything
        second = store.record(1)
        assert (
            second is not None
            and second.ok
            and sorted(second.files_changed) == [".gitignore", "a.o", "linked/node.o", "src/m.c", "src/m.o"]
        )
        report = store.restore(0)
        assert report.conflicts == [] and (ws / "src" / "m.c").read_text() == "int m;\n"
        assert (ws / "src" / "m.o").read_text() == "changed\n"  # ignored at turn 0: left as it is, and said so
        assert {s.path for s in report.skipped} == set(skipped)
        assert (ws / "big" / "kept.txt").exists() and (ws / "node_modules" / "x" / "index.js").exists()


def test_an_ignore_file_that_is_a_fifo_is_never_opened(tmp_path: Path):
    ws = make_workspace(tmp_path / "ws", {"a.log": "a\n", "sub/b.log": "b\n"})
    os.mkfifo(ws / ".gitignore")  # an open would block the host until a writer came
    os.mkfifo(ws / "sub" / ".gitignore")
    with CheckpointStore(tmp_path / "store", ws) as store:
        first = store.record(0)
        assert first is not None and first.ok
        assert {s.path for s in first.skipped} == {
            ".gitignore",
            "sub/.gitignore",
        }  # FIFOs, listed as ever; they ignore nothing
        assert all("fifo" in s.reason.lower() for s in first.skipped)
