"""The caller's sessions by id from Python (issue 46), against real boxes: list them by label,
open one again by id (an API session, a fork made by `box.fork(n)`), show, apply, discard, roll
back, report and fork by id without opening a box, and prune's age rule for copies never landed."""

from __future__ import annotations

import time
import uuid

import pytest

from orchestrator import ErrorType, OpenAgentsError, Sandbox, sessions
from tests.helpers import make_workspace

pytestmark = pytest.mark.usefixtures("sandbox_image")


@pytest.fixture
def own_state(tmp_path, monkeypatch):
    """A state directory of this test's own: prune sees only its sessions."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def test_list_reopen_and_apply_by_id(tmp_path, own_state):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    label = uuid.uuid4().hex
    with Sandbox(ws, mode="copy", labels={"task": label, "team": "red"}) as box:
        box.write_file("a.txt", "changed\n")
    with Sandbox(ws, mode="copy", labels={"task": "other"}) as other:
        other.write_file("o.txt", "o\n")
    found = sessions.list_sessions(labels={"task": label})
    assert [r.id for r in found] == [box.id] and found[0].labels == {"task": label, "team": "red"}
    assert {r.id for r in sessions.list_sessions()} >= {box.id, other.id}
    assert sessions.list_sessions(labels={"task": label, "team": "blue"}) == []

    assert [(f.path, f.status) for f in sessions.changes(box.id).files] == [("a.txt", "modified")]
    with Sandbox(resume=box.id) as again:  # no workspace: the session's own; no model: no conversation needed
        assert again.id == box.id and again.read_file("a.txt").text == "changed\n"
        again.write_file("b.txt", "b\n")
    assert sessions.session(box.id).labels["task"] == label  # kept on resume
    assert (ws / "a.txt").read_text() == "a\n"
    applied = sessions.apply(box.id)
    assert applied.ok and sorted(applied.applied) == ["a.txt", "b.txt"]
    assert (ws / "a.txt").read_text() == "changed\n" and sessions.session(box.id).applied
    assert sessions.discard(other.id) > 0 and sessions.session(other.id).discarded
    with pytest.raises(OpenAgentsError) as gone:
        sessions.changes(other.id)
    assert gone.value.type is ErrorType.INVALID_ARGUMENTS
    with pytest.raises(OpenAgentsError) as bad:
        sessions.session("../etc")
    assert bad.value.type is ErrorType.INVALID_ARGUMENTS


def test_a_fork_made_by_box_fork_is_opened_and_run(tmp_path, own_state):
    ws = make_workspace(tmp_path / "ws", {"notes.txt": "start\n"})
    with Sandbox(ws, mode="copy", labels={"experiment": "forks"}) as box:
        box.write_file("notes.txt", "before the fork\n")
    forks = box.fork(2)
    with Sandbox(ws, resume=forks[0]) as fork:  # was refused: "it has no conversation to continue"
        assert fork.read_file("notes.txt").text == "before the fork\n"
        assert (
            fork.shell("echo from the fork >> notes.txt && cat notes.txt").output == "before the fork\nfrom the fork\n"
        )
    assert sessions.changes(forks[0]).diff.count("+from the fork") == 1
    assert sessions.changes(forks[1]).files[0].path == "notes.txt"  # its own copy: the parent's state only
    assert {r.id for r in sessions.list_sessions(labels={"experiment": "forks"})} == {box.id, *forks}
    more = sessions.fork(forks[0], 1)
    assert sessions.session(more[0]).forked_from == forks[0]


def test_rollback_report_and_checkpoints_by_id(tmp_path, own_state):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "start\n"})
    with Sandbox(ws, mode="copy") as box:
        box.write_file("a.txt", "one\n")
        box.write_file("a.txt", "two\n")
    turns = [point.turn for point in sessions.checkpoints(box.id) if point.ok]
    assert turns[0] == 0 and len(turns) >= 3
    report = sessions.rollback(box.id, 0)
    assert report.restored == ["a.txt"] and not report.conflicts
    assert "+two" not in sessions.changes(box.id).diff and "+one" not in sessions.changes(box.id).diff
    page = sessions.report(box.id, tmp_path / "r.html")
    assert box.id in page and (tmp_path / "r.html").read_text() == page
    with pytest.raises(OpenAgentsError) as beyond:
        sessions.rollback(box.id, 99)
    assert beyond.value.type is ErrorType.INVALID_ARGUMENTS


def test_prune_removes_unlanded_copies_by_a_documented_age(tmp_path, own_state):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    with Sandbox(ws, mode="copy") as unlanded:
        unlanded.write_file("a.txt", "work\n")
    with Sandbox(ws) as bound:
        bound.shell("true")
    time.sleep(0.1)
    pruned = sessions.prune(0)  # the default age rule: an unlanded copy is kept until 30 days old
    assert [r.id for r, _ in pruned.removed] == [bound.id]
    assert [(r.id, why) for r, why in pruned.kept] == [
        (unlanded.id, "a copy session not yet applied or discarded: its copy is all there is of its work")
    ]
    assert sessions.UNLANDED_KEEP_S == 30 * 86400
    pruned = sessions.prune(0, unlanded_older_than_s=0.05)
    assert [r.id for r, _ in pruned.removed] == [unlanded.id] and pruned.freed > 0
    assert sessions.list_sessions() == []
