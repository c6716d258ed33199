"""Red team (issue 10 variants): repositories git finds without any `.git` name, planted by the box for
the user's own git to obey after the session. Git takes a directory for a repository when it holds
HEAD with objects/ and refs/ (a bare repository, found by discovery from that directory or any
directory below it), or HEAD with a `commondir` file; its `config` then runs programs (core.pager on
the user's next `git log` in a terminal). The payloads only touch marker files."""

from __future__ import annotations

import base64
import os
import pty
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.helpers import make_workspace

pytestmark = pytest.mark.docker

PAGER_CONFIG = "[core]\n\trepositoryformatversion = 0\n\tbare = true\n\tpager = touch {marker}; cat\n"


def bare_repo_tar(tmp_path: Path, marker: Path, commondir: bool) -> str:
    """A bare repository with one commit and core.pager, built on the host outside the workspace and
    handed to the box as a base64 tar (the image has no git): the box is the one that writes it."""
    src = tmp_path / "build" / "src"
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "a",
        "GIT_AUTHOR_EMAIL": "a@a",
        "GIT_COMMITTER_NAME": "a",
        "GIT_COMMITTER_EMAIL": "a@a",
    }
    subprocess.run(["git", "init", "-q", "-b", "main", str(src)], check=True, env=env)
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "x"], cwd=src, check=True, env=env)
    out = tmp_path / "build" / "plant"
    git_dir = out / ".common" if commondir else out
    subprocess.run(["git", "clone", "-q", "--bare", str(src), str(git_dir)], check=True, env=env)
    (git_dir / "config").write_text(PAGER_CONFIG.format(marker=marker))
    if commondir:
        (out / "HEAD").write_text("ref: refs/heads/main\n")
        (out / "commondir").write_text(".common\n")
    data = subprocess.run(["tar", "-C", str(out), "-cf", "-", "."], check=True, capture_output=True).stdout
    return base64.b64encode(data).decode()


def plant_bare(box, tmp_path: Path, where: str, marker: Path, commondir: bool = False) -> None:
    blob = bare_repo_tar(tmp_path, marker, commondir)
    script = f"mkdir -p {where} && echo '{blob}' | base64 -d | tar -xf - -C {where} --no-same-owner && echo planted"
    out = box.call("shell", {"command": script}).output
    assert out.strip().endswith("planted"), out


def user_git_log_on_a_terminal(cwd: Path, ws: Path) -> None:
    """The user's own `git log` after the session, as the workspace's owner (git ignores a repository
    someone else owns, so running it as root would prove nothing), with a terminal on stdout (so git
    starts a pager). Its stderr is read to make sure it could reach the directory at all."""
    owner = ws.stat().st_uid
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1", "TERM": "dumb"}
    main, sub = pty.openpty()
    try:
        done = subprocess.run(
            ["git", "log", "-1"],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=sub,
            stderr=subprocess.PIPE,
            env=env,
            timeout=30,
            user=owner,
            group=ws.stat().st_gid,
            extra_groups=[] if os.geteuid() == 0 else None,
            text=True,
        )
    finally:
        os.close(sub)
        os.close(main)
    assert "Permission denied" not in done.stderr and "dubious ownership" not in done.stderr, done.stderr


@pytest.fixture
def home():
    """Where these workspaces live: a fresh directory the workspace's owner can reach (pytest's own
    tmp directories are root's, mode 0700, so the user's git could not even look), with `markers`
    inside, where a payload would leave its marker."""
    where = Path(tempfile.mkdtemp(prefix="oa-redteam-"))
    where.chmod(0o755)
    (where / "markers").mkdir(mode=0o777)
    (where / "markers").chmod(0o777)
    yield where
    shutil.rmtree(where, ignore_errors=True)


@pytest.mark.parametrize("where", [".", "src"])
def test_redteam_bare_repository_planted_by_the_box_is_defused(open_sandbox, tmp_path, home, where):
    """A bare repository (HEAD, objects/, refs/, config with core.pager) planted by
    `shell` is defused by the sweep: the user's later `git log` runs nothing."""
    marker = home / "markers" / "MARKER-bare-pager"
    ws = make_workspace(home / "ws", {"src/app.py": "print(1)\n"})
    box = open_sandbox(ws)
    plant_bare(box, tmp_path, where, marker)
    box.close()
    assert (ws / "src" / "app.py").read_text() == "print(1)\n"
    user_git_log_on_a_terminal(ws / "src", ws)
    assert not marker.exists(), "the user's git found the planted bare repository and ran its core.pager"
    kinds = [m.kind for m in box.sweeper.reports[-1].moved]
    assert "git_head" in kinds


def test_redteam_commondir_git_dir_planted_by_the_box_is_defused(open_sandbox, tmp_path, home):
    """A directory with HEAD and a `commondir` file (git's linked-worktree
    layout) is a repository to git: the sweep defuses it too."""
    marker = home / "markers" / "MARKER-commondir-pager"
    ws = make_workspace(home / "ws", {"lib/x.py": "x = 1\n"})
    box = open_sandbox(ws)
    plant_bare(box, tmp_path, "lib", marker, commondir=True)
    box.close()
    user_git_log_on_a_terminal(ws / "lib", ws)
    assert not marker.exists(), "the user's git found the planted commondir repository and ran its core.pager"


def test_redteam_copy_mode_apply_never_carries_a_planted_bare_repository(open_sandbox, tmp_path, home):
    """Copy mode: a bare repository the box planted in the copy is not carried
    into the real workspace by apply (its HEAD is left out and listed)."""
    from orchestrator.workspace.copy import copy_workspace
    from orchestrator.workspace.review import apply_changes
    from tests.helpers import chown_tree

    marker = home / "markers" / "MARKER-apply-pager"
    real = make_workspace(home / "real", {"src/app.py": "print(1)\n"})
    manifest = copy_workspace(real, tmp_path / "state" / "copy", real.stat().st_uid, real.stat().st_gid)
    copy = Path(manifest.copy_dir)
    chown_tree(copy)
    box = open_sandbox(copy)
    plant_bare(box, tmp_path, "src", marker)
    assert box.call("shell", {"command": "printf 'print(2)\\n' > src/app.py; echo ok"}).output.strip() == "ok"
    report = apply_changes(manifest)  # while the box is still there, before any sweep of the copy
    box.close()
    assert report.conflicts == []
    assert (real / "src" / "app.py").read_text() == "print(2)\n", "the ordinary edit is still carried"
    user_git_log_on_a_terminal(real / "src", real)
    assert not marker.exists(), "apply carried the planted bare repository and the user's git ran its core.pager"
    assert "src/HEAD" in {lo.path for lo in report.left_out}


def test_redteam_every_existing_nested_repository_is_read_only_in_the_box(open_sandbox, tmp_path, home):
    """A workspace with 70 nested repositories (the mount cap was 64): the box can write the config of none of them."""
    files = {f"vendor/r{i:03d}/.git/config": "[core]\n" for i in range(70)}
    files.update({f"vendor/r{i:03d}/.git/HEAD": "ref: refs/heads/main\n" for i in range(70)})
    ws = make_workspace(home / "ws", files)
    box = open_sandbox(ws, runtime=None)  # the default choice: gVisor cannot start with 70 read-only mounts, so runc
    assert not box.runtime.gvisor and "repositories" in box.runtime.why
    out = box.call(
        "shell",
        {
            "command": "for d in vendor/r*/.git; do printf '[core]\\n\\tfsmonitor = touch "
            "/tmp/x\\n' > $d/config 2>/dev/null && echo wrote $d; done; echo end"
        },
    ).output
    box.close()
    assert "wrote" not in out, out
    changed = [p for p in files if p.endswith("config") and (ws / p).read_text() != "[core]\n"]
    assert changed == [], f"the box rewrote {changed}"


def test_redteam_rollback_never_brings_back_a_planted_bare_repository(open_sandbox, tmp_path, home):
    """A bare repository the box planted in a checkpointed turn stays defused after `rollback` to that turn."""
    from orchestrator.workspace.checkpoints import CheckpointStore

    marker = home / "markers" / "MARKER-rollback-pager"
    ws = make_workspace(home / "ws", {"src/app.py": "print(1)\n"})
    store = CheckpointStore(tmp_path / "store", ws)
    store.record(0)
    box = open_sandbox(ws)
    plant_bare(box, tmp_path, "src", marker)
    assert store.record(1) is not None
    box.close()  # the sweep moves src/HEAD out
    assert not (ws / "src" / "HEAD").exists()
    report = store.restore(1)
    store.close()
    assert (ws / "src" / "app.py").read_text() == "print(1)\n"
    user_git_log_on_a_terminal(ws / "src", ws)
    assert not marker.exists(), "rollback restored the planted HEAD and the user's git ran its core.pager"
    assert "src/HEAD" in {s.path for s in report.skipped}


def test_redteam_quarantining_a_planted_repository_leaves_hard_linked_workspace_files_alone(open_sandbox, tmp_path):
    """A planted .git holding a hard link to the user's script: moving
    it out of the workspace does not change the script's mode."""
    ws = make_workspace(tmp_path / "ws", {"run.sh": "#!/bin/sh\necho hi\n"})
    (ws / "run.sh").chmod(0o755)
    box = open_sandbox(ws)
    out = box.call(
        "shell", {"command": "mkdir -p sub/.git/hooks && ln run.sh sub/.git/hooks/post-checkout && echo linked"}
    ).output
    assert out.strip().endswith("linked"), out
    box.close()
    assert [m.kind for m in box.sweeper.reports[-1].moved] == ["git_dir"]
    assert (ws / "run.sh").stat().st_mode & 0o777 == 0o755, (
        "the sweep's chmod reached the user's file through the box's hard link"
    )


def test_redteam_a_workspace_with_more_repositories_than_can_be_protected_is_refused(tmp_path, home):
    """Past the cap of read-only repository mounts the sandbox is not
    started at all (typed, fatal), rather than half protected."""
    from orchestrator.errors import ErrorType, OpenAgentsError
    from orchestrator.sandbox.docker import MAX_GIT_MOUNTS, git_mounts
    from orchestrator.sandbox.sweep_journal import capture_baseline

    ws = make_workspace(
        home / "many", {f"r{i:04d}/.git/HEAD": "ref: refs/heads/main\n" for i in range(MAX_GIT_MOUNTS + 1)}
    )
    with pytest.raises(OpenAgentsError) as err:
        git_mounts(ws, capture_baseline(ws))
    assert (
        err.value.type is ErrorType.CONFIG_INVALID
        and not err.value.recoverable
        and str(MAX_GIT_MOUNTS) in err.value.message
    )
