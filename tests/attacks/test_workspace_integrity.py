"""What the box leaves in the workspace for the host or the user to trip over after the session:
planted repositories, setuid bits, FIFOs, a workspace grown past its quota. Each scenario plants
from inside a real sandbox, then checks the workspace on the host once the box is gone."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import make_workspace
from tests.helpers.workspace_integrity import HOSTILE_CONFIG, user_git

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
OA = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")


def plant_repo(box, where: str, marker: Path) -> None:
    script = (
        f"mkdir -p {where}/objects {where}/refs/heads && printf 'ref: refs/heads/main\\n' > {where}/HEAD && "
        f"printf '%s' '{HOSTILE_CONFIG.format(marker=marker)}' > {where}/config; echo planted"
    )
    box.call("shell", {"command": script})


@pytest.fixture
def box_on(open_sandbox):
    """open_sandbox under the name these scenarios read best with; closing twice is harmless."""
    return open_sandbox


def test_nested_repository_planted_by_the_box_does_not_outlive_the_session(box_on, tmp_path):
    """A nested .git with core.fsmonitor planted by `shell` is moved
    out at the end: the user's later `git status` runs nothing."""
    marker = tmp_path / "MARKER-fsmonitor"
    ws = make_workspace(tmp_path / "ws", {"src/app.py": "print(1)\n"})
    box = box_on(ws)
    plant_repo(box, "src/.git", marker)
    assert (ws / "src" / ".git" / "config").exists(), "the plant should have worked inside the box"
    box.close()
    assert not (ws / "src" / ".git").exists()
    report = box.sweeper.reports[-1]
    assert [(m.path, m.kind) for m in report.moved] == [("src/.git", "git_dir")]
    assert Path(report.moved[0].to).is_dir() and not str(report.moved[0].to).startswith(str(ws))
    user_git(ws / "src")
    assert not marker.exists(), "the user's git ran the planted fsmonitor"
    assert (ws / "src" / "app.py").read_text() == "print(1)\n"


def test_no_repository_can_be_planted_at_the_top(box_on, tmp_path):
    """With no .git at the start nothing is mounted at /workspace/.git (its mount point would be
    a directory in the user's workspace, shared by every session on it); a repository planted
    there (.git, .GIT) is moved out at the end and the user's git runs nothing of it."""
    marker = tmp_path / "MARKER-top"
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    box = box_on(ws)
    assert sorted(p.name for p in ws.iterdir()) == ["a.txt"], "a mount point was made in the workspace"
    plant_repo(box, ".git", marker)
    plant_repo(box, ".GIT", marker)
    box.close()
    assert sorted(p.name for p in ws.iterdir()) == ["a.txt"], "a planted .git or .GIT was left"
    assert sorted(m.path for m in box.sweeper.reports[-1].moved) == [".GIT", ".git"]
    user_git(ws)
    assert not marker.exists()


def test_existing_repositories_are_read_only_in_the_box(box_on, tmp_path):
    """Every .git present at the start (top and nested, dir or gitfile)
    is mounted read-only: hooks and config cannot be planted."""
    ws = make_workspace(
        tmp_path / "ws",
        {
            ".git/config": "[core]\n",
            ".git/HEAD": "ref: refs/heads/main\n",
            "lib/.git/config": "[core]\n",
            "mod/.git": "gitdir: ../.git/modules/mod\n",
        },
    )
    before = {p: (ws / p).read_text() for p in (".git/config", "lib/.git/config", "mod/.git")}
    box = box_on(ws)
    for target in (".git/config", ".git/pre-commit", "lib/.git/config", "lib/.git/post-checkout"):
        res = box.call("shell", {"command": f"echo 'touch /tmp/x' > {target} 2>&1"})
        assert "Read-only file system" in res.output, (target, res.output)
    # Emptying, not appending: under gVisor with directfs a read-only *bind* mount of a directory let an
    # open(O_TRUNC) empty the host file before it said EROFS (mounts.py); `>`, truncate(1) and a bare
    # O_TRUNC open, as the box's own uid and against the gitfile too.
    res = box.call(
        "shell",
        {
            "command": "for f in .git/config lib/.git/config mod/.git; do : > $f; truncate -s 0 $f; "
            'python3 -c "import os, sys; os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)" $f; done 2>&1 | sort | uniq -c'
        },
    )
    assert "Read-only file system" in res.output and "Permission denied" not in res.output, res.output
    res = box.call(
        "shell",
        {"command": "echo 'gitdir: /etc' > mod/.git 2>&1; rm -rf lib/.git 2>&1; mv lib lib2 2>&1 && echo moved"},
    )
    box.close()
    views = [
        v.id for v in box.client.volumes.list() if str(ws) in str((v.attrs.get("Options") or {}).get("device", ""))
    ]
    assert views == [], "a read-only view (an anonymous volume) outlived its box"
    assert {p: (ws / p).read_text() for p in before if (ws / p).exists()} == {
        k: v for k, v in before.items() if (ws / k).exists()
    }
    assert (ws / "mod" / ".git").read_text() == before["mod/.git"]
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()


def test_a_moved_parent_does_not_launder_a_planted_repository(box_on, tmp_path):
    """A box that moves a directory holding the user's nested repo away and plants
    its own .git at the old path: the plant is still caught (identity, not path)."""
    marker = tmp_path / "MARKER-launder"
    ws = make_workspace(tmp_path / "ws", {"lib/.git/HEAD": "ref: refs/heads/main\n", "lib/x.py": "x\n"})
    box = box_on(ws)
    res = box.call("shell", {"command": "mv lib lib-moved 2>&1; mkdir -p lib && echo done"})
    assert "done" in res.output
    plant_repo(box, "lib/.git", marker)
    box.close()
    moved = [m.path for m in box.sweeper.reports[-1].moved] if box.sweeper.reports else []
    if (ws / "lib-moved").exists():  # the mount let the parent move: the user's repo is kept, the plant is moved out
        assert (ws / "lib-moved" / ".git" / "HEAD").exists() and "lib/.git" in moved
    assert not (ws / "lib" / ".git" / "config").exists()
    assert not marker.exists()


def test_fifos_sockets_and_setuid_files_are_swept(box_on, tmp_path):
    """FIFOs and sockets are moved out, setuid/setgid bits cleared (here set from the host, as a runtime without our
    seccomp profile would let the box). Under gVisor the box's FIFOs and sockets live in gVisor's kernel only and never
    reach the host's disk; the test checks that, then plants them from the host so the sweep is tried under both."""
    ws = make_workspace(tmp_path / "ws", {"keep.txt": "k\n", "tool": "#!/bin/sh\nid\n"})
    os.chmod(ws / "keep.txt", 0o2644)  # the user's own setgid bit, there before the session: left alone
    box = box_on(ws)
    res = box.call(
        "shell",
        {
            "command": 'mkfifo pipe && python3 -c "import socket; s=socket.socket(socket.AF_UNIX); '
            "s.bind('sock')\" && mkdir -p d && mkfifo d/deep && echo ok"
        },
    )
    assert res.output.strip() == "ok", res.output
    if box.runtime.gvisor:
        assert not [p for p in ws.rglob("*") if not (p.is_file() or p.is_dir())], (
            "a special file reached the host under gVisor"
        )
        os.mkfifo(ws / "pipe")
        os.mkfifo(ws / "d" / "deep")
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(ws / "sock"))
    os.chmod(ws / "tool", 0o6755)  # after the baseline: the box's doing
    box.close()
    names = {p.name for p in ws.rglob("*")}
    assert not names & {"pipe", "sock", "deep"}
    assert stat.S_IMODE(os.stat(ws / "tool").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(ws / "keep.txt").st_mode) == 0o2644
    report = box.sweeper.reports[-1]
    assert {(m.path, m.kind) for m in report.moved} == {("pipe", "fifo"), ("sock", "socket"), ("d/deep", "fifo")}
    assert report.cleared_bits == ["tool"]
    manifest = [json.loads(line) for line in (box.state_dir / "quarantine" / "manifest.jsonl").read_text().splitlines()]
    assert manifest[-1]["cleared_bits"] == ["tool"]


def test_read_file_on_a_fifo_fails_at_once(box_on, tmp_path):
    """read_file, grep_files and edit_file on a FIFO give a typed
    error at once instead of waiting out the host deadline."""
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    box = box_on(ws)
    box.call("shell", {"command": "mkfifo fifo"})
    started = time.monotonic()
    read = box.call("read_file", {"path": "fifo"})
    edit = box.call("edit_file", {"path": "fifo", "old_text": "a", "new_text": "b"})
    grep = box.call("grep_files", {"pattern": "a", "path": "fifo"})
    assert time.monotonic() - started < 5
    assert read.error.type.value == "not_regular_file" and "FIFO" in read.error.message
    assert edit.error.type.value == "not_regular_file"
    assert grep.ok and box.restarts == 0


def test_a_replaced_container_is_swept_before_the_next_one_starts(box_on, tmp_path):
    """The box plants a FIFO and a nested repo, then kills the
    agent: the host sweeps before the fresh container runs."""
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    box = box_on(ws)
    box.call("shell", {"command": "mkfifo trap && mkdir -p x/.git && echo 'gitdir: /' > y.git; kill -TERM 1; sleep 5"})
    box.call("shell", {"command": "true"})
    assert box.restarts == 1
    assert not (ws / "trap").exists() and not (ws / "x" / ".git").exists()
    # under gVisor the FIFO never reached the host's disk (gVisor's kernel keeps it): nothing to move
    assert {m.path for m in box.sweeper.reports[0].moved} == {"x/.git"} | (set() if box.runtime.gvisor else {"trap"})


def test_the_write_quota_stops_a_disk_filler(box_on, tmp_path):
    """A shell command that writes far past the workspace quota is killed;
    every later call fails with the fatal workspace_quota_exceeded."""
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    quota = 64 << 20
    box = box_on(ws, write_quota=quota)
    started = time.monotonic()
    res = box.call(
        "shell",
        {
            "command": "i=0; while [ $i -lt 200 ]; do head -c 8388608 /dev/zero "
            "> f$i || exit 1; i=$((i+1)); done; echo finished",
            "timeout": 120,
        },
    )
    elapsed = time.monotonic() - started
    assert not res.ok and res.error.type.value == "workspace_quota_exceeded" and not res.error.recoverable, res
    assert "finished" not in res.output
    written = sum(p.stat().st_size for p in ws.glob("f*"))
    assert written < 200 * 8 << 20, "the writer was not stopped"
    print(
        f"quota {quota >> 20} MiB: stopped at {written >> 20} MiB after "
        f"{elapsed:.2f}s (overshoot {(written - quota) >> 20} MiB)"
    )
    later = box.call("read_file", {"path": "a.txt"})
    assert later.error.type.value == "workspace_quota_exceeded"
    assert written < quota + (1 << 30)


def test_a_session_over_quota_stops_with_a_typed_reason(sandbox_image, tmp_path):
    """Through the real CLI: the quota stops the session (exit 1) with workspace_quota_exceeded in session_end."""
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    script = tmp_path / "fill.jsonl"
    fill = {
        "name": "shell",
        "arguments": {"command": "i=0; while [ $i -lt 100 ]; do head -c 4194304 /dev/zero > f$i; i=$((i+1)); done"},
    }
    script.write_text(
        "\n".join(
            json.dumps(t)
            for t in [
                {"tool_calls": [fill]},
                {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]},
                {"text": "done"},
            ]
        )
        + "\n"
    )
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rules]]\ntool = "shell"\ndecision = "allow"\n')
    transcript = tmp_path / "t.jsonl"
    proc = subprocess.run(
        [
            OA,
            "run",
            "--workspace",
            str(ws),
            "--model",
            f"script:{script}",
            "--non-interactive",
            "--policy",
            str(policy),
            "--write-quota",
            "32m",
            "--transcript",
            str(transcript),
            "fill the disk",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 1, proc.stderr
    end = [json.loads(line) for line in transcript.read_text().splitlines() if '"session_end"' in line][-1]
    assert end["status"] == "stopped" and end["error"]["type"] == "workspace_quota_exceeded"
    assert not any(json.loads(line).get("tool") == "read_file" for line in transcript.read_text().splitlines()), (
        "the session went on"
    )


def test_the_sweep_reports_at_the_end_of_a_run(sandbox_image, tmp_path):
    """`oa-sandbox run` lists what the sweep moved, and the transcript has an integrity_sweep event."""
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    script = tmp_path / "plant.jsonl"
    script.write_text(
        json.dumps({"tool_calls": [{"name": "shell", "arguments": {"command": "mkfifo p; mkdir -p s/.git"}}]})
        + "\n"
        + json.dumps({"text": "done"})
        + "\n"
    )
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rules]]\ntool = "shell"\ndecision = "allow"\n')
    transcript = tmp_path / "t.jsonl"
    # runc: under gVisor the FIFO would never reach the host (see test_fifos_sockets_and_setuid_files_are_swept)
    proc = subprocess.run(
        [
            OA,
            "run",
            "--runtime",
            "runc",
            "--workspace",
            str(ws),
            "--model",
            f"script:{script}",
            "--non-interactive",
            "--policy",
            str(policy),
            "--transcript",
            str(transcript),
            "plant",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert "moved fifo p out of the workspace" in proc.stderr and "moved git_dir s/.git" in proc.stderr
    sweeps = [json.loads(line) for line in transcript.read_text().splitlines() if '"integrity_sweep"' in line]
    assert (
        sweeps and {m["path"] for m in sweeps[0]["moved"]} == {"p", "s/.git"} and sweeps[0]["executor"] == "openagents"
    )
    shutil.rmtree(ws)
