"""Copy mode's copy, review and apply, and the host git tool, fed the shared layer's hostile fixtures.

Each consumer of orchestrator/boxfs meets what a hostile box (or a hostile clone the user copies)
leaves behind: names with a newline or invalid UTF-8, a 1,000-deep chain, a sparse file with 16
hard links, a FIFO, a directory swapped for a symlink. Copy, changes and apply must neither break
a line, lose or mix up a name, recurse, expand a sparse file nor block; the git tool's status and
diff must answer on one line per entry, at once.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from orchestrator.boxfs import HostBudget, from_store, remove_tree, to_store
from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.tools.host_git import HostRepo
from orchestrator.workspace.copy import COPY_MAX_DEPTH, CopyManifest, copy_workspace
from orchestrator.workspace.review import apply_changes, list_changes, render_diff
from tests.helpers.boxfs import HOSTILE_NAMES, deep_chain
from tests.helpers.host_git import init_repo, run

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _remove_deep_trees(tmp_path):
    """pytest's own clean-up recurses: a 1,000-deep chain is removed here, iteratively."""
    yield
    fd = os.open(tmp_path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        remove_tree(fd, tmp_path.name, HostBudget(max_bytes=None, max_entries=None))
    finally:
        os.close(fd)


def take_copy(real: Path, tmp_path: Path, budget: HostBudget | None = None) -> CopyManifest:
    manifest = copy_workspace(real, tmp_path / "state" / "copy", os.getuid(), os.getgid(), budget=budget)
    path = tmp_path / "state" / "manifest.json"
    manifest.save(path)
    return CopyManifest.load(path)  # what `changes` and `apply` see: the stored manifest


def finishes(fn, seconds: float = 20.0):
    box: list = []
    thread = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert box, "the host hung on a box-written entry"
    return box[0]


def one_line_each(lines) -> None:
    for line in lines:
        assert "\n" not in line and "\r" not in line and "\x1b" not in line, repr(line)
        line.encode("utf-8")


def later(path: Path) -> None:
    """Move the mtime so a same-size rewrite is seen (as a box's write a moment later would be)."""
    st = os.lstat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000), follow_symlinks=False)


def test_hostile_names_survive_copy_manifest_changes_and_apply(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    names = HOSTILE_NAMES + [b"a\\xff"]  # a literal backslash-x beside a real \xff byte: never the same key
    for i, raw in enumerate(names):
        (real / os.fsdecode(raw)).write_bytes(b"old %d\n" % i)
    (real / os.fsdecode(b"dir\n\xfe")).mkdir()
    (real / os.fsdecode(b"dir\n\xfe/in\xffside")).write_bytes(b"inside\n")
    manifest = take_copy(real, tmp_path)
    assert {from_store(k) for k in manifest.entries} == set(names) | {b"dir\n\xfe", b"dir\n\xfe/in\xffside"}
    for key in manifest.entries:
        key.encode("utf-8")  # valid text: the JSON store can always hold it

    copy = Path(manifest.copy_dir)
    for i, raw in enumerate(names):
        (copy / os.fsdecode(raw)).write_bytes(b"new %d\n" % i)
        later(copy / os.fsdecode(raw))
    (copy / os.fsdecode(b"added\n\xfe")).write_bytes(b"added\n")
    (copy / os.fsdecode(b"dir\n\xfe/in\xffside")).unlink()
    changes = list_changes(manifest)
    assert {from_store(c.path) for c in changes} == set(names) | {b"added\n\xfe", b"dir\n\xfe/in\xffside"}
    one_line_each(render_diff(manifest, changes))
    one_line_each(render_diff(manifest, changes, stat=True))

    report = apply_changes(manifest)
    assert report.conflicts == [] and report.left_out == [], report.lines()
    one_line_each(report.lines())
    report.model_dump_json()  # the report stores too
    for i, raw in enumerate(names):
        assert (real / os.fsdecode(raw)).read_bytes() == b"new %d\n" % i, raw
    assert (real / os.fsdecode(b"added\n\xfe")).read_bytes() == b"added\n"
    assert not (real / os.fsdecode(b"dir\n\xfe/in\xffside")).exists()


def test_a_1000_deep_chain_in_the_real_workspace_is_refused_typed(tmp_path):
    """Deeper than the budget: a typed refusal naming the limit, and no half copy left behind."""
    real = tmp_path / "real"
    real.mkdir()
    deep_chain(real, 1000)
    dest = tmp_path / "state" / "copy"
    with pytest.raises(OpenAgentsError) as err:
        copy_workspace(real, dest, os.getuid(), os.getgid())
    assert err.value.type is ErrorType.RESOURCE_EXHAUSTED
    assert f"deeper than {COPY_MAX_DEPTH} levels" in str(err.value)
    assert not dest.exists()


def test_a_1000_deep_chain_made_by_the_box_is_reviewed_and_left_out(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "keep.txt").write_text("k\n")
    manifest = take_copy(real, tmp_path)
    copy = Path(manifest.copy_dir)
    (copy / "chain").mkdir()
    deep_chain(copy / "chain", 1000)
    (copy / "keep.txt").write_text("k2\n")
    later(copy / "keep.txt")
    changes = finishes(lambda: list_changes(manifest))
    assert any(c.path == "keep.txt" for c in changes)
    assert max(c.path.count("/") for c in changes) <= COPY_MAX_DEPTH
    one_line_each(finishes(lambda: list(render_diff(manifest, changes, stat=True))))
    report = finishes(lambda: apply_changes(manifest))
    assert report.conflicts == []
    assert (real / "keep.txt").read_text() == "k2\n"
    assert any("deeper than" in lo.reason for lo in report.left_out)
    depth, fd = 0, os.open(real / "chain", os.O_RDONLY | os.O_DIRECTORY)
    try:
        while "d" in os.listdir(fd):
            sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd, depth = sub, depth + 1
    finally:
        os.close(fd)
    assert depth < COPY_MAX_DEPTH - 1  # nothing the next copy would refuse was carried (chain/ is level 1)
    again = copy_workspace(real, tmp_path / "again", os.getuid(), os.getgid())  # the applied tree copies again
    assert again.entries


def blocks(path: Path) -> int:
    return os.lstat(path).st_blocks * 512


def test_a_sparse_file_with_16_hard_links_is_copied_once_and_applied_sparse(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    with open(real / "l0", "wb") as fh:
        fh.truncate(64 * MiB)
        fh.seek(32 * MiB)
        fh.write(b"data")
    for i in range(1, 16):
        os.link(real / "l0", real / f"l{i}")
    manifest = take_copy(real, tmp_path)
    copy = Path(manifest.copy_dir)
    assert {os.lstat(copy / f"l{i}").st_ino for i in range(16)} == {os.lstat(copy / "l0").st_ino}  # one inode, 16 names
    assert blocks(copy / "l0") < MiB  # holes kept
    assert set(manifest.entries) == {f"l{i}" for i in range(16)}
    assert list_changes(manifest) == []

    with open(copy / "l7", "r+b") as fh:  # the box writes through one name: all 16 changed
        fh.seek(48 * MiB)
        fh.write(b"more")
    for i in range(16):
        later(copy / f"l{i}")  # (one inode: once would do)
    (copy / "sparse").touch()
    os.truncate(copy / "sparse", 256 * MiB)
    changes = list_changes(manifest)
    assert {c.path for c in changes} == {f"l{i}" for i in range(16)} | {"sparse"}
    one_line_each(render_diff(manifest, changes))
    report = apply_changes(manifest)
    assert report.conflicts == [] and report.left_out == [], report.lines()
    for i in range(16):
        with open(real / f"l{i}", "rb") as fh:
            fh.seek(48 * MiB)
            assert fh.read(4) == b"more"
    total = sum(blocks(real / f"l{i}") for i in range(16)) + blocks(real / "sparse")
    assert total < 4 * MiB, f"apply expanded sparse data to {total} bytes"


def test_a_hard_link_the_box_adds_to_a_copied_group_is_still_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "a").write_text("a\n")
    os.link(real / "a", real / "b")
    manifest = take_copy(real, tmp_path)
    copy = Path(manifest.copy_dir)
    os.link(copy / "a", copy / "c")
    report = apply_changes(manifest)
    assert [lo.path for lo in report.left_out] == ["c"] and "hard link" in report.left_out[0].reason
    assert not (real / "c").exists()


def test_fifos_are_left_out_of_the_copy_and_never_block_review_or_apply(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    os.mkfifo(real / "user-fifo")
    (real / "f.txt").write_text("f\n")
    manifest = take_copy(real, tmp_path)
    assert "user-fifo" in manifest.left_out and "FIFO" in manifest.left_out["user-fifo"]
    copy = Path(manifest.copy_dir)
    os.mkfifo(copy / os.fsdecode(b"box\nfifo\xff"))
    os.unlink(copy / "f.txt")
    os.mkfifo(copy / "f.txt")  # a tracked file swapped for a FIFO
    changes = finishes(lambda: list_changes(manifest))
    one_line_each(finishes(lambda: list(render_diff(manifest, changes))))
    report = finishes(lambda: apply_changes(manifest))
    left = {from_store(lo.path) for lo in report.left_out}
    assert {b"box\nfifo\xff", b"f.txt"} <= left
    assert (real / "f.txt").read_text() == "f\n"
    assert stat.S_ISFIFO(os.lstat(real / "user-fifo").st_mode)


def test_a_directory_swapped_for_a_symlink_in_the_copy_is_not_written_through(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (real / "sub" / "x.txt").write_text("x\n")
    manifest = take_copy(real, tmp_path)
    copy = Path(manifest.copy_dir)
    (copy / "sub" / "x.txt").write_text("x2\n")
    later(copy / "sub" / "x.txt")
    os.rename(copy / "sub", copy / "moved")
    os.symlink(outside, copy / "sub")
    changes = list_changes(manifest)
    one_line_each(render_diff(manifest, changes))
    report = apply_changes(manifest)
    assert os.listdir(outside) == []
    assert not (real / "sub").is_symlink() and "absolute" in {lo.path: lo.reason for lo in report.left_out}["sub"]
    assert (real / "moved" / "x.txt").read_text() == "x2\n"


def test_a_huge_workspace_is_stopped_by_the_copy_budget_with_its_size(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    for i in range(8):
        (real / f"f{i}").write_bytes(os.urandom(MiB))
    dest = tmp_path / "state" / "copy"
    with pytest.raises(OpenAgentsError) as err:
        copy_workspace(real, dest, os.getuid(), os.getgid(), budget=HostBudget(max_bytes=3 * MiB), reflinks=False)
    assert err.value.type is ErrorType.RESOURCE_EXHAUSTED
    assert "more than 3.0 MiB of data" in str(err.value) and str(real) in str(err.value)
    assert not dest.exists()
    with pytest.raises(OpenAgentsError) as err:
        copy_workspace(real, dest, os.getuid(), os.getgid(), budget=HostBudget(max_entries=4))
    assert err.value.type is ErrorType.RESOURCE_EXHAUSTED and "entr" in str(err.value)
    assert not dest.exists()


def test_store_keys_are_lossless_for_every_hostile_name():
    for raw in HOSTILE_NAMES:
        assert from_store(to_store(raw)) == raw


# --------------------------------------------------------------------------------------------
# the host git tool on the same tree


def test_git_status_and_diff_on_hostile_names_deep_chain_and_fifo(tmp_path):
    ws = tmp_path / "ws"
    init_repo(ws, {"tracked.txt": "t\n"})
    for raw in HOSTILE_NAMES:
        (ws / os.fsdecode(raw)).write_bytes(b"x\n")
    (ws / "chain").mkdir()
    deep_chain(ws / "chain", 1000)
    os.mkfifo(ws / "fifo")
    (ws / "tracked.txt").unlink()
    os.mkfifo(ws / "tracked.txt")
    repo = HostRepo.open_at_start(ws)
    status = finishes(lambda: run(repo, subcommand="status"))
    diff = finishes(lambda: run(repo, subcommand="diff"))
    assert status.ok and diff.ok, (status, diff)
    lines = status.output.splitlines()
    assert len([line for line in lines if line.startswith("?? ")]) >= len(HOSTILE_NAMES)
    one_line_each(lines)
    one_line_each(diff.output.splitlines())
    assert "T tracked.txt (not a regular file: not read)" in status.output
    assert "deeper than 512 levels: not walked" in status.note


def test_hard_links_to_outside_the_tree_do_not_exhaust_descriptors(tmp_path):
    """Files whose other names are outside the workspace (a pnpm store, a `cp -al` backup): the copy
    remembers each inode for its later names, but never holds a descriptor per directory for it."""
    import resource

    outside, real = tmp_path / "store", tmp_path / "real"
    outside.mkdir()
    for i in range(600):
        (real / f"pkg{i}").mkdir(parents=True)
        (outside / f"f{i}").write_text(f"{i}\n")
        os.link(outside / f"f{i}", real / f"pkg{i}" / "index.js")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (400, hard))  # the copy holds at most HardLinks.max_dirs (256) for links
    try:
        manifest = copy_workspace(real, tmp_path / "state" / "copy", os.getuid(), os.getgid())
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert len(manifest.entries) == 1200
    assert (Path(manifest.copy_dir) / "pkg599" / "index.js").read_text() == "599\n"


def test_in_tree_link_groups_in_many_directories_all_stay_linked(tmp_path):
    """A directory's descriptor is let go once every name of its inodes was met, so the bound on
    held descriptors never stops an ordinary tree of many linked pairs from being deduplicated."""
    real = tmp_path / "real"
    for i in range(400):
        (real / f"d{i}").mkdir(parents=True)
        (real / f"d{i}" / "a").write_text(f"{i}\n")
        os.link(real / f"d{i}" / "a", real / f"d{i}" / "b")
    copy = Path(copy_workspace(real, tmp_path / "state" / "copy", os.getuid(), os.getgid()).copy_dir)
    for i in range(400):
        assert os.lstat(copy / f"d{i}" / "a").st_ino == os.lstat(copy / f"d{i}" / "b").st_ino


# --------------------------------------------------------------------------------------------
# a real box plants the tree in its copy (runc and runsc)

BOX_PLANT = r"""
set -e
mkfifo fifo
python3 - <<'PY'
import os
for raw in [b"new\nline", b"bad\xffutf8", b"esc\x1b[2J"]:
    open(raw, "wb").write(b"box\n")
open("pair-a", "r+b").write(b"BOX")  # through one name of the user's linked pair
fd = os.open(".", os.O_RDONLY)
os.mkdir("chain", dir_fd=fd); sub = os.open("chain", os.O_RDONLY, dir_fd=fd); os.close(fd); fd = sub
for _ in range(1000):
    os.mkdir("d", dir_fd=fd); sub = os.open("d", os.O_RDONLY, dir_fd=fd); os.close(fd); fd = sub
with open("sparse", "wb") as fh:
    fh.truncate(256 << 20); fh.write(b"head")
for i in range(16):
    os.link("sparse", f"hl{i}")
PY
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="chowning the copy to the sandbox uid needs root")
def test_a_real_box_plants_the_fixtures_in_its_copy_and_apply_stays_safe(tmp_path, open_sandbox, runtime):
    real = tmp_path / "real"
    real.mkdir()
    (real / "pair-a").write_text("user\n")
    os.link(real / "pair-a", real / "pair-b")
    manifest = copy_workspace(
        real, tmp_path / "state" / "copy", 1000, 1000
    )  # owned by the box's uid, as sessions make it
    box = open_sandbox(Path(manifest.copy_dir), user="1000:1000")
    result = box.call("shell", {"command": BOX_PLANT, "timeout_s": 120})
    assert result.ok, result

    changes = finishes(lambda: list_changes(manifest), 60)
    paths = {from_store(c.path) for c in changes}
    assert {b"new\nline", b"bad\xffutf8", b"pair-a", b"pair-b", b"sparse", b"hl0"} <= paths
    one_line_each(finishes(lambda: list(render_diff(manifest, changes)), 60))
    report = finishes(lambda: apply_changes(manifest), 60)
    assert report.conflicts == [], report.lines()
    one_line_each(report.lines())
    left = {from_store(lo.path) for lo in report.left_out}
    assert {b"sparse", b"hl0", b"hl15"} <= left  # hard links made in the box
    assert any("deeper than" in lo.reason for lo in report.left_out)
    assert (real / os.fsdecode(b"bad\xffutf8")).read_bytes() == b"box\n"
    assert (real / os.fsdecode(b"new\nline")).read_bytes() == b"box\n"
    assert (real / "pair-a").read_text() == (real / "pair-b").read_text() == "BOXr\n"
    assert not (real / "sparse").exists() and not (real / "fifo").exists()
