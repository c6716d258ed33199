"""Checkpoints of a hostile workspace: real files on disk, a real libgit2 store, one real sandbox.

Each attack test plants what a box could leave behind and checks the store and restore were not
steered by it: nothing outside the workspace is read or written, nothing is followed or run.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pygit2
import pytest

from orchestrator.workspace.checkpoints import MODE_LINK, CheckpointStore
from tests.helpers import SANDBOX_UID, chown_tree, make_workspace, recorded
from tests.helpers.checkpoints import picture


@pytest.fixture
def layout(tmp_path: Path):
    """A workspace, a canary directory beside it (the host's files) and a state dir for the store."""
    ws = make_workspace(
        tmp_path / "ws",
        {
            "README.md": "# project\n",
            "src/app.py": "print('hi')\n",
            "src/pkg/__init__.py": "",
            "bin/run.sh": "#!/bin/sh\necho run\n",
            "data/blob.bin": bytes(range(256)) * 16,
        },
    )
    os.chmod(ws / "bin/run.sh", 0o755)
    os.symlink("src/app.py", ws / "app_link")
    (ws / "empty_dir").mkdir()
    canary = tmp_path / "host"
    canary.mkdir()
    (canary / "secret.txt").write_text("host secret\n")
    return ws, canary, tmp_path / "state" / "checkpoints.git"


def canary_state(canary: Path) -> dict[str, tuple]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in canary.iterdir()}


def test_round_trip_turn_0_and_a_middle_turn(layout):
    ws, _, store_path = layout
    store = CheckpointStore(store_path, ws)
    assert store.record(0) is not None
    start = picture(ws)
    (ws / "src/app.py").write_text("print('changed')\n")
    (ws / "src/new.py").write_text("new\n")
    os.unlink(ws / "README.md")
    os.chmod(ws / "data/blob.bin", 0o755)
    os.unlink(ws / "app_link")
    os.symlink("bin/run.sh", ws / "app_link")
    (ws / "empty_dir").rmdir()
    cp1 = store.record(1)
    assert cp1 is not None
    assert set(cp1.files_changed) == {"src/app.py", "src/new.py", "README.md", "data/blob.bin", "app_link"}
    middle = picture(ws)
    (ws / "src/pkg/__init__.py").write_text("x = 1\n")
    (ws / "more/deep").mkdir(parents=True)
    (ws / "more/deep/f.txt").write_bytes(b"\x00\x01 binary\r\n")
    import shutil

    shutil.rmtree(ws / "bin")
    assert store.record(2) is not None
    assert store.record(3) is None  # nothing changed

    report = store.restore(1)
    assert picture(ws) == middle
    assert "more/deep/f.txt" in report.removed and "bin/run.sh" in report.restored
    report = store.restore(0)
    assert picture(ws) == start
    assert oct(os.stat(ws / "bin/run.sh").st_mode & 0o777) == "0o755"
    assert oct(os.stat(ws / "data/blob.bin").st_mode & 0o777) == "0o644"
    assert store.restore(0).restored == []  # already there: nothing rewritten


def test_list_from_a_fresh_store_object(layout):
    ws, _, store_path = layout
    first = CheckpointStore(store_path, ws)
    first.record(0)
    (ws / "src/app.py").write_text("v2\n")
    first.record(1)
    first.close()
    fresh = CheckpointStore(store_path, ws)
    listed = fresh.list()
    assert [(c.turn, c.files_changed) for c in listed] == [(0, []), (1, ["src/app.py"])]
    assert all(len(c.commit) == 40 for c in listed)
    fresh.restore(0)
    assert (ws / "src/app.py").read_text() == "print('hi')\n"
    (ws / "src/app.py").write_text("v3\n")
    assert fresh.record(1).turn == 2  # a turn is recorded once: a late number is moved past the last


def test_a_symlink_to_a_host_file_is_stored_as_a_link_and_never_written_through(layout):
    ws, canary, store_path = layout
    target = str(canary / "secret.txt")
    os.symlink(target, ws / "leak")
    before = canary_state(canary)
    store = CheckpointStore(store_path, ws)
    cp = store.record(0)
    tree = store.repo[pygit2.Oid(hex=cp.commit)].tree
    assert tree["leak"].filemode == MODE_LINK
    assert store.repo[tree["leak"].id].data == target.encode()  # the target, never the host file's bytes
    assert all(b"host secret" not in store.repo[e.id].data for e in tree if e.type_str == "blob")
    # The box swaps a checkpointed file for a link to the host file: restore replaces the link.
    os.unlink(ws / "README.md")
    os.symlink(target, ws / "README.md")
    store.record(1)
    store.restore(0)
    assert not (ws / "README.md").is_symlink() and (ws / "README.md").read_text() == "# project\n"
    assert os.readlink(ws / "leak") == target
    assert canary_state(canary) == before


def test_a_directory_swapped_for_a_link_to_the_host_is_replaced_not_followed(layout):
    ws, canary, store_path = layout
    store = CheckpointStore(store_path, ws)
    store.record(0)
    before = canary_state(canary)
    import shutil

    shutil.rmtree(ws / "src")
    os.symlink(str(canary), ws / "src")  # src/app.py would now land in the host's directory
    os.unlink(ws / "empty_dir") if (ws / "empty_dir").is_symlink() else (ws / "empty_dir").rmdir()
    os.symlink(str(canary), ws / "empty_dir")
    cp = store.record(1)
    assert cp is not None and "src/app.py" in cp.files_changed
    report = store.restore(0)
    assert canary_state(canary) == before  # nothing written, nothing removed outside
    assert sorted(os.listdir(canary)) == ["secret.txt"]
    assert (ws / "src").is_dir() and not (ws / "src").is_symlink()
    assert (ws / "src/app.py").read_text() == "print('hi')\n"
    assert (ws / "empty_dir").is_dir() and not (ws / "empty_dir").is_symlink()
    assert "src" in report.removed


def test_a_fifo_is_skipped_at_once_and_listed(layout):
    ws, _, store_path = layout
    os.mkfifo(ws / "src/pipe")
    store = CheckpointStore(store_path, ws)
    started = time.monotonic()
    cp = store.record(0)
    assert time.monotonic() - started < 10
    assert [(s.path, "FIFO" in s.reason) for s in cp.skipped] == [("src/pipe", True)]
    tree = store.repo[pygit2.Oid(hex=cp.commit)].tree
    assert "pipe" not in store.repo[tree["src"].id]
    # A FIFO planted after the checkpoint is removed by restore (unlinked, never opened) and listed.
    os.mkfifo(ws / "later_pipe")
    cp1 = store.record(1)
    assert {s.path for s in cp1.skipped} == {"src/pipe", "later_pipe"}
    report = store.restore(0)
    assert not os.path.lexists(ws / "later_pipe") and "later_pipe" in report.removed
    assert stat.S_ISFIFO(os.lstat(ws / "src/pipe").st_mode)  # never checkpointed: left alone, reported
    assert "src/pipe" in [s.path for s in report.skipped]


def test_git_entries_in_any_case_are_neither_recorded_nor_touched(layout):
    ws, tmp, store_path = layout
    (ws / ".git").mkdir()
    (ws / ".git/config").write_text("[core]\n\tfsmonitor = touch /tmp/oa-pwned\n")
    (ws / "src/.GIT").write_text("gitdir: ../../host\n")
    store = CheckpointStore(store_path, ws)
    cp = store.record(0)
    tree = store.repo[pygit2.Oid(hex=cp.commit)].tree
    assert ".git" not in tree and ".GIT" not in store.repo[tree["src"].id]
    assert all(".git" not in p.casefold() for p in cp.files_changed)
    planted = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (ws / ".git/config", ws / "src/.GIT")}
    (ws / "new/.Git").mkdir(parents=True)  # a nested repository planted after the checkpoint
    (ws / "new/.Git/HEAD").write_text("ref: refs/heads/main\n")
    (ws / "new/file.txt").write_text("x")
    store.record(1)
    report = store.restore(0)
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in planted} == planted
    assert (ws / "new/.Git/HEAD").read_text() == "ref: refs/heads/main\n"  # never removed
    assert not (ws / "new/file.txt").exists() and "new/file.txt" in report.removed
    assert not os.path.exists("/tmp/oa-pwned")


def test_oversized_files_and_a_spent_budget_are_listed_not_dropped(tmp_path: Path):
    ws = make_workspace(tmp_path / "ws", {"small.txt": "s" * 100, "huge.bin": b"h" * 5000})
    store = CheckpointStore(tmp_path / "cp.git", ws, budget_bytes=1 << 20, max_file_bytes=4096)
    cp = recorded(store, 0)
    assert [(s.path, "larger than 4096" in s.reason) for s in cp.skipped] == [("huge.bin", True)]
    (ws / "a.txt").write_text("a" * 1500)
    cp = recorded(store, 1)
    assert cp.ok and cp.files_changed == ["a.txt"] and "huge.bin" in {s.path for s in cp.skipped}
    # The store's budget counts its real size on disk: past it, a checkpoint is skipped, typed.
    store.budget_bytes = store._index.used_bytes + 2000
    for i in range(4):
        (ws / f"n{i}.txt").write_text(f"{i}" * 1500)
    cp = recorded(store, 2)
    assert cp.state == "skipped" and cp.error_type == "resource_exhausted" and "budget" in cp.error
    # Restore leaves what was never checkpointed alone and reports it (nothing changed since the last record).
    (ws / "n0.txt").unlink()
    for i in range(1, 4):
        (ws / f"n{i}.txt").unlink()
    report = store.restore(1)
    assert not report.conflicts
    assert (ws / "huge.bin").read_bytes() == b"h" * 5000
    assert {s.path for s in report.skipped} >= {"huge.bin"}


def test_gitattributes_and_filters_change_nothing(tmp_path: Path):
    marker = tmp_path / "filter-ran"
    crlf = b"line one\r\nline two\n\x00binary\r"
    ws = make_workspace(
        tmp_path / "ws",
        {
            ".gitattributes": "* text eol=crlf\n* filter=evil\n*.txt ident\n",
            "notes.txt": crlf,
            "lf.txt": "a\nb\n$Id$\n",
        },
    )
    (ws / ".git").mkdir()
    (ws / ".git/config").write_text(f'[filter "evil"]\n\tclean = touch {marker}\n\tsmudge = touch {marker}\n')
    store = CheckpointStore(tmp_path / "cp.git", ws)
    store.record(0)
    before = picture(ws)
    (ws / "notes.txt").write_bytes(b"other")
    (ws / "lf.txt").unlink()
    store.record(1)
    store.restore(0)
    assert picture(ws) == before
    assert (ws / "notes.txt").read_bytes() == crlf
    assert not marker.exists()


def test_the_store_may_not_live_in_the_workspace(tmp_path: Path):
    ws = make_workspace(tmp_path / "ws", {"a": "a"})
    with pytest.raises(ValueError):
        CheckpointStore(ws / "sub" / "checkpoints.git", ws)


def test_changes_the_hints_could_miss_are_still_seen(tmp_path: Path):
    """Same size and same clock tick, a hard link written through its other name, a directory
    renamed: every record equals what a fresh process walking everything records."""
    ws = make_workspace(tmp_path / "ws", {"a/x.txt": "aaaa", "b/keep.txt": "k", "c/d/e.txt": "e"})
    store = CheckpointStore(tmp_path / "cp.git", ws)
    store.record(0)
    turn = 0

    def check(expect_changed: set[str]) -> None:
        nonlocal turn
        turn += 1
        cp = store.record(turn)
        assert cp is not None and set(cp.files_changed) == expect_changed
        fresh = CheckpointStore(tmp_path / f"fresh{turn}.git", ws)
        assert (
            recorded(fresh, 0).commit
            and store.repo[pygit2.Oid(hex=cp.commit)].peel(pygit2.Commit).tree_id
            == fresh.repo[pygit2.Oid(hex=fresh.list()[0].commit)].peel(pygit2.Commit).tree_id
        )
        fresh.close()

    (ws / "a/x.txt").write_text("bbbb")  # same size, right after the last record
    check({"a/x.txt"})
    (ws / "a/x.txt").write_text("cccc")
    check({"a/x.txt"})
    os.link(ws / "a/x.txt", ws / "b/y.txt")
    check({"b/y.txt"})
    with open(ws / "b/y.txt", "r+") as fh:  # written through the other name only
        fh.write("dddd")
    check({"a/x.txt", "b/y.txt"})
    os.rename(ws / "c", ws / "c2")
    check({"c/d/e.txt", "c2/d/e.txt"})
    (ws / "c2/d/e.txt").write_text("moved and changed")
    check({"c2/d/e.txt"})
    os.chmod(ws / "b/keep.txt", 0o755)
    check({"b/keep.txt"})


def test_restore_gives_new_files_the_workspace_owner(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("chown needs root; as a user every file is the user's anyway")
    ws = make_workspace(tmp_path / "ws", {"sub/f.txt": "f", "g.txt": "g"})
    chown_tree(ws, SANDBOX_UID)
    os.chown(ws, SANDBOX_UID, SANDBOX_UID)
    store = CheckpointStore(tmp_path / "cp.git", ws)
    store.record(0)
    import shutil

    shutil.rmtree(ws / "sub")
    store.record(1)
    store.restore(0)
    assert os.stat(ws / "sub").st_uid == SANDBOX_UID and os.stat(ws / "sub/f.txt").st_uid == SANDBOX_UID


def test_a_same_size_rewrite_with_a_forged_mtime_is_seen_by_a_full_walk(tmp_path: Path):
    """A box can set a file's mtime back (touch -d) after rewriting it at the same size; only the
    ctime, which no caller can set, tells the stat cache. A moved directory makes the record a
    full walk, so the cache (not an inotify hint) decides."""
    ws = make_workspace(tmp_path / "ws", {"x.txt": "aaaa", "d/keep.txt": "k"})
    old = os.stat(ws / "x.txt")
    time.sleep(0.1)  # past the racy window, so the first record's stat is cached and trusted
    store = CheckpointStore(tmp_path / "cp.git", ws)
    store.record(0)
    (ws / "x.txt").write_text("bbbb")
    os.utime(ws / "x.txt", ns=(old.st_atime_ns, old.st_mtime_ns))
    os.rename(ws / "d", ws / "d2")
    cp = recorded(store, 1)
    assert "x.txt" in cp.files_changed
    store.restore(0)
    assert (ws / "x.txt").read_text() == "aaaa"
