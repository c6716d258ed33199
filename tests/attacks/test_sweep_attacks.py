"""The integrity sweep under attack: a host killed before it sweeps, a sparse file with many hard
links swept across file systems, a box that fills the disk's inodes with empty files, a tree too
big for the sweep's budget. Plants come from a real box where the box can make them."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.boxfs import HostBudget
from orchestrator.sandbox import sweep_journal
from orchestrator.workspace.integrity import Baseline, Sweeper, is_git_name, is_head_name
from tests.helpers import make_workspace, sandbox_config
from tests.helpers.workspace_integrity import HOSTILE_CONFIG, user_git

pytestmark = [pytest.mark.docker, pytest.mark.serial]
OA = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
PLANT = (
    "mkdir -p sub/.git/objects sub/.git/refs/heads && printf 'ref: refs/heads/main\\n' > sub/.git/HEAD && "
    "printf '%s' '{config}' > sub/.git/config && echo planted"
)


ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path) -> dict[str, str]:
    """The child runs this checkout's code (PYTHONPATH), with its own state and config homes."""
    return {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


def _script(tmp_path: Path, calls: list[str]) -> tuple[Path, Path]:
    script = tmp_path / "s.jsonl"
    script.write_text(
        "".join(
            json.dumps({"tool_calls": [{"name": "shell", "arguments": {"command": c, "timeout": 120}}]}) + "\n"
            for c in calls
        )
        + json.dumps({"text": "done"})
        + "\n"
    )
    policy = tmp_path / "p.toml"
    policy.write_text('[[rules]]\ntool = "shell"\ndecision = "allow"\n')
    return script, policy


def _git_names(root: Path) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*") if is_git_name(p.name) or is_head_name(p.name)]


def test_a_killed_host_leaves_its_sweep_to_the_next_command(sandbox_image, runtime, tmp_path):
    """The box plants a .git (fsmonitor config), a FIFO and a setuid file; the host is SIGKILLed
    mid-call. The next `oa-sandbox sessions` quarantines the plant before anything else, and the
    next session's baseline adopts none of it."""
    marker = tmp_path / "MARKER-killed"
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n", "tool": "#!/bin/sh\nid\n"})
    plant = PLANT.format(config=HOSTILE_CONFIG.format(marker=marker)) + " && mkfifo trap; sleep 60"
    script, policy = _script(tmp_path, [plant])
    transcript = tmp_path / "t.jsonl"
    proc = subprocess.Popen(
        [
            OA,
            "run",
            "--runtime",
            runtime,
            "--workspace",
            str(ws),
            "--model",
            f"script:{script}",
            "--policy",
            str(policy),
            "--non-interactive",
            "--transcript",
            str(transcript),
            "plant",
        ],
        env=_env(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 90
    while not (ws / "sub" / ".git" / "config").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the plant never reached the workspace"
        time.sleep(0.1)
    time.sleep(0.5)
    if not (ws / "trap").exists():  # gVisor keeps the box's FIFOs in its own kernel: planted from the host instead
        os.mkfifo(ws / "trap")
    os.chmod(ws / "tool", 0o4755)  # as a runtime without our seccomp profile would let the box
    journals = list((tmp_path / "state" / "openagents-sandbox" / "pending-sweeps").glob("*.json"))
    assert len(journals) == 1, "the sweep was not journaled before the box ran"
    proc.kill()
    proc.wait(timeout=30)
    assert (ws / "sub" / ".git").exists(), "nothing swept yet: the host died"

    after = subprocess.run(
        [OA, "sessions"], env=_env(tmp_path), capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL
    )
    assert after.returncode == 0, after.stderr
    assert "ended session" in after.stderr and "sub/.git" in after.stderr, after.stderr
    assert not (ws / "sub" / ".git").exists() and not (ws / "trap").exists()
    assert stat.S_IMODE(os.stat(ws / "tool").st_mode) == 0o755
    assert sorted(os.listdir(ws)) == ["a.txt", "sub", "tool"], "the dead box's placeholder .git was left"
    assert not list(journals[0].parent.glob("*.json")), "the journal outlived its sweep"
    user_git(ws / "sub")
    assert not marker.exists(), "the user's git ran the planted fsmonitor"

    # The next session: nothing of the first box is in its baseline.
    script2, _ = _script(tmp_path, ["ls -a sub"])
    second = subprocess.run(
        [
            OA,
            "run",
            "--runtime",
            runtime,
            "--workspace",
            str(ws),
            "--model",
            f"script:{script2}",
            "--policy",
            str(policy),
            "--non-interactive",
            "--transcript",
            str(tmp_path / "t2.jsonl"),
            "look",
        ],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert second.returncode == 0, second.stderr
    adopted = sweep_journal.capture_baseline(ws).git_entries
    # an empty top .git is the read-only placeholder's mount point
    # (kept while Docker still lists a box on the workspace)
    assert set(adopted) <= {".git"} and not any(os.scandir(ws / ".git") if ".git" in adopted else ()), adopted


def test_a_baseline_completes_a_pending_sweep_first(tmp_path, monkeypatch):
    """A journal left by a dead host: capture_baseline of its workspace sweeps before it looks,
    so the plant is never adopted as the user's repository (no CLI in between)."""
    from orchestrator.sandbox import owner

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    path = sweep_journal.record("dead-1", ws, tmp_path / "q", False, Baseline._capture(ws))
    dead = subprocess.Popen(["true"])
    dead.wait()
    labels = owner.current().labels()
    labels[owner.PID_LABEL], labels[owner.START_LABEL] = str(dead.pid), "1"
    data = json.loads(path.read_text())
    data["owner"] = labels
    path.write_text(json.dumps(data))
    for rel in ("lib/.git/HEAD", "lib/.git/config", "bare/HEAD"):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text("ref: refs/heads/main\n")
    (ws / "bare" / "objects").mkdir()
    (ws / "bare" / "refs").mkdir()
    baseline = sweep_journal.capture_baseline(ws)
    assert baseline.git_entries == {} and baseline.git_shaped_dirs == frozenset()
    assert not (ws / "lib" / ".git").exists() and not (ws / "bare" / "HEAD").exists()
    assert not path.exists()


@pytest.fixture
def other_fs(tmp_path):
    """A tmpfs of its own: the state directory on another file system than the workspace."""
    mnt = tmp_path / "statefs"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root and mount rights): {done.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _used(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def test_a_sparse_file_with_many_hard_links_is_not_expanded_across_file_systems(
    open_sandbox, runtime, docker_client, tmp_path, other_fs
):
    """16 MiB of holes with 16 names inside a planted .git, the state directory on a tmpfs: the
    sweep copies nothing (the old fallback wrote 256 MiB); the .git is defused where it is, and
    neither the user's git nor the next baseline takes any of it for a repository."""
    from orchestrator.sandbox.docker import DockerSandbox

    marker = tmp_path / "MARKER-sparse"
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    box = DockerSandbox(
        ws, sandbox_config(runtime, docker_client), client=docker_client, state_dir=other_fs / "session"
    )
    box.start()
    try:
        out = box.call(
            "shell",
            {
                "command": PLANT.format(config=HOSTILE_CONFIG.format(marker=marker))
                + " && truncate -s 16M sub/.git/objects/pack && for i in $(seq 1 15); do ln "
                "sub/.git/objects/pack sub/.git/objects/l$i; done && mkdir -p sub/.git/modules/m/objects "
                "sub/.git/modules/m/refs && echo x > sub/.git/modules/m/HEAD && echo ok"
            },
        ).output
        assert out.strip().endswith("ok"), out
    finally:
        state_before, ws_before = _used(other_fs), os.statvfs(ws).f_files - os.statvfs(ws).f_ffree
        box.close()
    assert _used(other_fs) - state_before < 1 << 20, "the sweep wrote data to the state disk"
    report = box.sweeper.reports[-1]
    assert report.complete
    [moved] = [m for m in report.moved if m.path == "sub/.git"]
    assert moved.in_place and moved.to and moved.to.startswith("sub/.oa-quarantined-")
    defused = ws / moved.to
    assert (defused / "objects" / "pack").stat().st_nlink == 16 and (defused / "objects" / "pack").stat().st_blocks == 0
    assert not (ws / "sub" / ".git").exists() and _git_names(ws) == []
    assert stat.S_IMODE((defused / "config").stat().st_mode) == 0
    assert os.statvfs(ws).f_files - os.statvfs(ws).f_ffree <= ws_before, "the sweep made new inodes"
    user_git(ws / "sub")
    user_git(defused)
    assert not marker.exists(), "a git of the user's ran the planted config"
    again = sweep_journal.capture_baseline(ws)
    assert again.git_entries == {} and again.git_shaped_dirs == frozenset()
    print(f"state disk grew {(_used(other_fs) - state_before) >> 10} KiB for 16 names of a 16 MiB sparse file")


def test_empty_files_past_the_entry_quota_stop_the_box(open_sandbox, tmp_path):
    """Empty files cost no blocks: 30,000 of them pass no byte quota, but the entry quota stops the
    box with the fatal workspace_quota_exceeded."""
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    box = open_sandbox(ws, entry_quota=3000)
    started = time.monotonic()
    res = box.call(
        "shell",
        {
            "command": "mkdir e && python3 -c \"\nimport time\nfor i in range(30000):\n    open('e/%d' "
            "% i, 'w').close()\n    if i % 1000 == 999: time.sleep(0.05)\nprint('finished')\"",
            "timeout": 120,
        },
    )
    elapsed = time.monotonic() - started
    made = len(os.listdir(ws / "e"))
    assert not res.ok and res.error.type.value == "workspace_quota_exceeded" and not res.error.recoverable, res
    assert "entry quota of 3000" in res.error.message
    assert "finished" not in res.output and made < 30000, "the creator was not stopped"
    print(f"entry quota 3000: stopped at {made} entries after {elapsed:.2f}s")
    assert box.call("read_file", {"path": "a.txt"}).error.type.value == "workspace_quota_exceeded"


def test_a_sweep_past_its_budget_says_so_and_keeps_its_journal(tmp_path, monkeypatch):
    """A tree bigger than the sweep's budget, and one deeper than the walk enters: the report is
    unfinished, typed, never clean; a journaled sweep that did not finish stays journaled."""

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = make_workspace(tmp_path / "ws", {f"d/f{i}": "" for i in range(200)})
    sweeper = Sweeper(ws, Baseline._capture(ws), tmp_path / "q")
    report = sweeper.sweep(budget=HostBudget(max_entries=50))
    assert not report.complete and report.error_type == "resource_exhausted" and report
    assert any("NOT known clean" in line for line in report.lines())

    deep = ws / "deep"
    fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:  # 600 levels, made fd-relative (a path that long passes PATH_MAX)
        for _ in range(600):
            os.mkdir("x", dir_fd=fd)
            nxt = os.open("x", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.mkdir(".git", dir_fd=fd)
    finally:
        os.close(fd)
    deep.mkdir()
    report = sweeper.sweep()
    assert not report.complete and report.error_type == "resource_exhausted"
    path = sweep_journal.record("unfinished", ws, tmp_path / "q", False, sweeper.baseline)
    entry = sweep_journal.pending(ws)[0]
    assert not sweep_journal.complete(entry, HostBudget(max_entries=50)).complete
    assert path.exists(), "an unfinished sweep's journal was cleared"
