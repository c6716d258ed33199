"""The session's first checkpoint (issue 50): recorded in the background while the box starts and
read-only calls run, written straight into one pack; a call that may change files waits for it,
and its failure is recorded, never fatal."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pygit2
import pytest

from orchestrator import Sandbox
from orchestrator.workspace.checkpoints import CheckpointStore, unknown_changes
from orchestrator.workspace.checkpoints.ignore import IGNORED
from orchestrator.workspace.checkpoints.packwrite import OBJ_TREE, PackWriter, tree_data
from tests.helpers import make_workspace
from tests.helpers.checkpoints import BIG_DIRS, BIG_FILES, big_tree


def loose_objects(store: Path) -> list[str]:
    return [
        f"{fan.name}/{o.name}" for fan in (store / "objects").iterdir() if len(fan.name) == 2 for o in fan.iterdir()
    ]


def test_written_trees_are_git_trees_and_the_pack_is_sound(tmp_path: Path):
    repo = pygit2.init_repository(str(tmp_path / "r.git"), bare=True)
    blob = repo.create_blob(b"x")
    sub = repo.TreeBuilder().write()
    names = ["a", "a.b", "a-b", "b", "A", "\u00e9t\u00e9", "a\\x80\\\\z", "a0"]
    entries = [(n, 0o100644, blob) for n in names] + [("c", 0o040000, sub), ("c.d", 0o100755, blob)]
    builder = repo.TreeBuilder()
    for name, mode, oid in entries:
        builder.insert(name, oid, mode)
    expected = builder.write()
    packer = PackWriter(tmp_path / "r.git" / "objects" / "pack")
    ours = packer.add(OBJ_TREE, tree_data(entries))
    assert ours == expected.raw  # the same bytes, so the same id, as libgit2's own
    data = os.urandom(300_000)
    big = packer.add(3, data)
    assert packer.finish() is not None
    repo = pygit2.Repository(str(tmp_path / "r.git"))
    stored = repo[pygit2.Oid(raw=big)]
    assert isinstance(stored, pygit2.Blob) and stored.data == data
    fsck = subprocess.run(
        ["git", "--git-dir", str(tmp_path / "r.git"), "fsck", "--strict", "--no-dangling"],
        capture_output=True,
        text=True,
    )
    assert fsck.returncode == 0, fsck.stderr


def test_a_first_record_leaves_no_loose_object_and_restores(tmp_path: Path):
    ws = make_workspace(tmp_path / "ws", {f"d{i % 7}/f{i}.txt": f"content {i}\n" * (i % 50 + 1) for i in range(700)})
    (ws / "big.bin").write_bytes(os.urandom(200_000))
    with CheckpointStore(tmp_path / "store", ws) as store:
        first = store.record(0)
        assert first is not None and first.ok
        assert loose_objects(tmp_path / "store") == []  # turn 0: one pack, written directly
        (ws / "d1" / "f1.txt").write_text("changed\n")
        (ws / "big.bin").unlink()
    with CheckpointStore(
        tmp_path / "store", ws
    ) as store:  # a new process: its first record is direct too, against a full store
        second = store.record(1)
        assert second is not None and second.ok and sorted(second.files_changed) == ["big.bin", "d1/f1.txt"]
        report = store.restore(0)
        assert (
            report.conflicts == []
            and (ws / "d1" / "f1.txt").read_text() == "content 1\n" * 2
            and (ws / "big.bin").stat().st_size == 200_000
        )
    fsck = subprocess.run(
        ["git", "--git-dir", str(tmp_path / "store"), "fsck", "--strict", "--no-dangling"],
        capture_output=True,
        text=True,
    )
    assert fsck.returncode == 0, fsck.stderr


def test_a_cancelled_background_record_is_recorded_as_failed_and_list_waits(tmp_path: Path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    store = CheckpointStore(tmp_path / "store", ws)
    go = threading.Event()
    store.in_background(lambda: (go.wait(), store.record(0)))
    assert store.recording
    store.cancel()
    go.set()
    points = store.list()  # waits for it
    assert not store.recording and [(p.turn, p.state, p.error_type) for p in points] == [(0, "failed", "cancelled")]
    assert "cancelled" in (unknown_changes(points) or "")  # never "no change"
    later = store.record(1)  # the next record walks everything
    assert later is not None and later.ok and later.files_changed == ["a.txt"]
    store.close()


@pytest.mark.slow
def test_a_changing_call_right_after_open_waits_for_turn_0_on_a_40k_file_tree(tmp_path: Path, sandbox_image):
    ws = big_tree(
        tmp_path / "ws",
        {
            ".gitignore": "# build outputs\n/build/\n*.log\n!keep.log\n",
            "build/out.o": "object\n",
            "d002/trace.log": "trace\n",
            "d002/keep.log": "kept\n",
        },
    )
    with Sandbox(ws, mode="bind", auto_approve=True) as box:
        assert box.read_file("d000/f000.txt").text == "file 0 of directory 0\n"
        ran = box.shell("date +%s.%N; rm -r d000 && echo changed > d001/f000.txt && echo new > new.txt")
        started = float(ran.output.split()[0])
        points = box.checkpoints()
        assert points[0].turn == 0 and points[0].ok
        assert (
            points[0].created <= started + 0.01
        )  # turn 0 was complete before the shell call ran (created: rounded to ms)
        assert {(s.path, s.reason) for s in points[0].skipped} == {("build", IGNORED), ("d002/trace.log", IGNORED)}
        box.shell("echo rebuilt > build/out.o; echo again > d002/trace.log; echo changed > d002/keep.log")
        report = box.rollback(0)
        assert report.conflicts == []
        assert {(s.path, s.reason) for s in report.skipped} == {
            ("build", IGNORED),
            ("d002/trace.log", IGNORED),
        }  # said per path
    assert (
        ws / "d000" / "f199.txt"
    ).read_bytes() == b"file 199 of directory 0\n"  # what the first shell call removed, back
    assert (ws / "d001" / "f000.txt").read_bytes() == b"file 0 of directory 1\n"
    assert not (ws / "new.txt").exists()
    assert (ws / "d002" / "keep.log").read_text() == "kept\n"  # re-included by !keep.log: checkpointed, restored
    assert (ws / "build" / "out.o").read_text() == "rebuilt\n" and (
        ws / "d002" / "trace.log"
    ).read_text() == "again\n"  # left as they are
    assert sum(len(names) for _, _, names in os.walk(ws)) == BIG_DIRS * BIG_FILES + 4


def test_a_failed_first_record_is_recorded_and_the_session_goes_on(tmp_path: Path, sandbox_image, monkeypatch):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})

    def broken(self):
        raise OSError(5, "Input/output error (the test's)")

    monkeypatch.setattr(CheckpointStore, "_snapshot", broken)
    with Sandbox(ws, mode="bind", auto_approve=True) as box:
        assert box.read_file("a.txt").text == "a\n"
        assert box.shell("echo b > b.txt").exit_code == 0  # waited for the failed record, then ran
        points = box.checkpoints()
        assert (points[0].turn, points[0].state, points[0].error_type) == (0, "failed", "io_error")
        transcript = box.transcript_path
    events = [
        line
        for line in transcript.read_text().splitlines()
        if '"type": "checkpoint"' in line or '"type":"checkpoint"' in line
    ]
    assert events and '"ok": false' in events[0].replace('"ok":false', '"ok": false')
    assert (ws / "b.txt").read_text() == "b\n"


def test_closing_before_turn_0_is_complete_cancels_it_and_says_changes_are_unknown(
    tmp_path: Path, sandbox_image, monkeypatch
):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    release = threading.Event()
    real = CheckpointStore._snapshot

    def slow(self):
        release.wait(60)  # turn 0 still running when the session closes
        return real(self)

    monkeypatch.setattr(CheckpointStore, "_snapshot", slow)
    box = Sandbox(ws, mode="bind", auto_approve=True).open()
    assert box.read_file("a.txt").text == "a\n"  # a read answers while turn 0 is recorded
    store = box._live().checkpoints
    assert store is not None and store.recording
    threading.Timer(0.5, release.set).start()
    started = time.monotonic()
    box.close()
    assert time.monotonic() - started < 60
    points = store.list()
    assert [(p.turn, p.state, p.error_type) for p in points] == [(0, "failed", "cancelled")]


def test_the_store_budget_scales_with_the_tree_and_bounds_what_follows(tmp_path: Path, monkeypatch):
    """A first record bigger than the growth budget is kept (the disk has room): rollback to the
    start works on any tree; what the later records add is bounded by the growth budget, typed."""
    from orchestrator.workspace.checkpoints import store as store_module

    monkeypatch.setattr(store_module, "GROWTH_BYTES", 256 << 10)
    ws = make_workspace(tmp_path / "ws", {f"r{i}.bin": os.urandom(200_000) for i in range(6)})  # 1.2 MB, incompressible
    store = CheckpointStore(tmp_path / "store", ws)
    zero = store.record(0)
    assert zero is not None and zero.ok  # over 256 KiB: kept, as the disk has room
    assert store.budget_for() == store._index.base_bytes + (256 << 10) and store._index.base_bytes >= 1_200_000
    (ws / "small.bin").write_bytes(os.urandom(50_000))
    one = store.record(1)
    assert one is not None and one.ok and one.files_changed == ["small.bin"]
    for i in range(3):
        (ws / f"more{i}.bin").write_bytes(os.urandom(200_000))
    two = store.record(2)
    assert (
        two is not None and (two.state, two.error_type) == ("skipped", "resource_exhausted") and "budget" in two.error
    )
    monkeypatch.setattr(store_module, "disk_room", lambda path: 0)  # a full disk: a first record is bounded too
    other = CheckpointStore(tmp_path / "store2", ws)
    first = other.record(0)
    assert first is not None and first.state == "skipped"
    store.close()
    other.close()
