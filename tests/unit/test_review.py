"""Review and apply in copy mode: the copy is the box's, so each test plays a hostile box on it.

Real files on disk throughout: a "real" workspace, copy_workspace() into a state directory, the
copy changed as a box would change it (on the host, or from a real sandbox in the docker test),
then list_changes / render_diff / apply_changes, and the real workspace checked byte for byte.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.workspace.copy import CopyManifest
from orchestrator.workspace.review import (
    MAX_FILE_LINES,
    MAX_TOTAL_LINES,
    TEMP_PREFIX,
    apply_changes,
    list_changes,
    render_diff,
)
from tests.helpers.review import build, snapshot, take_copy

ROOT = Path(__file__).resolve().parents[2]


def later(path: Path) -> None:
    """Make sure an edit moves the mtime even on a coarse clock."""
    st = os.lstat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000), follow_symlinks=False)


def changes_of(manifest: CopyManifest) -> list[tuple[str, str]]:
    return [(c.path, c.status) for c in list_changes(manifest)]


# ---------------------------------------------------------------------------------------------


def test_an_edit_an_addition_and_a_deletion_are_shown_and_applied_and_nothing_else(tmp_path):
    real = build(
        tmp_path / "real",
        {
            "a.txt": "one\ntwo\nthree\n",
            "b.txt": "bee\n",
            "src/c.py": "print(1)\n",
            ".git/config": "[core]\n",
            "keep.txt": "keep\n",
        },
    )
    manifest, copy = take_copy(real, tmp_path)
    assert not (copy / ".git").exists(), "the top .git is never copied"
    (copy / ".git").mkdir()  # the read-only mount point a session leaves behind
    (copy / "a.txt").write_text("one\nTWO\nthree\n")
    later(copy / "a.txt")
    (copy / "b.txt").unlink()
    (copy / "src" / "new.py").write_text("print('new')\n")
    assert changes_of(manifest) == [("a.txt", "modified"), ("b.txt", "deleted"), ("src/new.py", "added")]

    diff = list(render_diff(manifest, list_changes(manifest)))
    text = "\n".join(diff)
    assert "diff --git a/a.txt b/a.txt" in diff and "-two" in diff and "+TWO" in diff
    assert "deleted file mode 100644" in diff and "-bee" in diff
    assert "new file mode 100644" in diff and "--- /dev/null" in diff and "+print('new')" in diff
    assert "keep" not in text and "c.py" not in text
    stat_lines = list(render_diff(manifest, list_changes(manifest), stat=True))
    assert stat_lines[-1] == " 3 files changed, 2 insertions(+), 2 deletions(-)"
    assert " a.txt |     2 +-" in stat_lines

    before = snapshot(real)
    (real / "src" / f"{TEMP_PREFIX}0123456789abcdef.tmp").write_text("left by an apply killed earlier")
    report = apply_changes(manifest)
    assert report.conflicts == [] and report.left_out == []
    assert sorted(report.applied) == ["a.txt", "b.txt", "src/new.py"]
    expected = dict(before)
    expected["a.txt"] = ("file", 0o644, b"one\nTWO\nthree\n")
    del expected["b.txt"]
    expected["src/new.py"] = ("file", 0o644, b"print('new')\n")
    assert snapshot(real) == expected
    assert not [p for p in snapshot(real) if TEMP_PREFIX in p]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files other owners")
def test_files_keep_the_real_owner(tmp_path):
    real = build(tmp_path / "real", {"mine.txt": "a\n", "theirs.txt": "b\n"})
    os.chown(real, 4321, 4322)
    os.chown(real / "mine.txt", 4321, 4322)
    os.chown(real / "theirs.txt", 5555, 5556)
    manifest, copy = take_copy(real, tmp_path)
    (copy / "theirs.txt").write_text("b2\n")
    later(copy / "theirs.txt")
    (copy / "new").mkdir()
    (copy / "new" / "f.txt").write_text("n\n")
    assert not apply_changes(manifest).conflicts
    owner = lambda p: (os.lstat(p).st_uid, os.lstat(p).st_gid)  # noqa: E731
    assert owner(real / "theirs.txt") == (5555, 5556)
    assert owner(real / "new") == owner(real / "new" / "f.txt") == (4321, 4322)
    assert stat.S_IMODE(os.lstat(real / "new").st_mode) == 0o755


def test_what_a_hostile_box_plants_is_left_out_or_normalised_and_listed(tmp_path):
    real = build(
        tmp_path / "real",
        {"a.txt": "a\n", "tool.sh": "echo\n", "pkg/__init__.py": "", "src/c.py": "c\n", "secret.env": "KEY=1\n"},
    )
    os.chmod(real / "secret.env", 0o600)
    (tmp_path / "outside").mkdir()
    manifest, copy = take_copy(real, tmp_path)
    build(
        copy,
        {
            "suid": "#!/bin/sh\n",
            "run.sh": "#!/bin/sh\n",
            "open.txt": "o\n",
            "sub/.git/config": "[core]\n\tfsmonitor = touch /tmp/x\n",
            "pkg/.GIT": "gitdir: /etc\n",
        },
    )
    os.chmod(copy / "suid", 0o4755)
    os.chmod(copy / "tool.sh", 0o6755)  # setuid + setgid on an existing file
    os.chmod(copy / "run.sh", 0o744)
    os.chmod(copy / "open.txt", 0o666)
    os.chmod(copy / "secret.env", 0o700)  # exec bit on a private file: stays private
    os.mkfifo(copy / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(copy / "sock"))
    sock.close()
    os.symlink("/etc/passwd", copy / "passwd")
    os.symlink("../../outside", copy / "pkg" / "escape")
    os.symlink("../src/c.py", copy / "pkg" / "good")
    os.symlink("src", copy / "srclink")
    os.symlink("srclink/../../outside", copy / "sneaky")  # lexically inside, but srclink/.. is the top
    os.symlink(".git/config", copy / "gitlink")
    os.link(copy / "a.txt", copy / "hardlink")
    before = snapshot(real)

    report = apply_changes(manifest)
    assert report.conflicts == []
    left = {lo.path: lo.reason for lo in report.left_out}
    assert set(left) == {
        "sub/.git",
        "pkg/.GIT",
        "fifo",
        "sock",
        "passwd",
        "pkg/escape",
        "sneaky",
        "gitlink",
        "hardlink",
    }
    assert "FIFO" in left["fifo"] and "socket" in left["sock"] and "hard link" in left["hardlink"]
    assert "absolute" in left["passwd"] and "outside" in left["pkg/escape"] and ".git" in left["gitlink"]
    modes = {n.path: (n.box_mode, n.mode) for n in report.normalised}
    assert modes == {
        "suid": ("4755", "0755"),
        "tool.sh": ("6755", "0755"),
        "run.sh": ("0744", "0755"),
        "open.txt": ("0666", "0644"),
    }

    after = snapshot(real)
    expected = dict(before)
    expected.update(
        {
            "suid": ("file", 0o755, b"#!/bin/sh\n"),
            "tool.sh": ("file", 0o755, b"echo\n"),
            "run.sh": ("file", 0o755, b"#!/bin/sh\n"),
            "open.txt": ("file", 0o644, b"o\n"),
            "secret.env": ("file", 0o700, b"KEY=1\n"),
            "pkg/good": ("symlink", "../src/c.py"),
            "srclink": ("symlink", "src"),
            "sub": ("dir",),
        }
    )
    assert after == expected
    assert not any(m[0] == "file" and m[1] & 0o7000 for m in after.values())


def test_a_nested_repository_is_never_entered_reported_or_written(tmp_path):
    real = build(tmp_path / "real", {"vendor/lib/.git/config": "[core]\n", "vendor/lib/x.c": "x\n"})
    manifest, copy = take_copy(real, tmp_path)
    hook = copy / "vendor" / "lib" / ".git" / "hooks" / "post-checkout"
    build(copy, {"vendor/lib/.git/hooks/post-checkout": "#!/bin/sh\ntouch /tmp/owned\n"})
    (copy / "vendor" / "lib" / ".git" / "config").write_text("[core]\n\tfsmonitor = evil\n")
    assert hook.exists()
    assert all(".git" not in c.path.casefold() for c in list_changes(manifest))
    before = snapshot(real)
    report = apply_changes(manifest)
    assert snapshot(real) == before
    assert not report.applied and not report.conflicts
    assert [lo.path for lo in report.left_out] == ["vendor/lib/.git"]  # its mtime moved: listed, not carried


def test_a_file_edited_in_the_real_workspace_after_the_copy_means_nothing_is_applied(tmp_path):
    real = build(tmp_path / "real", {"a.txt": "a\n", "b.txt": "b\n"})
    manifest, copy = take_copy(real, tmp_path)
    for name in ("a.txt", "b.txt"):
        (copy / name).write_text("box\n")
        later(copy / name)
    (copy / "new.txt").write_text("box\n")
    (copy / "both.txt").write_text("box\n")
    (real / "a.txt").write_text("the user's edit\n")
    (real / "both.txt").write_text("the user's own\n")
    before = snapshot(real)
    report = apply_changes(manifest)
    assert {(c.path, c.reason.split(",")[0]) for c in report.conflicts} == {
        ("a.txt", "changed in the real workspace since the copy was taken"),
        ("both.txt", "added in the box"),
    }
    assert report.applied == []
    assert snapshot(real) == before


def test_a_real_directory_swapped_for_a_symlink_is_never_written_through(tmp_path):
    real = build(tmp_path / "real", {"d/f.txt": "f\n"})
    outside = build(tmp_path / "outside", {"f.txt": "outside\n"})
    manifest, copy = take_copy(real, tmp_path)
    (copy / "d" / "f.txt").write_text("box\n")
    later(copy / "d" / "f.txt")
    (copy / "d" / "g.txt").write_text("box\n")
    os.rename(real / "d", tmp_path / "d.moved")
    os.symlink(outside, real / "d")
    report = apply_changes(manifest)
    assert {c.path for c in report.conflicts} == {"d/f.txt", "d/g.txt"}
    assert snapshot(outside) == {"f.txt": ("file", 0o644, b"outside\n")}
    assert report.applied == []


def test_type_changes_and_deleted_directories(tmp_path):
    real = build(tmp_path / "real", {"dir2file/x": "x\n", "file2dir": "f\n", "gone/deep/y": "y\n", "link2file": ""})
    (real / "link2file").unlink()
    os.symlink("file2dir", real / "link2file")
    manifest, copy = take_copy(real, tmp_path)
    (copy / "dir2file" / "x").unlink()
    (copy / "dir2file").rmdir()
    (copy / "dir2file").write_text("now a file\n")
    (copy / "file2dir").unlink()
    build(copy, {"file2dir/inner.txt": "inner\n"})
    (copy / "gone" / "deep" / "y").unlink()
    (copy / "gone" / "deep").rmdir()
    (copy / "gone").rmdir()
    (copy / "link2file").unlink()
    (copy / "link2file").write_text("plain\n")
    report = apply_changes(manifest)
    assert report.conflicts == [] and report.left_out == []
    assert snapshot(real) == {
        "dir2file": ("file", 0o644, b"now a file\n"),
        "file2dir": ("dir",),
        "file2dir/inner.txt": ("file", 0o644, b"inner\n"),
        "link2file": ("file", 0o644, b"plain\n"),
    }


def test_names_and_content_from_the_box_are_made_visible_in_the_diff(tmp_path):
    real = build(tmp_path / "real", {"a.txt": "a\n"})
    manifest, copy = take_copy(real, tmp_path)
    evil = "x\x1b[2J\rname\n+++ fake\u202e"
    (copy / evil).write_bytes("line\x1b]52;c;cm0gLXJmIH4=\x07 ok\rover\n\u2028more\n".encode())
    for stat_mode in (False, True):
        for line in render_diff(manifest, list_changes(manifest), stat=stat_mode):
            assert (
                "\n" not in line
                and "\r" not in line
                and "\x1b" not in line
                and "\x07" not in line
                and "\u202e" not in line
            )
            assert "\u2028" not in line
    diff = list(render_diff(manifest, list_changes(manifest)))
    assert "diff --git a/x\\x1b[2J\\x0dname\\n+++ fake\\u202e b/x\\x1b[2J\\x0dname\\n+++ fake\\u202e" in diff
    assert "+line\\x1b]52;c;cm0gLXJmIH4=\\x07 ok\\x0dover" in diff
    assert not any(line.startswith("+++ fake") for line in diff)


def test_the_diff_is_bounded(tmp_path):
    real = build(
        tmp_path / "real",
        {"big.txt": "a\n" * 100, "bin.dat": b"\0\1\2" * 100, "aaa_many.txt": "".join(f"{i}\n" for i in range(3000))},
    )
    manifest, copy = take_copy(real, tmp_path)
    with open(copy / "big.txt", "wb") as fh:
        fh.truncate(10 << 30)  # sparse, 10 GiB: never read
    (copy / "bin.dat").write_bytes(b"\0\3" * 1000)
    later(copy / "bin.dat")
    (copy / "aaa_many.txt").write_text("".join(f"{i} changed\n" for i in range(3000)))
    later(copy / "aaa_many.txt")
    for i in range(60):
        (copy / f"gen{i:02}.txt").write_text("".join(f"{j}\n" for j in range(800)))
    started = time.monotonic()
    diff = list(render_diff(manifest, list_changes(manifest)))
    assert time.monotonic() - started < 20
    assert f"# not diffed: a/big.txt: 200 bytes; b/big.txt: large file, {10 << 30} bytes" in diff
    assert "# not diffed: a/bin.dat: binary file, 300 bytes; b/bin.dat: binary file, 2000 bytes" in diff
    many = diff.index("diff --git a/aaa_many.txt b/aaa_many.txt")
    assert (
        diff[many + MAX_FILE_LINES].startswith("# ")
        and "more lines of this file not shown" in diff[many + MAX_FILE_LINES]
    )
    assert len(diff) <= MAX_TOTAL_LINES + MAX_FILE_LINES + 2
    assert diff[-1].startswith("# diff truncated")
    stat_lines = list(render_diff(manifest, list_changes(manifest), stat=True))
    assert " big.txt | Bin 200 -> 10737418240 bytes" in stat_lines and " bin.dat | Bin 300 -> 2000 bytes" in stat_lines
    assert stat_lines[-1] == " 63 files changed, 51000 insertions(+), 3000 deletions(-)"


def test_a_fifo_in_the_copy_where_a_file_was_never_blocks(tmp_path):
    real = build(tmp_path / "real", {"a.txt": "a\n"})
    manifest, copy = take_copy(real, tmp_path)
    (copy / "a.txt").unlink()
    os.mkfifo(copy / "a.txt")
    started = time.monotonic()
    assert changes_of(manifest) == [("a.txt", "type_changed")]
    assert any("FIFO" in line for line in render_diff(manifest, list_changes(manifest)))
    report = apply_changes(manifest)
    assert [lo.path for lo in report.left_out] == ["a.txt"] and (real / "a.txt").read_text() == "a\n"
    assert time.monotonic() - started < 5


# ---------------------------------------------------------------------------------------------
# kill -9 in the middle of an apply

APPLY_CHILD = (
    "import sys; from pathlib import Path; from orchestrator.workspace.copy import CopyManifest; "
    "from orchestrator.workspace.review import apply_changes; "
    "r = apply_changes(CopyManifest.load(Path(sys.argv[1]))); print(len(r.applied), len(r.already), len(r.conflicts))"
)
N_FILES = 1500


def _old(i: int) -> bytes:
    return (f"old {i}\n" * (200 + i % 7)).encode()


def _new(i: int) -> bytes:
    return (f"NEW {i}!\n" * (3000 + i % 11)).encode()


def _interrupted_workspace(tmp_path: Path, n: int) -> tuple[Path, Path]:
    real = tmp_path / f"real{n}"
    for i in range(N_FILES):
        d = real / f"d{i % 20}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.txt").write_bytes(_old(i))
    manifest, copy = take_copy(real, tmp_path / f"s{n}")
    for i in range(N_FILES):
        (copy / f"d{i % 20}" / f"f{i}.txt").write_bytes(_new(i))
    path = tmp_path / f"manifest{n}.json"
    manifest.save(path)
    return real, path


def _run_apply(manifest_path: Path, kill_after: float | None) -> subprocess.CompletedProcess | None:
    proc = subprocess.Popen(
        [sys.executable, "-c", APPLY_CHILD, str(manifest_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if kill_after is None:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        return subprocess.CompletedProcess(proc.args, 0, out, err)
    time.sleep(kill_after)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    return None


def _old_or_new(real: Path) -> tuple[int, int, list[str]]:
    old = new = 0
    temps = []
    for i in range(N_FILES):
        data = (real / f"d{i % 20}" / f"f{i}.txt").read_bytes()
        assert data in (_old(i), _new(i)), f"f{i}.txt is neither the old nor the new version ({len(data)} bytes)"
        old, new = old + (data == _old(i)), new + (data == _new(i))
    for d in real.iterdir():
        temps += [p.name for p in d.iterdir() if p.name.startswith(TEMP_PREFIX)]
    return old, new, temps


def test_apply_killed_midway_leaves_every_file_old_or_new_and_can_be_run_again(tmp_path):
    real, manifest_path = _interrupted_workspace(tmp_path, 99)
    started = time.monotonic()
    _run_apply(manifest_path, kill_after=None)  # how long a whole apply takes here, now
    whole = time.monotonic() - started
    assert _old_or_new(real)[1:] == (N_FILES, [])
    # Kill at a fraction of that time, moved towards the middle of the apply when a kill lands before
    # its first write or after its last (a busy machine stretches the child's start-up, not only the
    # writes), until two kills have landed mid-apply.
    mixed, fraction, early, late = 0, 0.5, 0.0, 2.0
    for n in range(12):
        real, manifest_path = _interrupted_workspace(tmp_path, n)
        _run_apply(manifest_path, kill_after=whole * fraction)
        old, new, _ = _old_or_new(real)
        if old and new:
            mixed += 1
            if mixed == 2:
                break
        elif not new:
            early, fraction = fraction, (fraction + late) / 2
        else:
            late, fraction = fraction, (early + fraction) / 2
    assert mixed >= 2, "the kills never landed in the middle of an apply: the test proves nothing"
    # the last, interrupted workspace: killed again, then a full run finishes the job and cleans up
    _run_apply(manifest_path, kill_after=whole * 0.3)
    _old_or_new(real)
    done = _run_apply(manifest_path, kill_after=None)
    applied, already, conflicts = map(int, done.stdout.split())
    assert conflicts == 0 and applied + already == N_FILES and already > 0
    assert _old_or_new(real) == (0, N_FILES, [])


# ---------------------------------------------------------------------------------------------
# through a real sandbox: the box itself does the hostile things


def test_the_report_shows_paths_and_reasons_on_one_visible_line_each(tmp_path):
    real = build(tmp_path / "real", {"a.txt": "a\n"})
    manifest, copy = take_copy(real, tmp_path)
    os.mkfifo(copy / "fifo\x1b[31m\nconflict: a.txt")
    os.symlink("/etc/\x1b]52;c;x\x07", copy / "l\r")
    lines = apply_changes(manifest).lines()
    assert len(lines) == 2 and all(line.startswith("left out: ") for line in lines)
    assert not any(ch in line for line in lines for ch in "\x1b\r\n\x07")


def test_sparse_files_stay_sparse_and_odd_names_are_carried_exactly(tmp_path):
    real = build(tmp_path / "real", {"a.txt": "a\n"})
    manifest, copy = take_copy(real, tmp_path)
    with open(copy / "sparse.img", "wb") as fh:
        fh.write(b"head")
        fh.seek(2 << 30)
        fh.write(b"tail")  # 2 GiB apparent, a few KiB on disk
    odd = os.fsencode("caf\udce9.txt")  # a Latin-1 name: not UTF-8
    with open(os.path.join(os.fsencode(copy), odd), "wb") as fh:
        fh.write(b"latin\n")
    (copy / f"{TEMP_PREFIX}0123456789abcdef.tmp").write_text("the box squatting apply's temp name\n")
    report = apply_changes(manifest)
    assert [lo.path for lo in report.left_out] == [f"{TEMP_PREFIX}0123456789abcdef.tmp"]
    st = os.stat(real / "sparse.img")
    assert st.st_size == (2 << 30) + 4 and st.st_blocks * 512 < (1 << 20)
    with open(real / "sparse.img", "rb") as fh:
        assert fh.read(4) == b"head" and (fh.seek(2 << 30), fh.read())[1] == b"tail"
    assert open(os.path.join(os.fsencode(real), odd), "rb").read() == b"latin\n"


def test_changes_on_box_text_built_against_difflib_end_at_the_differs_deadline(tmp_path):
    """A box-written file whose lines each recur just under difflib's junk bound (about 200 KB, inside
    the diff's size cap): `changes` and `changes --stat` ran difflib on the main thread for minutes;
    now a diff of that size runs in bounded_diff's child and the listing says it gave up."""
    from orchestrator.workspace.review import DIFF_DEADLINE_S
    from tests.helpers.preview_bounds import pathological_lines

    before, after = pathological_lines(40_000)
    assert len(before) < 256 * 1024 and len(after) < 256 * 1024
    real = build(tmp_path / "real", {"big.txt": before, "small.txt": "one\n"})
    manifest, copy = take_copy(real, tmp_path)
    (copy / "big.txt").write_text(after)
    (copy / "small.txt").write_text("two\n")
    started = time.monotonic()
    diff = list(render_diff(manifest, list_changes(manifest)))
    stat_lines = list(render_diff(manifest, list_changes(manifest), stat=True))
    elapsed = time.monotonic() - started
    assert f"# diff the diff took longer than {DIFF_DEADLINE_S:g} s" in diff
    assert "-one" in diff and "+two" in diff  # small files still diff in full
    assert any("big.txt | not counted: the diff took longer" in line for line in stat_lines)
    assert elapsed < 2 * DIFF_DEADLINE_S + 10  # two diffs of the big file, each killed at its deadline
