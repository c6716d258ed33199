"""Attacks on copy mode's turn 0 read from the real workspace (checkpoints/baseline.py): the real
tree may be a hostile clone, and may change under the walk. Nothing is followed, nothing but a
regular file is opened, and what changed since the copy is listed, never recorded wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pygit2

from orchestrator.boxfs import HostBudget
from orchestrator.workspace.checkpoints import CHANGED_SINCE_COPY, CheckpointStore, CopyBaseline
from orchestrator.workspace.copy import copy_workspace
from tests.helpers import make_workspace

UID = 1000


def _copied(tmp_path: Path, files: dict[str, str | bytes]) -> tuple[Path, Path, CheckpointStore]:
    real = make_workspace(tmp_path / "real", files)
    (tmp_path / "secret").write_text("host secret\n")
    os.symlink(tmp_path / "secret", real / "link")  # a clone's link out of the tree
    os.mkfifo(real / "pipe")  # left out of the copy: never opened by turn 0 either
    copy = tmp_path / "state" / "copy"
    manifest = copy_workspace(real, copy, UID, UID, HostBudget())
    manifest.save(tmp_path / "state" / "manifest.json")
    store = CheckpointStore(tmp_path / "store", copy, box_user=(UID, UID))
    store.baseline = CopyBaseline(real, tmp_path / "state" / "manifest.json")
    return real, copy, store


def _tree(store: CheckpointStore, commit: str) -> pygit2.Tree:
    obj = store.repo[commit]
    assert isinstance(obj, pygit2.Commit)
    return obj.tree


def _blob(store: CheckpointStore, tree: pygit2.Tree, name: str) -> bytes:
    obj = store.repo[tree[name].id]
    assert isinstance(obj, pygit2.Blob)
    return obj.data


def test_links_are_recorded_as_links_and_a_file_swapped_for_a_link_fifo_or_dir_is_never_followed(tmp_path: Path):
    real, _, store = _copied(
        tmp_path, {"a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n", "sub/inner.txt": "inner\n", "keep.txt": "k\n"}
    )
    # after the copy, the real tree is rigged: each swap must be noticed, never followed or opened
    (real / "a.txt").unlink()
    os.symlink(tmp_path / "secret", real / "a.txt")
    (real / "b.txt").unlink()
    os.mkfifo(real / "b.txt")  # opening it would block the record
    (real / "sub" / "inner.txt").unlink()
    (real / "sub").rmdir()
    os.symlink(tmp_path, real / "sub")  # a directory swapped for a link out of the tree
    zero = store.record(0)
    assert zero is not None and zero.ok
    assert {(s.path, s.reason) for s in zero.skipped} == {
        ("a.txt", CHANGED_SINCE_COPY),
        ("b.txt", CHANGED_SINCE_COPY),
        ("sub", CHANGED_SINCE_COPY),
    }
    tree = _tree(store, zero.commit)
    assert tree["link"].filemode == pygit2.enums.FileMode.LINK
    assert _blob(store, tree, "link") == os.fsencode(tmp_path / "secret")  # the target as data
    assert "pipe" not in [e.name for e in tree] and _blob(store, tree, "keep.txt") == b"k\n"
    for oid in store.repo:  # no object holds the link's target's content
        assert b"host secret" not in store.repo[oid].read_raw()
    store.close()


def test_hostile_names_round_trip_and_a_same_size_rewrite_is_caught(tmp_path: Path):
    names = {"new\nline.txt": "n\n", "tab\there.txt": "t\n", "esc\x1b[31m.txt": "e\n"}
    real, copy, store = _copied(tmp_path, {**names, "same.txt": "1234\n"})
    raw = b"bad-\xff-utf8.txt"
    (real / os.fsdecode(raw)).write_bytes(b"raw\n")  # made after the copy: not in it, not in turn 0
    st = os.stat(real / "same.txt")
    (real / "same.txt").write_text("5678\n")  # the same size, its mtime moved by 1 ns: caught, as apply catches it
    os.utime(real / "same.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    zero = store.record(0)
    assert zero is not None and zero.ok
    assert [(s.path, s.reason) for s in zero.skipped] == [("same.txt", CHANGED_SINCE_COPY)]
    tree = _tree(store, zero.commit)
    for name, text in names.items():
        assert _blob(store, tree, name) == text.encode()
    (copy / "new\nline.txt").write_text("the box\n")
    assert store.record(1) is not None
    report = store.restore(0)
    assert report.conflicts == [] and (copy / "new\nline.txt").read_text() == "n\n"
    store.close()
