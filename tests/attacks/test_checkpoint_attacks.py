"""Attacks on the checkpoint store and rollback (issue 22): real files, a real libgit2 store, and
a real box where the box must plant something.

Each class closed here: the store's real growth on disk is charged and bounded; modes and owners
come back exactly (never wider) and nothing the sandbox user could not read is stored; rollback
never overwrites what changed since the last checkpoint; holes stay holes; a failed checkpoint
reads as unknown, never as "no change" (invalid UTF-8 names and 495-deep chains are recorded);
parallel records leave a valid store.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pygit2
import pytest

from orchestrator.boxfs import BudgetExceeded, HostBudget, from_store, to_store
from orchestrator.workspace.checkpoints import NOT_READABLE, CheckpointStore, store_unknown, unknown_changes
from tests.helpers import SANDBOX_UID, chown_tree, make_workspace, recorded

ROOT = os.geteuid() == 0


def allocated(path: Path) -> tuple[int, int]:
    """(bytes allocated on disk, files) under path."""
    total = files = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            total += st.st_blocks * 512
            files += 1
    return total, files


def loose_objects(store: Path) -> int:
    objects = store / "objects"
    return sum(len(os.listdir(objects / d)) for d in os.listdir(objects) if len(d) == 2)


# --- 1. the store's real growth ---------------------------------------------------------------


def test_renaming_empty_files_across_many_directories_is_charged_packed_and_bounded(tmp_path: Path):
    """Every renamed empty file makes a new tree object per directory on its path: as loose files
    that is 4 KiB each, far past the bytes the box wrote (zero). The store packs them after each
    record, charges its real size, and past its budget skips the checkpoint, typed."""
    ws = make_workspace(tmp_path / "ws", {f"d{i:03}/e{j}/f0-{i}-{j}": "" for i in range(60) for j in range(3)})
    store_path = tmp_path / "cp.git"
    store = CheckpointStore(store_path, ws, budget_bytes=4 << 20)
    assert recorded(store, 0).ok
    sizes = []
    for turn in range(1, 6):
        for i in range(60):
            for j in range(3):
                os.rename(
                    ws / f"d{i:03}/e{j}/f{turn - 1}-{i}-{j}", ws / f"d{i:03}/e{j}/f{turn}-{i}-{j}"
                )  # a unique tree each
        cp = store.record(turn)
        assert cp is not None and cp.ok, cp
        assert loose_objects(store_path) == 0  # packed: no 4 KiB file per tree
        on_disk, _ = allocated(store_path)
        assert on_disk <= store.budget_bytes
        assert store._index.used_bytes == pytest.approx(on_disk, rel=0.2)
        sizes.append(on_disk)
    # 241 new trees a turn would be ~1 MiB loose; packed they cost a few KiB.
    assert sizes[-1] - sizes[0] < 200 << 10, sizes
    # A budget the next checkpoint does not fit: skipped, typed, nothing half-written.
    store.budget_bytes = store._index.used_bytes + 8192
    before = allocated(store_path)[0]
    for i in range(60):
        for j in range(3):
            os.rename(ws / f"d{i:03}/e{j}/f5-{i}-{j}", ws / f"d{i:03}/e{j}/g-{i}-{j}")
    cp = store.record(6)
    assert cp is not None and cp.state == "skipped" and cp.error_type == "resource_exhausted", cp
    assert loose_objects(store_path) == 0
    assert allocated(store_path)[0] <= before + 16384  # the index entry that says so, no objects
    assert unknown_changes(store.list()) is not None and store_unknown(store_path) is not None


# --- 2. modes and owners ------------------------------------------------------------------------


def test_a_private_file_comes_back_private_and_root_only_files_are_never_stored(tmp_path: Path):
    ws = make_workspace(
        tmp_path / "ws", {".env": "TOKEN=secret\n", "run.sh": "#!/bin/sh\n", "shared/g.txt": "g", "a.txt": "a"}
    )
    os.chmod(ws / ".env", 0o600)
    os.chmod(ws / "run.sh", 0o750)
    os.chmod(ws / "shared", 0o710)
    chown_tree(ws)
    if ROOT:
        os.chown(ws, SANDBOX_UID, SANDBOX_UID)
        # A host file only root may read, planted in the workspace (a root host would read it).
        (ws / "root-only.key").write_text("root secret\n")
        os.chmod(ws / "root-only.key", 0o600)
        os.chown(ws / "root-only.key", 0, 0)
        (ws / "root-dir").mkdir(mode=0o700)
        (ws / "root-dir/inner.txt").write_text("root inner\n")
    store = CheckpointStore(tmp_path / "cp.git", ws, box_user=(SANDBOX_UID, SANDBOX_UID))
    cp0 = recorded(store, 0)
    assert cp0.ok
    if ROOT:
        skipped = {s.path: s.reason for s in cp0.skipped}
        assert skipped.get("root-only.key") == NOT_READABLE and skipped.get("root-dir") == NOT_READABLE
        blobs = [obj.data for oid in store.repo if isinstance(obj := store.repo[oid], pygit2.Blob)]
        assert not any(b"root secret" in b or b"root inner" in b for b in blobs)
    # The box widens everything; rollback puts back the exact modes.
    for rel in (".env", "run.sh", "a.txt"):
        os.chmod(ws / rel, 0o666)
    (ws / ".env").write_text("TOKEN=changed\n")
    os.chmod(ws / "shared", 0o777)
    assert recorded(store, 1).ok
    report = store.restore(0)
    assert not report.conflicts, report.conflicts
    assert stat.S_IMODE(os.stat(ws / ".env").st_mode) == 0o600
    assert (ws / ".env").read_text() == "TOKEN=secret\n"
    assert stat.S_IMODE(os.stat(ws / "run.sh").st_mode) == 0o750
    assert stat.S_IMODE(os.stat(ws / "a.txt").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(ws / "shared").st_mode) == 0o710
    if ROOT:
        assert os.stat(ws / ".env").st_uid == SANDBOX_UID
        assert (
            os.stat(ws / "root-only.key").st_uid == 0 and stat.S_IMODE(os.stat(ws / "root-only.key").st_mode) == 0o600
        )
    # A deleted private file comes back private, never 0644 for a moment.
    os.unlink(ws / ".env")
    assert recorded(store, 2).ok
    store.restore(0)
    assert stat.S_IMODE(os.stat(ws / ".env").st_mode) == 0o600


@pytest.mark.skipif(not ROOT, reason="files of another owner need root")
def test_files_of_another_owner_come_back_with_that_owner(tmp_path: Path):
    ws = make_workspace(tmp_path / "ws", {"mine.txt": "m", "theirs.txt": "t"})
    chown_tree(ws)
    os.chown(ws, SANDBOX_UID, SANDBOX_UID)
    os.chown(ws / "theirs.txt", 0, SANDBOX_UID)
    os.chmod(ws / "theirs.txt", 0o640)  # readable by the box through its group
    store = CheckpointStore(tmp_path / "cp.git", ws, box_user=(SANDBOX_UID, SANDBOX_UID))
    assert recorded(store, 0).ok
    os.unlink(ws / "theirs.txt")
    assert recorded(store, 1).ok
    store.restore(0)
    st = os.stat(ws / "theirs.txt")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, SANDBOX_UID, 0o640)


# --- 3. conflicts ---------------------------------------------------------------------------------


def test_rollback_over_a_file_the_user_changed_after_the_session_changes_nothing(tmp_path: Path):
    ws = make_workspace(tmp_path / "ws", {"calc.py": "v0\n", "notes.md": "n0\n", "keep.txt": "k\n"})
    owner = os.stat(ws / "notes.md").st_uid, os.stat(ws / "notes.md").st_gid
    store = CheckpointStore(tmp_path / "cp.git", ws)
    assert recorded(store, 0).ok
    (ws / "calc.py").write_text("v1\n")
    (ws / "new.txt").write_text("box\n")
    assert recorded(store, 1).ok
    # After the session the user edits a file the rollback would touch, adds one, removes one.
    (ws / "calc.py").write_text("user's edit\n")
    (ws / "user.txt").write_text("mine\n")
    (ws / "notes.md").unlink()
    (ws / "new.txt").unlink()  # the rollback would remove it anyway: no conflict
    report = store.restore(0)
    assert {c.path: c.reason.split(" ")[0] for c in report.conflicts} == {
        "calc.py": "changed",
        "user.txt": "created",
        "notes.md": "removed",
    }
    assert not report.restored and not report.removed
    assert (ws / "calc.py").read_text() == "user's edit\n" and (ws / "user.txt").read_text() == "mine\n"
    # A file nobody touched, or one the user set back, is no conflict; after the user's own
    # changes are gone, the rollback runs.
    (ws / "calc.py").write_text("v1\n")
    (ws / "user.txt").unlink()
    (ws / "notes.md").write_text("n0\n")
    if ROOT:
        os.chown(ws / "notes.md", *owner)  # as it was: another owner would be a change too
    report = store.restore(0)
    assert not report.conflicts and (ws / "calc.py").read_text() == "v0\n" and not (ws / "new.txt").exists()
    # A chmod by the user is a change too.
    os.chmod(ws / "notes.md", 0o600)
    assert [c.path for c in store.restore(0).conflicts] == ["notes.md"]


# --- 4. holes -------------------------------------------------------------------------------------


def test_rollback_keeps_holes_and_charges_its_writes(tmp_path: Path):
    ws = make_workspace(tmp_path / "ws")
    size = 8 << 20
    with open(ws / "sparse.img", "wb") as fh:
        fh.truncate(size)
        fh.seek(size // 2)
        fh.write(b"data")
    budget = HostBudget()
    store = CheckpointStore(tmp_path / "cp.git", ws, budget=budget)
    assert recorded(store, 0).ok
    (ws / "sparse.img").unlink()
    assert recorded(store, 1).ok
    spent = budget.bytes_spent
    store.restore(0)
    st = os.stat(ws / "sparse.img")
    assert st.st_size == size and st.st_blocks * 512 <= 256 << 10, st.st_blocks  # not 8 MiB of zeros
    assert 0 < budget.bytes_spent - spent < 2 * size  # the restore's reads and writes were charged
    with open(ws / "sparse.img", "rb") as fh:
        fh.seek(size // 2)
        assert fh.read(4) == b"data"


def test_a_restore_past_its_budget_stops_typed(tmp_path: Path):
    ws = make_workspace(tmp_path / "ws", {f"f{i}.txt": os.urandom(64 << 10) for i in range(4)})
    store = CheckpointStore(tmp_path / "cp.git", ws, budget=HostBudget(max_bytes=(1 << 20)))
    assert recorded(store, 0).ok
    for i in range(4):
        (ws / f"f{i}.txt").unlink()
    assert recorded(store, 1).ok
    store.host_budget = HostBudget(max_bytes=100 << 10)
    with pytest.raises(BudgetExceeded) as caught:
        store.restore(0)
    assert caught.value.type.value == "resource_exhausted"
    assert sorted(os.listdir(ws)) == []  # refused before anything was written, not half-way


# --- 5. names, depth, failures --------------------------------------------------------------------


def test_invalid_utf8_names_are_stored_and_restored_and_later_checkpoints_still_work(tmp_path: Path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a"})
    bad = os.fsencode(str(ws)) + b"/bad\xff\xfe name\\x.txt"
    with open(bad, "wb") as fh:
        fh.write(b"payload")
    store = CheckpointStore(tmp_path / "cp.git", ws)
    cp0 = recorded(store, 0)
    assert cp0.ok and not cp0.skipped
    (ws / "a.txt").write_text("b")
    cp1 = store.record(1)
    assert cp1 is not None and cp1.ok and cp1.files_changed == ["a.txt"]
    os.unlink(bad)
    cp2 = recorded(store, 2)
    assert cp2.ok and [from_store(p) for p in cp2.files_changed] == [b"bad\xff\xfe name\\x.txt"]
    store.restore(0)
    assert open(bad, "rb").read() == b"payload" and (ws / "a.txt").read_text() == "a"
    json.loads((tmp_path / "cp.git" / "checkpoints.json").read_text())  # the index stays valid


def test_a_495_deep_chain_is_recorded_and_restored_without_recursion(tmp_path: Path):
    ws = make_workspace(tmp_path / "ws", {"top.txt": "t"})
    deep = os.fsencode(str(ws))
    fd = os.open(deep, os.O_RDONLY)
    for _ in range(495):
        os.mkdir("d", dir_fd=fd)
        sub = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = sub
    os.close(os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    os.close(fd)
    store = CheckpointStore(tmp_path / "cp.git", ws)
    cp0 = recorded(store, 0)
    assert cp0.ok and not cp0.skipped, cp0
    (ws / "top.txt").write_text("u")
    assert recorded(store, 1).ok
    import shutil

    os.rename(ws / "d", tmp_path / "gone")  # the box removes the chain
    shutil.rmtree(tmp_path / "gone", ignore_errors=True)
    cp2 = recorded(store, 2)
    assert cp2.ok and cp2.files_changed == ["/".join(["d"] * 495) + "/leaf.txt"]
    store.restore(0)
    assert os.path.exists(os.path.join(ws, *(["d"] * 495), "leaf.txt"))


def test_a_failed_checkpoint_reads_as_unknown_never_as_no_change(tmp_path: Path, monkeypatch):
    from orchestrator.loop import SessionResult, SessionStatus
    from orchestrator.loop.summary import changed_files, summary_json, summary_lines
    from orchestrator.workspace import records as sessions

    monkeypatch.setattr(sessions, "sessions_root", lambda: tmp_path / "sessions")
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a"})
    record = sessions.SessionRecord(
        id="s1",
        created=0.0,
        workspace=str(ws),
        mode=sessions.WorkspaceMode.BIND,
        box_workspace=str(ws),
        user="1000:1000",
        status="finished",
    )
    store_path = record.checkpoint_store
    store = CheckpointStore(store_path, ws)
    assert recorded(store, 0).ok
    for i in range(50):
        (ws / f"n{i}").write_text("x")
    store.host_budget = HostBudget(max_entries=10)  # the walk passes its entry budget: the record fails
    cp = store.record(1)
    assert cp is not None and cp.state == "failed" and cp.error_type == "resource_exhausted", cp
    listed = store.list()
    assert [c.state for c in listed] == ["ok", "failed"]
    assert "turn 1" in (unknown_changes(listed) or "")
    # summary, `sessions`: unknown, never "no files changed" / "0 files"
    changes = changed_files(record)
    assert changes.unknown and not changes
    result = SessionResult(status=SessionStatus.FINISHED, reason="done", turns=2)
    lines = summary_lines(result, changes)
    assert not any("no files changed" in line for line in lines) and any("unknown" in line for line in lines)
    assert summary_json(result, record, changes, 0)["changed_files_unknown"]
    assert "   ? files" in sessions.summary_line(record)
    # The next record walks everything again and is a good one: the unknown is resolved.
    store.host_budget = None
    cp = store.record(2)
    assert cp is not None and cp.ok and cp.files_changed_count == 50
    assert unknown_changes(store.list()) is None and "?" not in sessions.summary_line(record)


def test_a_failed_save_leaves_the_index_as_it_was(tmp_path: Path, monkeypatch):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a"})
    store = CheckpointStore(tmp_path / "cp.git", ws)
    assert recorded(store, 0).ok
    (ws / "a.txt").write_text("b")

    def broken(index):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "_save_index", broken)
    with pytest.raises(OSError):
        store.record(1)  # neither the checkpoint nor the failure could be saved: it says so
    assert [c.turn for c in store._index.checkpoints] == [0]
    monkeypatch.undo()
    cp = store.record(1)
    assert cp is not None and cp.ok and cp.files_changed == ["a.txt"]


# --- 6. parallel records --------------------------------------------------------------------------


def test_parallel_records_leave_a_valid_index_and_store(tmp_path: Path):
    ws = make_workspace(tmp_path / "ws", {"base.txt": "b"})
    store_path = tmp_path / "cp.git"
    store = CheckpointStore(store_path, ws)
    assert recorded(store, 0).ok
    errors: list[BaseException] = []
    got: list[int] = []

    def worker(n: int) -> None:
        try:
            for k in range(5):
                (ws / f"t{n}-{k}.txt").write_text(f"{n} {k}")
                cp = store.record(1 + n)  # the same early turn numbers, as MCP calls take them at their start
                if cp is not None:
                    assert cp.ok, cp
                    got.append(cp.turn)
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    listed = CheckpointStore(store_path, ws).list()
    turns = [c.turn for c in listed]
    assert turns == sorted(set(turns)) and sorted(got) == turns[1:]
    repo = pygit2.Repository(str(store_path))
    for c in listed:
        assert str(repo.references[f"refs/checkpoints/{c.turn}"].target) == c.commit
        assert repo[pygit2.Oid(hex=c.commit)].tree is not None
    assert [p for p in os.listdir(store_path) if p.endswith(".tmp")] == []
    final = store.record(1000)
    assert final is None or final.ok
    assert {to_store(n) for n in os.listdir(ws)} <= {"base.txt"} | {f"t{n}-{k}.txt" for n in range(8) for k in range(5)}


# --- a real box plants the names and the chain ----------------------------------------------------


@pytest.mark.docker
def test_a_box_planted_name_and_chain_do_not_break_checkpoints(open_sandbox, runtime, tmp_path: Path):
    ws = make_workspace(tmp_path / "ws", {"calc.py": "x = 1\n"})
    chown_tree(ws)
    if ROOT:
        os.chown(ws, SANDBOX_UID, SANDBOX_UID)
    store = CheckpointStore(tmp_path / "state" / "cp.git", ws)
    box = open_sandbox(ws)
    assert recorded(store, 0).ok
    out = box.call(
        "shell",
        {
            "command": "printf 'p' > \"$(printf 'bad\\377name')\" && "
            "d=.; for i in $(seq 300); do d=$d/d; done; mkdir -p $d && echo leaf > $d/leaf.txt && "
            "echo 'x = 2' > calc.py && printf s > private && chmod 600 private"
        },
    )
    assert out.ok, out
    cp = store.record(1)
    assert cp is not None and cp.ok, cp
    assert "calc.py" in cp.files_changed and b"bad\xffname" in {from_store(p) for p in cp.files_changed}
    box.close()
    store.restore(0)
    assert not (ws / "d").exists() and (ws / "calc.py").read_text() == "x = 1\n"
    store.restore(1)
    assert stat.S_IMODE(os.stat(ws / "private").st_mode) == 0o600
    assert open(os.fsencode(str(ws)) + b"/bad\xffname", "rb").read() == b"p"
