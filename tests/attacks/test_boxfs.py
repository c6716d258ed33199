"""The shared safe layer for box-written files (orchestrator/boxfs), attacked once for all its users.

Each test plants what a hostile box would (links, swaps between check and use, FIFOs, devices,
sparse files, hard links, names with newlines and invalid UTF-8, 1,000-deep trees, many empty
files) and shows the layer neither follows, blocks, expands, recurses nor breaks a line on it.
The last test has a real box plant the tree, under runc and runsc.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time

import pytest

from orchestrator.boxfs import (
    BudgetExceeded,
    HardLinks,
    HostBudget,
    Walk,
    copy_regular,
    from_store,
    read_at,
    read_workspace_file,
    remove_tree,
    show,
    to_store,
    write_atomic,
)
from orchestrator.errors import ErrorType, OpenAgentsError
from tests.helpers.boxfs import HOSTILE_NAMES, deep_chain


def test_names_show_on_one_line_and_store_losslessly():
    for raw in HOSTILE_NAMES:
        shown = show(raw)
        assert "\n" not in shown and "\t" not in shown and "\x1b" not in shown
        shown.encode("utf-8")  # always encodable
        kept = to_store(raw)
        assert from_store(json.loads(json.dumps(kept, ensure_ascii=False))) == raw
    assert show(b"bad\xffutf8") == "bad\\xffutf8"
    assert len({to_store(n) for n in HOSTILE_NAMES}) == len(HOSTILE_NAMES)
    assert to_store(b"a\\xff") != to_store(b"a\xff")  # a literal backslash-x is not a byte


def test_walk_follows_no_link_and_names_are_bytes(tmp_path):
    outside = tmp_path / "outside"
    (outside / "secret").mkdir(parents=True)
    (outside / "secret" / "key").write_text("host secret")
    ws = tmp_path / "ws"
    ws.mkdir()
    os.symlink(outside, ws / "link")
    os.symlink("loop", ws / "loop")
    for raw in HOSTILE_NAMES:
        (ws / os.fsdecode(raw)).write_bytes(b"x")
    walk = Walk(ws)
    rels = {e.rel for e in walk.entries()}
    assert b"link" in rels and b"loop" in rels
    assert not any(r.startswith(b"link/") for r in rels)
    assert set(HOSTILE_NAMES) <= rels
    assert walk.complete


def test_a_directory_swapped_for_a_link_mid_walk_is_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host secret")
    ws = tmp_path / "ws"
    (ws / "dir").mkdir(parents=True)

    def swap(entry) -> bool:
        if entry.rel == b"dir":
            os.rename(ws / "dir", ws / "moved")
            os.symlink(outside, ws / "dir")
        return True

    walk = Walk(ws, enter=swap)
    rels = {e.rel for e in walk.entries()}
    assert b"dir/secret" not in rels
    assert not walk.complete and walk.unreadable[0][0] == b"dir"


def test_a_thousand_deep_tree_costs_no_recursion_and_says_it_is_incomplete(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    deep_chain(ws, 1000)
    walk = Walk(ws, HostBudget(max_depth=512))
    count = sum(1 for _ in walk.entries())
    assert count == 512
    assert not walk.complete and walk.too_deep
    # the iterative remover takes it all, with no RecursionError and no link followed
    remove_tree(os.open(ws, os.O_RDONLY | os.O_DIRECTORY), "d", HostBudget())
    assert os.listdir(ws) == []


def test_the_entry_budget_stops_a_tree_of_many_empty_files_before_it_is_held(tmp_path):
    ws = tmp_path / "ws"
    (ws / "many").mkdir(parents=True)
    fd = os.open(ws / "many", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(20_000):
            os.close(os.open(str(i), os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    with pytest.raises(BudgetExceeded) as caught:
        for _ in Walk(ws, HostBudget(max_entries=5_000)).entries():
            pass
    assert caught.value.type == ErrorType.RESOURCE_EXHAUSTED and "entry" in str(caught.value)


def test_the_wall_clock_stops_host_work(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(100):
        (ws / str(i)).write_text("x")
    budget = HostBudget.until(0.0)
    time.sleep(0.01)
    with pytest.raises(BudgetExceeded, match="wall-time"):
        list(Walk(ws, budget.slice(10)).entries())


def test_reads_refuse_fifos_devices_links_and_oversize_without_blocking(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    os.mkfifo(ws / "fifo")
    os.mknod(ws / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    (tmp_path / "secret").write_text("host secret")
    os.symlink(tmp_path / "secret", ws / "link")
    os.symlink(tmp_path, ws / "parent")
    (ws / "big").write_bytes(b"x" * 2000)
    with open(ws / "sparse", "wb") as fh:
        fh.truncate(1 << 40)
    done = threading.Event()

    def attempts():
        for rel in ("fifo", "null", "link", "parent/secret", "big", "sparse"):
            with pytest.raises(OpenAgentsError) as caught:
                read_workspace_file(ws, rel, 1000)
            assert caught.value.type == ErrorType.UNSAFE_WORKSPACE_FILE, rel
            assert "host secret" not in str(caught.value)
        done.set()

    thread = threading.Thread(target=attempts, daemon=True)
    thread.start()
    thread.join(10)
    assert done.is_set(), "a read blocked on a box-written entry"


def test_a_file_swapped_for_a_fifo_between_check_and_open_is_refused(tmp_path, monkeypatch):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_text("ok")
    real_open = os.open

    def swapping_open(path, flags, mode=0o777, *, dir_fd=None):
        if path in (b"f", "f") and dir_fd is not None:
            os.unlink("f", dir_fd=dir_fd)
            os.mkfifo("f", dir_fd=dir_fd)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    monkeypatch.setattr(os, "open", swapping_open)
    try:
        with pytest.raises(OpenAgentsError) as caught:
            read_at(fd, b"f", 100)
    finally:
        monkeypatch.undo()
        os.close(fd)
    assert caught.value.type == ErrorType.UNSAFE_WORKSPACE_FILE


def test_copies_keep_holes_and_hard_links_never_expand(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    with open(src / "sparse", "wb") as fh:
        fh.seek(16 << 20)
        fh.write(b"end")
    for i in range(15):
        os.link(src / "sparse", src / f"link{i}")
    budget = HostBudget()
    links = HardLinks()
    sfd, dfd = os.open(src, os.O_RDONLY | os.O_DIRECTORY), os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in sorted(os.listdir(src)):
            copy_regular(sfd, os.fsencode(name), dfd, budget, mode=0o644, links=links, reflinks=False)
    finally:
        links.close()
        os.close(sfd)
        os.close(dfd)
    copies = [os.stat(dst / n) for n in os.listdir(dst)]
    assert len({c.st_ino for c in copies}) == 1 and copies[0].st_nlink == 16
    assert copies[0].st_size == (16 << 20) + 3
    assert copies[0].st_blocks * 512 < 1 << 20, "the holes were written as data"
    assert budget.bytes_spent < 1 << 20
    assert (dst / "link3").read_bytes()[-3:] == b"end"


def test_the_byte_budget_stops_a_copy(tmp_path):
    (tmp_path / "big").write_bytes(os.urandom(4 << 20))
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    (tmp_path / "out").mkdir()
    out = os.open(tmp_path / "out", os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(BudgetExceeded, match="byte"):
            copy_regular(fd, b"big", out, HostBudget(max_bytes=1 << 20), mode=0o644, reflinks=False)
    finally:
        os.close(fd)
        os.close(out)


def test_atomic_writes_keep_mode_owner_and_holes_and_leave_nothing_on_failure(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        data = b"\0" * (8 << 20) + b"tail"
        st = write_atomic(fd, b".env", data, HostBudget(), mode=0o600 | stat.S_ISUID, uid=1234, gid=2345)
        assert stat.S_IMODE(st.st_mode) == 0o600 and (st.st_uid, st.st_gid) == (1234, 2345)
        assert st.st_blocks * 512 < 1 << 20 and (tmp_path / ".env").read_bytes() == data
        with pytest.raises(BudgetExceeded):
            write_atomic(fd, b".env", os.urandom(1 << 20), HostBudget(max_bytes=1000), mode=0o644)
        assert sorted(os.listdir(tmp_path)) == [".env"], "a failed write left its temporary file"
        assert (tmp_path / ".env").read_bytes() == data, "a failed write changed the old file"
    finally:
        os.close(fd)


def test_remove_tree_removes_links_not_their_targets(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("host file")
    tree = tmp_path / "tree" / "a" / "b"
    tree.mkdir(parents=True)
    os.symlink(outside, tree / "link")
    os.symlink(outside / "keep", tree / "filelink")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        remove_tree(fd, "tree", HostBudget())
    finally:
        os.close(fd)
    assert not (tmp_path / "tree").exists() and (outside / "keep").read_text() == "host file"


PLANT = r"""
set -e
ln -s /etc etc-link
ln -s /proc/1/environ env-link
mkfifo fifo
python3 - <<'PY'
import os
for raw in [b"new\nline", b"bad\xffutf8", b"esc\x1b[2J"]:
    open(raw, "wb").write(b"x")
fd = os.open(".", os.O_RDONLY)
for _ in range(600):
    os.mkdir("d", dir_fd=fd); sub = os.open("d", os.O_RDONLY, dir_fd=fd); os.close(fd); fd = sub
with open("sparse", "wb") as fh:
    fh.truncate(64 << 20); fh.write(b"head")
for i in range(8):
    os.link("sparse", f"hl{i}")
PY
"""


def test_a_tree_planted_by_a_real_box_is_walked_and_copied_safely(tmp_path, open_sandbox, runtime):
    from tests.helpers import make_workspace

    ws = make_workspace(tmp_path / "ws")
    box = open_sandbox(ws)
    result = box.call("shell", {"command": PLANT, "timeout_s": 60})
    assert result.ok, result
    walk = Walk(ws, HostBudget(max_depth=256))
    dest = tmp_path / "copy"
    dest.mkdir()
    links = HardLinks()
    budget = HostBudget()
    dfd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    copied = []
    try:
        for entry in walk.entries():
            if stat.S_ISREG(entry.st.st_mode) and entry.depth == 1:
                copy_regular(entry.dir_fd, entry.name, dfd, budget, mode=0o644, links=links, reflinks=False)
                copied.append(entry.rel)
            assert "\n" not in show(entry.rel)
    finally:
        links.close()
        os.close(dfd)
    assert not walk.complete and walk.too_deep  # 600 levels, 256 entered: said, not hidden
    assert {b"new\nline", b"bad\xffutf8", b"sparse"} <= set(copied)
    assert b"fifo" not in copied and b"etc-link" not in copied
    used = sum(os.lstat(dest / os.fsdecode(n)).st_blocks for n in {b"sparse"}) * 512
    assert used < 1 << 20 and budget.bytes_spent < 1 << 20
    assert os.stat(dest / "hl3").st_ino == os.stat(dest / "sparse").st_ino
