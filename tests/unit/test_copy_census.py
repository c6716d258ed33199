"""A fresh copy's integrity baseline is counted while the copy is made (workspace/copy_census.py),
not walked again: it must be exactly what a walk of the copy finds (Baseline._capture), on trees
holding what the sweep exists for (nested repositories, gitfiles, bare and commondir repositories,
setuid bits, FIFOs, hard links, links, a `.GIT` in another case), or the sweep after the box would
adopt or miss what the box planted."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orchestrator.workspace.copy import copy_workspace
from orchestrator.workspace.integrity import Baseline


def _same(counted: Baseline | None, walked: Baseline) -> None:
    assert counted is not None
    assert counted.git_entries == walked.git_entries
    assert counted.special_bits == walked.special_bits
    assert counted.top_git_dir == walked.top_git_dir
    assert counted.usage_bytes == walked.usage_bytes
    assert counted.git_shaped_dirs == walked.git_shaped_dirs
    assert counted.entries == walked.entries
    assert counted.unchecked == walked.unchecked


def _bare(where: Path) -> None:
    (where / "objects").mkdir(parents=True)
    (where / "refs").mkdir()
    (where / "HEAD").write_text("ref: refs/heads/main\n")
    (where / "config").write_text("[core]\n\tpager = touch /tmp/pwned\n")


def _tree(real: Path) -> None:
    (real / "src" / "pkg").mkdir(parents=True)
    for i in range(30):
        (real / "src" / "pkg" / f"m{i}.py").write_text(f"x = {i}\n" * (i * 40))
    (real / ".git" / "objects").mkdir(parents=True)  # the top .git: never copied
    (real / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (real / "vendor" / "lib" / ".git" / "refs").mkdir(parents=True)  # a nested repository, with content
    (real / "vendor" / "lib" / ".git" / "HEAD").write_text("ref: refs/heads/x\n")
    (real / "vendor" / "lib" / ".git" / "objects").mkdir()
    (real / "vendor" / "lib" / "code.c").write_text("int main(void) { return 0; }\n")
    (real / "sub").mkdir()
    (real / "sub" / ".git").write_text("gitdir: ../elsewhere\n")  # a gitfile
    (real / "Upper").mkdir()
    (real / "Upper" / ".GIT").mkdir()  # git's name in another case
    _bare(real / "bare.git")  # a bare repository, found by its HEAD
    (real / "withcommondir").mkdir()
    (real / "withcommondir" / "HEAD").write_text("ref: refs/heads/main\n")
    (real / "withcommondir" / "commondir").write_text("../bare.git\n")
    (real / "onlyhead").mkdir()
    (real / "onlyhead" / "HEAD").write_text("not a repository\n")
    (real / "tool").write_bytes(b"\x7fELF" + b"\0" * 5000)
    os.chmod(real / "tool", 0o4755)  # setuid: the copy drops it
    (real / "group").mkdir()
    os.chmod(real / "group", 0o2775)  # setgid directory
    os.mkfifo(real / "pipe")  # not copied
    os.link(real / "src" / "pkg" / "m5.py", real / "hardlink.py")  # one inode, counted once
    os.symlink("src/pkg/m1.py", real / "link.py")
    os.symlink("/etc/passwd", real / "out")
    (real / "sparse.bin").write_bytes(b"")
    with open(real / "sparse.bin", "r+b") as f:
        f.truncate(50 << 20)
        f.seek(20 << 20)
        f.write(b"data")
    deep = real
    for i in range(40):
        deep = deep / f"d{i}"
    deep.mkdir(parents=True)
    (deep / "HEAD").write_text("deep\n")


def test_a_fresh_copys_counted_baseline_is_what_a_walk_of_it_finds(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    _tree(real)
    copy = tmp_path / "state" / "copy"
    manifest = copy_workspace(real, copy, os.getuid(), os.getgid())
    counted = manifest.fresh_baseline(copy)
    walked = Baseline._capture(copy)
    _same(counted, walked)
    # the cases are really there: a test that cannot fail would prove nothing
    assert {"vendor/lib/.git", "sub/.git", "Upper/.GIT", "bare.git"} <= set(walked.git_entries)
    assert len(walked.git_shaped_dirs) == 2  # bare.git and withcommondir, not onlyhead
    assert not (copy / "pipe").exists() and not stat.S_IMODE((copy / "tool").stat().st_mode) & stat.S_ISUID


def test_the_counted_baseline_names_a_bare_repository_at_the_root(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    _bare(real)
    copy = tmp_path / "copy"
    manifest = copy_workspace(real, copy, os.getuid(), os.getgid())
    walked = Baseline._capture(copy)
    _same(manifest.fresh_baseline(copy), walked)
    assert walked.git_shaped_dirs == {(copy.stat().st_dev, copy.stat().st_ino)}


def test_a_manifest_read_back_gives_no_baseline_a_resumed_copy_is_walked(tmp_path: Path) -> None:
    from orchestrator.workspace.copy import CopyManifest

    real = tmp_path / "real"
    real.mkdir()
    (real / "a.txt").write_text("a\n")
    manifest = copy_workspace(real, tmp_path / "copy", os.getuid(), os.getgid())
    manifest.save(tmp_path / "manifest.json")
    assert CopyManifest.load(tmp_path / "manifest.json").fresh_baseline(tmp_path / "copy") is None


@pytest.mark.skipif(os.geteuid() != 0, reason="a copy owned by another uid needs root")
def test_the_counted_baseline_holds_for_a_copy_owned_by_the_box_user(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    _tree(real)
    copy = tmp_path / "copy"
    manifest = copy_workspace(real, copy, 1000, 1000)
    _same(manifest.fresh_baseline(copy), Baseline._capture(copy))
