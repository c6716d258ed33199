"""Copy mode's turn 0 read from the real workspace (issue 50, checkpoints/baseline.py): the box may
write its copy while turn 0 is recorded, so no call waits for it. Turn 0 is the copy as it was
made: what the box changed meanwhile is not in it, and what the user changed in the real tree
since the copy is listed per file as not known, never recorded wrong and never "no change"."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pygit2
import pytest

from orchestrator import Sandbox
from orchestrator.boxfs import HostBudget
from orchestrator.workspace.checkpoints import (
    CHANGED_SINCE_COPY,
    GONE_SINCE_COPY,
    CheckpointStore,
    CopyBaseline,
)
from orchestrator.workspace.checkpoints.ignore import IGNORED
from orchestrator.workspace.copy import copy_workspace
from tests.helpers import make_workspace
from tests.helpers.checkpoints import BIG_DIRS, BIG_FILES, big_tree

UID = 1000


def _copied(tmp_path: Path, files: dict[str, str | bytes], setuid: str = "") -> tuple[Path, Path, Path]:
    real = make_workspace(tmp_path / "real", files)
    if setuid:  # setuid in the real tree: the copy drops it, and so does turn 0
        os.chmod(real / setuid, 0o4755)
    copy = tmp_path / "state" / "copy"
    manifest = copy_workspace(real, copy, UID, UID, HostBudget())
    manifest.save(tmp_path / "state" / "manifest.json")
    return real, copy, tmp_path / "state" / "manifest.json"


def test_turn_0_is_the_copy_as_made_whatever_the_box_and_the_user_did_since(tmp_path: Path):
    real, copy, manifest = _copied(
        tmp_path,
        {
            "same.txt": "same\n",
            "boxed.txt": "before the box\n",
            "user.txt": "before the user\n",
            "gone.txt": "the user removes it\n",
            "sub/deep.txt": "deep\n",
            "sub/gone/inner.txt": "inner\n",
            "run.sh": "#!/bin/sh\n",
            ".gitignore": "*.log\n",
            "trace.log": "ignored\n",
        },
        setuid="run.sh",
    )
    # the box, before turn 0 is read: changes, removes and adds in its copy
    (copy / "boxed.txt").write_text("the box wrote this\n")
    (copy / "sub" / "deep.txt").unlink()
    (copy / "box-new.txt").write_text("new\n")
    # the user, in the real tree: changes one file, removes another and a directory, adds one
    time.sleep(0.01)
    (real / "user.txt").write_text("the user changed it\n")
    (real / "gone.txt").unlink()
    (real / "sub" / "gone" / "inner.txt").unlink()
    (real / "sub" / "gone").rmdir()
    (real / "user-new.txt").write_text("not in the copy\n")
    os.mkfifo(real / "fifo")  # never in the copy, never opened

    store = CheckpointStore(tmp_path / "store", copy, box_user=(UID, UID))
    store.baseline = CopyBaseline(real, manifest)
    zero = store.record(0)
    assert zero is not None and zero.ok
    assert {(s.path, s.reason) for s in zero.skipped} == {
        ("user.txt", CHANGED_SINCE_COPY),
        ("gone.txt", GONE_SINCE_COPY),
        ("sub/gone", GONE_SINCE_COPY),  # the directory once, not what it held
        ("trace.log", IGNORED),
    }
    commit = store.repo[zero.commit]
    assert isinstance(commit, pygit2.Commit)
    tree = commit.tree
    names = sorted(str(e.name) for e in tree)
    assert "box-new.txt" not in names and "user-new.txt" not in names and "fifo" not in names
    blob = store.repo[tree["boxed.txt"].id]
    assert isinstance(blob, pygit2.Blob) and blob.data == b"before the box\n"
    assert tree["run.sh"].filemode == 0o100755

    # the next record walks the copy: what the box did is its change (the stat cache spared the rest)
    one = store.record(1)
    assert one is not None and one.ok
    assert set(one.files_changed) >= {"boxed.txt", "sub/deep.txt", "box-new.txt"}
    assert "same.txt" not in one.files_changed

    report = store.restore(0)
    assert report.conflicts == []
    assert (copy / "boxed.txt").read_text() == "before the box\n"
    assert (copy / "sub" / "deep.txt").read_text() == "deep\n"
    assert not (copy / "box-new.txt").exists()
    assert {(s.path, s.reason) for s in report.skipped} >= {
        ("user.txt", CHANGED_SINCE_COPY),
        ("gone.txt", GONE_SINCE_COPY),
    }  # what rollback cannot bring back, said per file
    assert (copy / "user.txt").read_text() == "before the user\n"  # the copy's own, untouched by restore
    store.close()


def test_a_file_the_user_changes_while_turn_0_reads_it_is_not_recorded_wrong(tmp_path: Path, monkeypatch):
    real, copy, manifest = _copied(tmp_path, {"a.txt": "a" * 1000, "b.txt": "b\n"})
    from orchestrator.boxfs import tree as boxfs_tree

    plain = boxfs_tree.BoxDir.read

    def racing(self, name, cap, rel=None):
        got = plain(self, name, cap, rel)
        if name == b"a.txt":  # the user saves it right after turn 0 read it
            (real / "a.txt").write_text("b" * 1000)
        return got

    monkeypatch.setattr(boxfs_tree.BoxDir, "read", racing)
    store = CheckpointStore(tmp_path / "store", copy, box_user=(UID, UID))
    store.baseline = CopyBaseline(real, manifest)
    zero = store.record(0)
    assert zero is not None and zero.ok
    assert [(s.path, s.reason) for s in zero.skipped] == [("a.txt", CHANGED_SINCE_COPY)]
    store.close()


@pytest.mark.slow
def test_copy_mode_writes_do_not_wait_for_turn_0_and_rollback_restores_it_on_a_40k_file_tree(
    tmp_path: Path, sandbox_image, monkeypatch
):
    ws = big_tree(
        tmp_path / "ws",
        {".gitignore": "/build/\n*.log\n", "build/out.o": "object\n", "d002/trace.log": "trace\n"},
    )
    release = threading.Event()
    real_snapshot = CheckpointStore._snapshot

    def held(self):
        if threading.current_thread() is self._first:
            release.wait(120)  # turn 0 is still being read while the box writes
        return real_snapshot(self)

    monkeypatch.setattr(CheckpointStore, "_snapshot", held)
    with Sandbox(ws, mode="copy", auto_approve=True, copy_max_entries=1_000_000) as box:
        store = box._live().checkpoints
        assert store is not None
        ran = box.shell("rm -r d000 && echo changed > d001/f000.txt && echo new > new.txt")
        assert ran.exit_code == 0 and store.recording  # the write did not wait for turn 0
        release.set()
        points = box.checkpoints()
        assert points[0].turn == 0 and points[0].ok
        assert {(s.path, s.reason) for s in points[0].skipped} == {("build", IGNORED), ("d002/trace.log", IGNORED)}
        box.shell("echo again > d002/trace.log")
        report = box.rollback(0)
        assert report.conflicts == []
        assert {(s.path, s.reason) for s in report.skipped} == {("build", IGNORED), ("d002/trace.log", IGNORED)}
        assert box.read_file("d000/f199.txt").text == "file 199 of directory 0\n"  # back in the copy
        assert box.read_file("d001/f000.txt").text == "file 0 of directory 1\n"
        assert box.shell("test -e new.txt").exit_code != 0
        assert box.shell("cat d002/trace.log").output.strip() == "again"  # ignored: left as it is
    assert sum(len(names) for _, _, names in os.walk(ws)) == BIG_DIRS * BIG_FILES + 3  # the real tree untouched
