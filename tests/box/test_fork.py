"""Issue 37, `fork`: an ended copy session forked N ways, each a normal copy session.

With real containers and the real CLI in subprocesses (this worktree's code): a session run in copy
mode is forked 3 ways, each fork resumed with a different scripted model, `changes`/`apply` on one
and `discard` on the others; the parent and the siblings never see a fork's writes. A hostile
parent copy (a symlink out, a FIFO, a setuid file written by the box, a hard link to a host file)
stays inert in the forks. Refusals are typed: another user's session, a running, discarded or
bind-mode one, N out of range.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest

from tests.helpers import chown_tree, make_workspace
from tests.helpers.fork import oa, sessions_dir


def script(tmp_path: Path, name: str, turns: list[dict]) -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(t) + "\n" for t in turns))
    return f"script:{path}"


def write(path: str, content: str) -> dict:
    return {"name": "write_file", "arguments": {"path": path, "content": content}}


def shell(command: str) -> dict:
    return {"name": "shell", "arguments": {"command": command}}


RUN = ["--non-interactive", "--auto-approve", "--output", "json"]


def first_run(tmp_path: Path, ws: Path, calls: list[dict]) -> str:
    model = script(tmp_path, "parent.jsonl", [{"text": "", "tool_calls": calls}, {"text": "parent done"}])
    proc = oa(tmp_path, "run", "--workspace", str(ws), "--workspace-mode", "copy", "--model", model, *RUN, "start")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["session_id"]


@pytest.fixture(params=["copy", "overlay"])
def fork_mode(request, monkeypatch) -> str:
    """Both ways a fork's copy is made: a data copy (any host), a kernel overlay (a root host: workspace/cow.py)."""
    from orchestrator.workspace.overlay import unusable

    if request.param == "overlay" and unusable():
        pytest.skip(f"overlay forks: {unusable()}")
    monkeypatch.setenv("OA_FORK_COW", "copy" if request.param == "copy" else "auto")
    if (
        request.param == "overlay"
    ):  # the parent's copy a plain directory: one on a file system of its own (quota_fs) forks as data copies
        monkeypatch.setenv("OA_WRITE_QUOTA_FS", "watch")
    return str(request.param)


def inodes(root: Path) -> set[tuple[int, int]]:
    out = set()
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode):
                out.add((st.st_dev, st.st_ino))
    return out


@pytest.mark.docker
@pytest.mark.slow
def test_fork_three_ways_each_changed_differently_apply_one_discard_the_rest(sandbox_image, tmp_path, fork_mode):
    ws = make_workspace(tmp_path / "ws", {"calc.py": "def add(a, b):\n    return a - b\n", "keep.txt": "kept\n"})
    parent = first_run(tmp_path, ws, [write("base.txt", "from the parent\n")])
    proc = oa(tmp_path, "fork", parent, "-n", "3", "--output", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    forks = out["forks"]
    assert out["ok"] and out["parent"] == parent and len(set(forks)) == 3 and parent not in forks
    listed = {r["id"]: r for r in json.loads(oa(tmp_path, "sessions", "--json").stdout)}
    assert all(listed[f]["forked_from"] == parent and listed[f]["mode"] == "copy" for f in forks)
    assert f"(fork of {parent})" in oa(tmp_path, "sessions").stdout
    # each fork's copy is its own: no writable inode shared with the parent or a sibling
    copies = [sessions_dir(tmp_path) / f / "copy" for f in forks]
    parent_copy = sessions_dir(tmp_path) / parent / "copy"
    seen = inodes(parent_copy)
    for copy in copies:
        mine = inodes(copy)
        assert mine and not (mine & seen)
        seen |= mine
    # each fork goes on in its own box with a different model: different changes
    for i, fork in enumerate(forks):
        model = script(
            tmp_path,
            f"fork{i}.jsonl",
            [
                {
                    "text": "",
                    "tool_calls": [write(f"only{i}.txt", f"fork {i}\n"), write("base.txt", f"rewritten by fork {i}\n")],
                },
                {"text": f"fork {i} done"},
            ],
        )
        proc = oa(tmp_path, "run", "--resume", fork, "--model", model, *RUN, f"task {i}")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["session_id"] == fork
    for i, copy in enumerate(copies):
        assert sorted(p.name for p in copy.glob("only*.txt")) == [f"only{i}.txt"]
        assert (copy / "base.txt").read_text() == f"rewritten by fork {i}\n"
    assert not list(parent_copy.glob("only*.txt")) and (parent_copy / "base.txt").read_text() == "from the parent\n"
    if fork_mode == "overlay":  # each box's writes went to its fork's own upper layer, none to a layer they share
        uppers = [sessions_dir(tmp_path) / f / "cow" / "upper" for f in forks]
        layer_inodes = inodes(tmp_path / "state" / "openagents-sandbox" / "layers")
        for i, upper in enumerate(uppers):
            assert (upper / f"only{i}.txt").is_file() and (upper / "base.txt").read_text() == f"rewritten by fork {i}\n"
            assert not inodes(upper) & layer_inodes
        assert not set.intersection(*(inodes(u) for u in uppers))
    # changes / apply one: the parent's work and this fork's land, the siblings' do not
    diff = oa(tmp_path, "changes", forks[1])
    assert (
        diff.returncode == 0
        and "only1.txt" in diff.stdout
        and "base.txt" in diff.stdout
        and "only0.txt" not in diff.stdout
    )
    applied = oa(tmp_path, "apply", forks[1])
    assert applied.returncode == 0, applied.stderr
    assert (ws / "only1.txt").read_text() == "fork 1\n" and (ws / "base.txt").read_text() == "rewritten by fork 1\n"
    assert (
        not (ws / "only0.txt").exists()
        and not (ws / "only2.txt").exists()
        and (ws / "keep.txt").read_text() == "kept\n"
    )
    for fork in (forks[0], forks[2]):
        assert oa(tmp_path, "discard", fork).returncode == 0
    listed = {r["id"]: r for r in json.loads(oa(tmp_path, "sessions", "--json").stdout)}
    assert listed[forks[0]]["discarded"] and listed[forks[2]]["discarded"] and listed[forks[1]]["applied"]
    assert not listed[parent]["discarded"] and parent_copy.is_dir()


@pytest.mark.docker
def test_a_hostile_parent_copy_stays_inert_in_its_forks(sandbox_image, tmp_path, fork_mode):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST-SECRET\n")
    ws = make_workspace(tmp_path / "ws", {"a.txt": "alpha\n"})
    parent = first_run(tmp_path, ws, [shell(f"ln -s {secret} out.lnk && ln -s /etc/shadow shadow.lnk && echo done")])
    parent_copy = sessions_dir(tmp_path) / parent / "copy"
    assert os.path.islink(parent_copy / "out.lnk")
    # what the end-of-session sweep would quarantine, planted as a box mid-session leaves it: a FIFO
    # (a reader that opened it would block), a setuid file of the sandbox uid, a hard link to a host file
    os.mkfifo(parent_copy / "pipe")
    (parent_copy / "suid").write_text("#!/bin/sh\n")
    os.chown(parent_copy / "suid", 1000, 1000)
    os.chmod(parent_copy / "suid", 0o4755)
    try:
        os.link(secret, parent_copy / "hard.txt")
        linked = True
    except (
        OSError
    ) as err:  # the copy lies on a file system of its own (workspace/quota_fs.py): no host file can be linked into it
        assert err.errno == errno.EXDEV, err
        linked = False
    proc = oa(tmp_path, "fork", parent, "-n", "2", "--output", "json", timeout=120)
    assert proc.returncode == 0, proc.stderr
    forks = json.loads(proc.stdout)["forks"]
    secret_ino = os.stat(secret).st_ino
    for fork in forks:
        copy = sessions_dir(tmp_path) / fork / "copy"
        assert os.readlink(copy / "out.lnk") == str(secret) and os.path.islink(
            copy / "shadow.lnk"
        )  # copied as links, never followed
        assert not os.path.lexists(copy / "pipe")  # a FIFO is left out
        mode = os.lstat(copy / "suid").st_mode
        assert stat.S_ISREG(mode) and not mode & (stat.S_ISUID | stat.S_ISGID)
        if linked:
            hard = os.lstat(copy / "hard.txt")
            assert hard.st_ino != secret_ino and hard.st_nlink == 1 and hard.st_uid == 1000
            (copy / "hard.txt").write_text("overwritten in a fork\n")
    assert secret.read_text() == "HOST-SECRET\n"
    # the secret and the parent's planted link only; an overlay fork froze the parent's copy into a
    # layer first, made inert as a data copy is: the planted name got an inode of its own
    assert os.stat(secret).st_nlink == (2 if fork_mode == "copy" and linked else 1)


# -- refusals, typed ----------------------------------------------------------------------------------------
def _ended_copy_session(tmp_path: Path, monkeypatch) -> str:
    from orchestrator.workspace.records import WorkspaceMode, prepare

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = make_workspace(tmp_path / "ws", {"a.txt": "alpha\n"})
    record, _ = prepare(ws, WorkspaceMode.COPY, None)
    record.status, record.host_pid = "finished", 0
    record.save()
    return record.id


def test_fork_refusals_are_typed(tmp_path, monkeypatch):
    from orchestrator.errors import ErrorType, OpenAgentsError
    from orchestrator.workspace.fork import MAX_FORKS, fork_session
    from orchestrator.workspace.records import open_own_record

    sid = _ended_copy_session(tmp_path, monkeypatch)
    for n in (0, MAX_FORKS + 1, True):
        with pytest.raises(OpenAgentsError) as err:
            fork_session(sid, n)
        assert err.value.type == ErrorType.INVALID_ARGUMENTS
    assert oa(tmp_path, "fork", sid, "-n", str(MAX_FORKS + 1)).returncode == 2
    with pytest.raises(OpenAgentsError) as err:
        fork_session(sid, 1, turn=5)
    assert err.value.type == ErrorType.INVALID_ARGUMENTS
    record = open_own_record(sid)
    record.status, record.host_pid = "running", os.getpid()
    record.save()
    proc = oa(tmp_path, "fork", sid, "--output", "json")
    assert proc.returncode == 2 and "still running" in proc.stderr
    assert json.loads(proc.stdout)["error"]["type"] == "invalid_arguments"
    record.status, record.host_pid, record.discarded = "finished", 0, True
    record.save()
    proc = oa(tmp_path, "fork", sid)
    assert proc.returncode == 2 and "discarded" in proc.stderr
    # another user's session (its directory is theirs): refused, naming the owner, nothing made
    record.discarded = False
    record.save()
    os.chown(record.dir, 4242, 4242)
    os.chown(record.dir / "session.json", 4242, 4242)
    before = set(os.listdir(record.dir.parent))
    proc = oa(tmp_path, "fork", sid, "--output", "json")
    assert (
        proc.returncode == 2
        and json.loads(proc.stdout)["error"]["type"] == "permission_denied"
        and "uid 4242" in proc.stderr
    )
    assert set(os.listdir(record.dir.parent)) == before


def test_fork_of_a_fresh_copy_session_is_a_normal_copy_session(tmp_path, monkeypatch, fork_mode):
    from orchestrator.workspace.copy import CopyManifest
    from orchestrator.workspace.fork import fork_session
    from orchestrator.workspace.review import list_changes

    sid = _ended_copy_session(tmp_path, monkeypatch)
    forks = fork_session(sid, 2, box_on_copy=lambda path: False)  # no box ever ran on this copy
    for record in forks:
        assert (record.cow is not None) == (fork_mode == "overlay")
        assert record.forked_from == sid and record.status == "finished" and not record.running()
        manifest = CopyManifest.load(record.manifest_path)
        assert list_changes(manifest) == []  # nothing changed yet: the fork is the parent's start
        (Path(record.box_workspace) / "a.txt").write_text(f"{record.id}\n")
        assert [c.path for c in list_changes(CopyManifest.load(record.manifest_path))] == ["a.txt"]
    assert (tmp_path / "ws" / "a.txt").read_text() == "alpha\n"


def test_fork_at_a_checkpoint_turn_has_that_turns_files(tmp_path, monkeypatch, fork_mode):
    from orchestrator.workspace.checkpoints import CheckpointStore
    from orchestrator.workspace.copy import CopyManifest
    from orchestrator.workspace.fork import fork_session
    from orchestrator.workspace.records import open_own_record
    from orchestrator.workspace.review import list_changes

    sid = _ended_copy_session(tmp_path, monkeypatch)
    record = open_own_record(sid)
    copy = Path(record.box_workspace)
    with CheckpointStore(record.checkpoint_store, copy) as store:
        store.record(0)
        (copy / "a.txt").write_text("turn one\n")  # written as the box would: the sandbox uid's
        chown_tree(copy)
        store.record(1)
        (copy / "b.txt").write_text("turn two\n")
        chown_tree(copy)
        store.record(2)
    record.turns = 2
    record.save()
    (fork,) = fork_session(sid, 1, turn=1, box_on_copy=lambda path: False)
    assert (fork.cow is not None) == (fork_mode == "overlay")
    fork_copy = Path(fork.box_workspace)
    assert (fork_copy / "a.txt").read_text() == "turn one\n" and not (fork_copy / "b.txt").exists()
    assert fork.forked_turn == 1 and fork.turns == 1
    assert [c.path for c in list_changes(CopyManifest.load(fork.manifest_path))] == ["a.txt"]
    assert (copy / "b.txt").exists()  # the parent is untouched
    # the store's git objects are shared by hard links (host-written, written once), the rest is the fork's own
    objects = [p for p in (fork.dir / "checkpoints.git" / "objects").rglob("*") if p.is_file()]
    assert objects and all(os.stat(p).st_nlink >= 2 for p in objects)
    assert os.stat(fork.dir / "checkpoints.git" / "HEAD").st_ino != os.stat(record.checkpoint_store / "HEAD").st_ino
    with CheckpointStore(fork.checkpoint_store, fork_copy) as store:  # the fork's store goes on by itself
        (fork_copy / "c.txt").write_text("the fork's turn\n")
        chown_tree(fork_copy)
        store.record(2)
    with CheckpointStore(record.checkpoint_store, copy) as store:
        assert [p.turn for p in store.list() if p.ok] == [0, 1, 2] and store.restore(1).conflicts == []
    assert not (copy / "b.txt").exists() and (copy / "a.txt").read_text() == "turn one\n"


@pytest.mark.docker
def test_the_api_forks_a_closed_sandbox_only(sandbox_image, tmp_path, monkeypatch):
    from orchestrator import Sandbox
    from orchestrator.errors import ErrorType, OpenAgentsError
    from orchestrator.workspace.records import open_own_record

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = make_workspace(tmp_path / "ws", {"a.txt": "alpha\n"})
    with Sandbox(ws, mode="copy", auto_approve=True) as box:
        box.write_file("a.txt", "from the box\n")
        with pytest.raises(OpenAgentsError) as err:
            box.fork(1)
        assert err.value.type == ErrorType.INVALID_ARGUMENTS
    forks = box.fork(2)
    assert len(set(forks)) == 2
    for fork in forks:
        record = open_own_record(fork)
        assert record.forked_from == box.id and (Path(record.box_workspace) / "a.txt").read_text() == "from the box\n"
    with Sandbox(ws, mode="bind") as bound:
        pass
    with pytest.raises(OpenAgentsError) as err:
        bound.fork(1)
    assert err.value.type == ErrorType.INVALID_ARGUMENTS
