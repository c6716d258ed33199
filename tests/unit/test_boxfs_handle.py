"""boxfs.BoxDir, the handle every consumer of box-written files holds, and boxfs.private, for
host-owned files: each act follows no link, stays under its directory and is bounded."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from orchestrator.boxfs import BoxDir, BudgetExceeded, HostBudget, remove_path
from orchestrator.boxfs.private import create_private, open_private, open_private_dir
from orchestrator.errors import ErrorType, OpenAgentsError


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace with a link to an outside directory and one to an outside file."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (ws / "dir").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_text("host secret")
    os.chmod(outside / "secret", 0o644)
    (ws / "up").symlink_to(outside)
    (ws / "dir" / "file").write_text("mine")
    (ws / "dir" / "to-secret").symlink_to(outside / "secret")
    return ws, outside


def test_directories_are_entered_without_following_a_link(tree: tuple[Path, Path]) -> None:
    ws, _ = tree
    with BoxDir.open(ws) as top:
        with pytest.raises(OSError) as err:
            top.sub("up")
        assert err.value.errno in (errno.ELOOP, errno.ENOTDIR)
        with pytest.raises(OSError) as err:
            top.sub_path("up/secret")
        assert err.value.errno in (errno.ELOOP, errno.ENOTDIR)
        with top.sub_path(b"dir") as d:
            assert d.rel == b"dir"
            assert sorted(d.names()) == [b"file", b"to-secret"]
            assert d.readlink("to-secret") == os.fsencode(tree[1] / "secret")
        with pytest.raises(OpenAgentsError) as typed:
            top.parent_of("up/secret")
        assert typed.value.type is ErrorType.UNSAFE_WORKSPACE_FILE
        with pytest.raises(OpenAgentsError) as typed:
            top.read("up", 100)  # a link is never read as a file
        assert typed.value.type is ErrorType.UNSAFE_WORKSPACE_FILE


def test_listing_is_bounded_by_the_budget(tmp_path: Path) -> None:
    for i in range(50):
        (tmp_path / f"f{i}").touch()
    with BoxDir.open(tmp_path, HostBudget(max_entries=10)) as top:
        with pytest.raises(BudgetExceeded):
            top.names()
        assert top.has_name(lambda n: n == b"f7")
        assert not top.is_empty()


def test_changes_never_go_through_a_link(tree: tuple[Path, Path]) -> None:
    ws, outside = tree
    secret = outside / "secret"
    with BoxDir.open(ws) as top, top.sub("dir") as d:
        d.chmod_entry("to-secret", lambda st: 0o777)  # a link: nothing changes, its target least of all
        assert secret.stat().st_mode & 0o777 == 0o644
        with pytest.raises(FileExistsError):
            d.create("to-secret")  # O_EXCL|O_NOFOLLOW: never written through
        assert secret.read_text() == "host secret"
        d.replace_link(b"elsewhere", "to-secret")  # the link itself is replaced, its target untouched
        assert os.readlink(ws / "dir" / "to-secret") == "elsewhere"
        assert secret.read_text() == "host secret"
        d.write_atomic("file", b"new", mode=0o640)
        assert (ws / "dir" / "file").read_bytes() == b"new"
        assert sorted(d.names()) == [b"file", b"to-secret"]  # no temporary name left behind
        d.remove_tree("to-secret")
        assert secret.exists()
    with BoxDir.open(ws) as top:
        top.remove_tree("up")  # removes the link, not the directory it names
        assert secret.read_text() == "host secret"
        walked = sorted(e.rel for e in top.entries())
        assert walked == [b"dir", b"dir/file"]


def test_host_owned_files_are_opened_without_following_a_link(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("keep")
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "dirlink").symlink_to(tmp_path)
    with pytest.raises(FileExistsError):
        create_private(tmp_path / "link")
    with pytest.raises(OSError) as err:
        open_private(tmp_path / "link", os.O_WRONLY | os.O_TRUNC)
    assert err.value.errno in (errno.ELOOP, errno.ENOTDIR)
    with pytest.raises(OSError) as err:
        open_private_dir(tmp_path / "dirlink")
    assert err.value.errno in (errno.ELOOP, errno.ENOTDIR)
    os.close(open_private_dir(tmp_path / "dirlink", follow=True))
    assert target.read_text() == "keep"
    fd = create_private(tmp_path / "new", 0o640)
    os.close(fd)
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o640


def test_remove_path_removes_links_never_their_targets(tmp_path: Path) -> None:
    """boxfs.remove_path (shutil.rmtree's place for our trees: a plug-in's scratch workspace, a
    shadow repository): a tree the box may have written, with links out to a file and a directory
    and a deep chain, goes; what the links point at stays; a missing path is no error."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    scratch = tmp_path / "scratch"
    deep = scratch.joinpath(*["d"] * 40)
    deep.mkdir(parents=True)
    (deep / "f").write_text("x")
    (scratch / "to-file").symlink_to(outside / "keep.txt")
    (scratch / "to-dir").symlink_to(outside)
    (deep / "up").symlink_to(outside)
    remove_path(scratch)
    assert not os.path.lexists(scratch)
    assert (outside / "keep.txt").read_text() == "keep"
    remove_path(scratch)  # already gone: nothing to do
