"""The tests of tests/unit/test_review.py that need a real box (issue 48: one tier per folder);
what they are about is said there."""

from __future__ import annotations

import os

import pytest

from orchestrator.workspace.review import (
    apply_changes,
    list_changes,
    render_diff,
)
from tests.helpers.review import build, snapshot, take_copy


@pytest.mark.docker
@pytest.mark.skipif(os.geteuid() != 0, reason="chowning the copy to the sandbox uid needs root")
def test_a_real_box_plants_everything_and_apply_carries_only_the_edit(open_sandbox, tmp_path):
    from tests.helpers import chown_tree

    real = build(
        tmp_path / "real", {"app.py": "print('bug')\n", "README": "readme\n", ".git/HEAD": "ref: refs/heads/main\n"}
    )
    manifest, copy = take_copy(real, tmp_path)
    chown_tree(copy, 1000)
    box = open_sandbox(
        copy, user="1000:1000", runtime="runc"
    )  # runc: under gVisor the box's FIFO and socket never reach the host
    script = " ; ".join(
        [
            "id -u > uid.txt",
            "printf \"print('fixed')\\n\" > app.py",
            "rm README",
            "cp /bin/true suid && (chmod 4755 suid 2>/dev/null || chmod 755 suid)",
            "printf 'x\\n' > open.txt && chmod 666 open.txt",
            "mkdir -p nested/.git && printf '[core]\\n\\tfsmonitor = touch /tmp/owned\\n' > nested/.git/config",
            "printf 'gitdir: /etc\\n' > nested/.GIT 2>/dev/null; printf 'gitdir: /etc\\n' > .GIT 2>/dev/null",
            "mkfifo fifo",
            "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\"",
            "ln -s /etc/passwd passwd",
            "ln -s ../../etc/shadow escape",
            "printf 'h\\n' > h1 && ln h1 hardlink",
            "echo '.git/config' > .git/config 2>/dev/null",
            "ls -la",
        ]
    )
    out = box.call("shell", {"command": script}).output
    assert "fifo" in out and "hardlink" in out
    assert (copy / "uid.txt").read_text().strip() == "1000"

    paths = {c.path for c in list_changes(manifest)}
    assert {"app.py", "README", "fifo", "sock", "passwd", "escape", "hardlink", "nested"} <= paths
    assert not any(".git" in p.casefold() for p in paths)
    diff = list(render_diff(manifest, list_changes(manifest)))
    assert "+print('fixed')" in diff

    report = apply_changes(manifest)  # while the box is still there, before any sweep
    assert report.conflicts == []
    left = {lo.path for lo in report.left_out}
    assert {"nested/.git", "nested/.GIT", ".GIT", "fifo", "sock", "passwd", "escape", "hardlink", "h1"} == left
    after = snapshot(real)
    assert after[".git/HEAD"] == ("file", 0o644, b"ref: refs/heads/main\n")
    assert "README" not in after and "app.py" in after
    assert after["open.txt"] == ("file", 0o644, b"x\n") and after["suid"][:2] == ("file", 0o755)
    assert set(after) == {".git", ".git/HEAD", "app.py", "uid.txt", "suid", "open.txt", "nested"}
    assert after["app.py"] == ("file", 0o644, b"print('fixed')\n")
