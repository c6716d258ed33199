"""Issue 37, copy-on-write forks (workspace/cow.py, workspace/overlay.py): where the host may mount
(root here and in CI), a fork's copy is a kernel overlay over the parent's frozen state.

Real overlay mounts, real files, the real CLI in subprocesses for "a later process": writes through
every fork (overwrite, append, chmod, delete, create) are seen by that fork alone, never by the
parent, a sibling or the frozen layer; a parent that goes on writing after a fork is frozen again
at the next one; a fork unmounted (a reboot) is mounted again by the next command that opens it,
and refused typed (never shown as "everything deleted") where it cannot be; discard unmounts and
removes, and the layers go when no session stands on them; the write quota counts what a fork's
writes cost on disk (a copied-up file), which the merged view does not show.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.helpers import chown_tree
from tests.helpers.fork import oa
from tests.helpers.fork_cow import _parent

pytestmark = pytest.mark.skipif(
    __import__("orchestrator.workspace.overlay", fromlist=["unusable"]).unusable() is not None,
    reason="overlay forks need a host that may mount (root)",
)


def no_box(path: str) -> bool:
    """These copies never had a box: nothing holds them (fork_session's box_on_copy)."""
    return False


def _as_box(copy: Path) -> None:
    chown_tree(copy)  # what a box writes is the sandbox user's


def _view(copy: Path) -> dict[str, tuple[bytes, int]]:
    out = {}
    for dirpath, _dirs, files in os.walk(copy):
        for name in files:
            path = Path(dirpath) / name
            out[str(path.relative_to(copy))] = (path.read_bytes(), os.lstat(path).st_mode & 0o7777)
    return out


def test_writes_through_every_overlay_fork_reach_that_fork_alone(tmp_path, monkeypatch):
    from orchestrator.workspace.copy import CopyManifest
    from orchestrator.workspace.fork import fork_session
    from orchestrator.workspace.records import open_own_record
    from orchestrator.workspace.review import list_changes

    sid = _parent(tmp_path, monkeypatch)
    forks = fork_session(sid, 3, box_on_copy=no_box)
    parent = open_own_record(sid)
    assert parent.cow is not None and all(f.cow is not None and f.cow.lowers == parent.cow.lowers for f in forks)
    layer = Path(parent.cow.lowers[0])
    before_parent, before_layer = _view(Path(parent.box_workspace)), _view(layer)
    for i, fork in enumerate(forks):
        copy = Path(fork.box_workspace)
        assert _view(copy) == before_parent  # a fork starts as the parent is
        assert CopyManifest.load(fork.manifest_path).copy_dir == fork.box_workspace and not list_changes(
            CopyManifest.load(fork.manifest_path)
        )
        (copy / "a.txt").write_text(f"fork {i}\n")
        with open(copy / "b.txt", "a") as fh:
            fh.write(f"appended by {i}\n")
        os.chmod(copy / "sub" / "c.txt", 0o600)
        (copy / "big.bin").unlink()
        (copy / f"new{i}.txt").write_text(f"{i}\n")
        _as_box(copy)
    for i, fork in enumerate(forks):
        view = _view(Path(fork.box_workspace))
        assert view["a.txt"][0] == f"fork {i}\n".encode() and view["b.txt"][0] == f"beta\nappended by {i}\n".encode()
        assert view["sub/c.txt"][1] == 0o600 and "big.bin" not in view
        assert sorted(k for k in view if k.startswith("new")) == [f"new{i}.txt"]
        changed = {c.path for c in list_changes(CopyManifest.load(fork.manifest_path))}
        assert changed == {"a.txt", "b.txt", "sub/c.txt", "big.bin", f"new{i}.txt"}
    assert _view(Path(parent.box_workspace)) == before_parent and _view(layer) == before_layer
    assert list_changes(CopyManifest.load(parent.manifest_path)) == []
    # the parent goes on (as `run --resume` would) and is forked again: its new state is frozen first
    (Path(parent.box_workspace) / "later.txt").write_text("the parent's later work\n")
    _as_box(Path(parent.box_workspace))
    (again,) = fork_session(sid, 1, box_on_copy=no_box)
    parent = open_own_record(sid)
    assert again.cow is not None and len(again.cow.lowers) == 2 and again.cow.lowers == parent.cow.lowers
    assert (Path(again.box_workspace) / "later.txt").read_text() == "the parent's later work\n"
    (Path(parent.box_workspace) / "later.txt").write_text("changed after the second fork\n")
    assert (Path(again.box_workspace) / "later.txt").read_text() == "the parent's later work\n"
    for fork in forks:
        assert not (Path(fork.box_workspace) / "later.txt").exists()


def test_a_fork_is_mounted_again_in_a_later_process_and_discard_removes_it(tmp_path, monkeypatch):
    from orchestrator.workspace.cleanup import remove_unused_layers
    from orchestrator.workspace.fork import fork_session
    from orchestrator.workspace.overlay import is_mounted, layers_root, unmount
    from orchestrator.workspace.records import open_own_record

    sid = _parent(tmp_path, monkeypatch)
    one, two = fork_session(sid, 2, box_on_copy=no_box)
    (Path(one.box_workspace) / "a.txt").write_text("changed in the fork\n")
    _as_box(Path(one.box_workspace))
    for record in (one, two, open_own_record(sid)):
        unmount(Path(record.box_workspace))  # as a reboot leaves them
        assert not is_mounted(Path(record.box_workspace))
    # a later process that may not mount: refused typed, never "every file deleted"
    monkeypatch.setenv("OA_FORK_COW", "copy")
    proc = oa(tmp_path, "changes", one.id)
    assert proc.returncode != 0 and "not mounted" in proc.stderr and "deleted" not in proc.stdout
    monkeypatch.setenv("OA_FORK_COW", "auto")
    proc = oa(tmp_path, "changes", one.id)
    assert proc.returncode == 0, proc.stderr
    assert "a.txt" in proc.stdout and "b.txt" not in proc.stdout
    assert is_mounted(Path(one.box_workspace))
    from orchestrator.workspace.records import state_bytes

    assert state_bytes(open_own_record(two.id)) < 1 << 20  # its own disk: not the layer's MiB seen through its mount
    # discard, in later processes too: unmounted and removed; the layer goes with the last session on it
    for record in (one, two):
        assert oa(tmp_path, "discard", record.id).returncode == 0
        assert not is_mounted(Path(record.box_workspace)) and not (record.dir / "cow").exists()
    layers = os.listdir(layers_root())
    assert len(layers) == 1
    assert remove_unused_layers(now=time.time() + 3600) == []  # the parent stands on it
    assert oa(tmp_path, "discard", sid).returncode == 0
    assert not is_mounted(Path(open_own_record(sid, mount=False).box_workspace))
    remove_unused_layers(
        now=time.time() + 3600
    )  # (the discard removed it already unless it was made under LAYER_GRACE_S ago)
    assert os.listdir(layers_root()) == []
    listed = {r["id"]: r for r in json.loads(oa(tmp_path, "sessions", "--json").stdout)}
    assert all(listed[i]["discarded"] for i in (sid, one.id, two.id))


def test_the_write_quota_counts_what_a_forks_writes_cost_on_disk(tmp_path, monkeypatch):
    from orchestrator.sandbox.sweep_journal import capture_baseline
    from orchestrator.workspace.fork import fork_session
    from orchestrator.workspace.overlay import fork_upper
    from orchestrator.workspace.quota import WriteQuota

    sid = _parent(tmp_path, monkeypatch)
    (fork,) = fork_session(sid, 1, box_on_copy=no_box)
    copy = Path(fork.box_workspace)
    upper = fork_upper(copy)
    assert upper == fork.dir / "cow" / "upper" and fork_upper(tmp_path / "ws") is None
    baseline = capture_baseline(copy)
    counted = WriteQuota(copy, 512 << 10, baseline.usage_bytes, start_entries=baseline.entries, layer=upper)
    merged_only = WriteQuota(copy, 512 << 10, baseline.usage_bytes, start_entries=baseline.entries)
    with open(copy / "big.bin", "r+b") as fh:  # one byte changed: the whole MiB is copied up into the fork's upper
        fh.write(b"\2")
    assert counted.check() and counted.growth >= 1 << 20 and "write quota" in counted.message()
    assert not merged_only.check()  # the merged view did not grow: measuring it would miss the MiB


def test_a_freeze_cut_short_is_finished_when_the_parent_is_opened(tmp_path, monkeypatch):
    from orchestrator.workspace.fork import fork_session
    from orchestrator.workspace.overlay import unmount
    from orchestrator.workspace.records import open_own_record

    sid = _parent(tmp_path, monkeypatch)
    fork_session(sid, 1, box_on_copy=no_box)
    parent = open_own_record(sid)
    assert parent.cow is not None
    copy, tree = Path(parent.box_workspace), Path(parent.cow.lowers[0])
    unmount(copy)  # as if the host died after saving the record, before moving the copy into its layer
    os.rmdir(copy)
    os.rename(tree, copy)
    reopened = open_own_record(sid)
    assert (Path(reopened.box_workspace) / "a.txt").read_text() == "alpha\n" and tree.is_dir()


def test_an_older_object_of_a_frozen_parent_keeps_its_layers(tmp_path, monkeypatch):
    """The API and best-of-N hold a parent's record object from before the fork froze it; saving or
    discarding through that object must neither forget the layers nor remove the copy through the mount."""
    from orchestrator.workspace.cleanup import discard_state, remove_unused_layers
    from orchestrator.workspace.fork import fork_session
    from orchestrator.workspace.overlay import is_mounted, mounted_lowers
    from orchestrator.workspace.records import open_own_record

    sid = _parent(tmp_path, monkeypatch)
    held = open_own_record(sid)
    (fork,) = fork_session(sid, 1, box_on_copy=no_box)
    assert held.cow is None
    held.reason = "saved later through an older object"
    held.save()
    assert (
        held.cow is not None
        and fork.cow is not None
        and held.cow.lowers == fork.cow.lowers == open_own_record(sid).cow.lowers
    )
    discard_state(held)
    assert not is_mounted(Path(held.box_workspace)) and fork.cow is not None
    assert set(fork.cow.lowers) <= mounted_lowers()
    remove_unused_layers(now=time.time() + 3600)  # the fork stands on the layer: it stays
    assert (Path(fork.box_workspace) / "a.txt").read_text() == "alpha\n"


def test_where_nobody_can_tell_whether_a_box_holds_the_copy_the_forks_are_data_copies(tmp_path, monkeypatch):
    from orchestrator.workspace.fork import fork_session
    from orchestrator.workspace.overlay import mounts_under
    from orchestrator.workspace.records import open_own_record

    sid = _parent(tmp_path, monkeypatch)
    for unknown in (None, lambda path: None):  # no check given; a daemon that did not answer
        (fork,) = fork_session(sid, 1, box_on_copy=unknown)
        assert fork.cow is None and open_own_record(sid).cow is None
        assert (Path(fork.box_workspace) / "a.txt").read_text() == "alpha\n" and not mounts_under(
            Path(fork.box_workspace)
        )  # no overlay


def test_layers_are_kept_while_a_record_cannot_be_read(tmp_path, monkeypatch):
    """A record that cannot be read may be a session standing on any layer: while one is there no
    layer is removed, even one no readable record stands on; once it is gone, the unused one goes."""
    from orchestrator.workspace.cleanup import discard_state, remove_unused_layers
    from orchestrator.workspace.fork import fork_session
    from orchestrator.workspace.overlay import layers_root, unmount
    from orchestrator.workspace.records import open_own_record

    sid = _parent(tmp_path, monkeypatch)
    (fork,) = fork_session(sid, 1, box_on_copy=no_box)
    garbled = open_own_record(fork.id).dir / "session.json"
    kept = garbled.read_bytes()
    discard_state(open_own_record(sid))
    unmount(
        Path(fork.box_workspace)
    )  # as a reboot leaves it: no mount says the fork stands on the layer, only its record
    garbled.write_bytes(b"{not json")
    assert remove_unused_layers(now=time.time() + 3600) == [] and len(os.listdir(layers_root())) == 1
    garbled.write_bytes(kept)
    discard_state(open_own_record(fork.id))
    remove_unused_layers(now=time.time() + 3600)  # (the discard may have removed it already)
    assert os.listdir(layers_root()) == []
