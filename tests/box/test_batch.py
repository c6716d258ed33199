"""`oa-sandbox batch` on the local engine (issue 28): tasks on copies of examples/calc (as committed) with the
scripted model, each result with the patch the sanitiser would land, the sources untouched, a
failing task and a bad line as typed results, resume with the same --out, and Ctrl-C leaving no box.

The CLI runs in a subprocess as `python -m orchestrator.cli` with this checkout first on PYTHONPATH,
so what runs is this tree's code; real boxes, no mocks.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import committed_example
from tests.helpers.batch import ROOT, batch, env, results, write_tasks

pytestmark = pytest.mark.docker
SCRIPT = ROOT / "examples" / "calc.jsonl"
POLICY = ROOT / "examples" / "policy.toml"


def digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): f"{oct(p.lstat().st_mode)} {p.lstat().st_uid} "
        + (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
        for p in sorted(root.rglob("*"))
    }


def test_a_batch_runs_each_task_on_its_own_copy_with_its_patch_and_types_a_failing_task_and_a_bad_line(
    sandbox_image, tmp_path
):
    sources = []
    for i in range(4):
        committed_example(tmp_path / f"calc{i}")
        sources.append(tmp_path / f"calc{i}")
    before = [digest(ws) for ws in sources]
    tasks = write_tasks(
        tmp_path / "tasks.jsonl",
        [
            *({"id": f"fix-{i}", "workspace": f"calc{i}", "task": "fix the bug"} for i in range(4)),
            {"id": "no-model-file", "workspace": "calc0", "task": "fix the bug", "model": "script:missing.jsonl"},
            {"id": "too-few-turns", "workspace": "calc1", "task": "fix the bug", "max_turns": 1},
            "{not json",
            {"id": "typo", "workspace": "calc2", "task": "x", "max_turn": 3},
            {"id": "nowhere", "workspace": "no-such-dir", "task": "x"},
        ],
    )
    out = tmp_path / "results.jsonl"
    began = time.monotonic()
    proc = batch(
        tmp_path,
        str(tasks),
        "--out",
        str(out),
        "--model",
        f"script:{SCRIPT}",
        "--policy",
        str(POLICY),
        "--concurrency",
        "3",
    )
    wall = time.monotonic() - began
    assert proc.returncode == 1, proc.stderr  # not every task finished
    got = {r["id"]: r for r in results(out)}
    assert set(got) == {
        "fix-0",
        "fix-1",
        "fix-2",
        "fix-3",
        "no-model-file",
        "too-few-turns",
        "line-7",
        "typo",
        "nowhere",
    }
    for i in range(4):
        r = got[f"fix-{i}"]
        assert r["status"] == "finished" and r["exit_code"] == 0 and r["error"] is None, r
        assert (
            r["session_id"]
            and r["node"]
            and r["wall_s"] > 0
            and r["turns"] == 5
            and r["tokens"] == {"input": 0, "output": 0}
        )
        assert "--- a/calc.py\n+++ b/calc.py\n" in r["patch"] and "-    return a - b\n+    return a + b\n" in r["patch"]
        assert r["left_out"] == [] and r["conflicts"] == [] and r["files_changed"] == ["calc.py"]
        page = Path(r["report_file"]).read_text()  # each task's session report, in its session's directory
        assert r["session_id"] in page and "calc.py" in page and "Content-Security-Policy" in page
    assert [digest(ws) for ws in sources] == before  # every task worked on a copy: the sources are untouched

    # the patch is what apply would land: it applies to a fresh checkout and the tests pass there
    fresh = tmp_path / "fresh"
    committed_example(fresh)
    (tmp_path / "fix.diff").write_text(got["fix-2"]["patch"])
    subprocess.run(["git", "apply", str(tmp_path / "fix.diff")], cwd=fresh, check=True)
    assert (
        subprocess.run([sys.executable, "-B", "-m", "unittest", "-q"], cwd=fresh, capture_output=True).returncode == 0
    )

    assert got["no-model-file"]["status"] == "error" and got["no-model-file"]["exit_code"] == 2
    assert got["no-model-file"]["error"]["type"] in ("config_invalid", "file_not_found"), got["no-model-file"]
    assert got["too-few-turns"]["status"] == "stopped" and got["too-few-turns"]["error"]["type"] == "max_turns"
    assert got["too-few-turns"]["exit_code"] == 1 and got["too-few-turns"]["patch"] == ""  # one turn only read files
    assert got["line-7"]["status"] == "invalid" and got["line-7"]["error"]["type"] == "invalid_arguments"
    assert "task line 7: not JSON" in got["line-7"]["error"]["message"]
    assert got["typo"]["status"] == "invalid" and "max_turn" in got["typo"]["error"]["message"]
    assert got["nowhere"]["error"]["type"] == "not_a_directory"
    assert (
        "batch done: 9 of 9 tasks ended" in proc.stderr and "\x1b[" not in proc.stderr
    )  # no progress bar off a terminal
    print(f"9 tasks, 6 sessions at concurrency 3: {wall:.1f} s")

    # resume: the same --out skips what finished or stopped, and runs the rest again
    rerun = batch(tmp_path, str(tasks), "--out", str(out), "--model", f"script:{SCRIPT}", "--policy", str(POLICY))
    assert rerun.returncode == 1, rerun.stderr
    again = results(out)[len(got) :]
    assert sorted(r["id"] for r in again) == ["line-7", "no-model-file", "nowhere", "typo"]
    assert "5 skipped (already finished in" in rerun.stderr, rerun.stderr


def test_a_result_cut_short_by_a_kill_is_rerun_and_the_next_line_starts_fresh(sandbox_image, tmp_path):
    committed_example(tmp_path / "calc")
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": "only", "workspace": "calc", "task": "fix the bug"}])
    out = tmp_path / "results.jsonl"
    out.write_text('{"id": "only", "status": "finis')  # a batch killed mid-write
    proc = batch(tmp_path, str(tasks), "--out", str(out), "--model", f"script:{SCRIPT}", "--policy", str(POLICY))
    assert proc.returncode == 0, proc.stderr
    lines = out.read_text().splitlines()
    assert lines[0] == '{"id": "only", "status": "finis' and json.loads(lines[1])["status"] == "finished"


def _boxes_of(docker_client, pid: int) -> list[str]:
    from orchestrator.config import LABEL

    # One listing, no inspect per box: a box removed between the two was a NotFound under load.
    return [c["Id"] for c in docker_client.api.containers(all=True, filters={"label": f"{LABEL}.host-pid={pid}"})]


def test_ctrl_c_cancels_the_running_sessions_removes_every_box_and_a_rerun_runs_them_again(
    sandbox_image, docker_client, tmp_path
):
    slow = tmp_path / "slow.jsonl"
    slow.write_text(
        json.dumps({"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 60"}}]})
        + "\n"
        + json.dumps({"text": "done"})
        + "\n"
    )
    policy = tmp_path / "shell.toml"
    policy.write_text('[[rules]]\ntool = "shell"\ndecision = "allow"\n')
    for i in range(3):
        committed_example(tmp_path / f"calc{i}")
    tasks = write_tasks(
        tmp_path / "tasks.jsonl", [{"id": f"slow-{i}", "workspace": f"calc{i}", "task": "wait"} for i in range(3)]
    )
    out = tmp_path / "results.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "batch",
            str(tasks),
            "--out",
            str(out),
            "--model",
            f"script:{slow}",
            "--policy",
            str(policy),
            "--concurrency",
            "2",
        ],
        env=env(tmp_path),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while len(_boxes_of(docker_client, proc.pid)) < 2 or not _sleeping(tmp_path, 2):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the two sessions never reached their sleep"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert _boxes_of(docker_client, proc.pid) == []  # no box left behind
    got = results(out)
    assert sorted(r["id"] for r in got) == ["slow-0", "slow-1"]  # the third never started: not written
    assert all(r["status"] == "cancelled" and r["exit_code"] == 130 and r["session_id"] for r in got), got
    assert "batch interrupted" in err

    from orchestrator.batch.tasks import finished_ids

    assert finished_ids(out) == set()  # a rerun runs all three again


def _sleeping(tmp_path: Path, n: int) -> bool:
    """How many sessions' transcripts show the shell call executing."""
    found = 0
    for transcript in (tmp_path / "state").glob("openagents-sandbox/sessions/*/transcript.jsonl"):
        if '"executing"' in transcript.read_text():
            found += 1
    return found >= n


def test_the_patch_is_what_apply_would_land_and_what_it_would_leave_out_is_listed(sandbox_image, tmp_path):
    committed_example(tmp_path / "calc")
    script = tmp_path / "plant.jsonl"
    script.write_text(
        json.dumps(
            {
                "tool_calls": [
                    {
                        "name": "shell",
                        "arguments": {
                            "command": "echo new > notes.txt && echo x > one && ln one two && ln -s /etc/passwd abs"
                        },
                    }
                ]
            }
        )
        + "\n"
        + json.dumps({"text": "done"})
        + "\n"
    )
    policy = tmp_path / "shell.toml"
    policy.write_text('[[rules]]\ntool = "shell"\ndecision = "allow"\n')
    tasks = write_tasks(
        tmp_path / "tasks.jsonl",
        [{"id": "plant", "workspace": "calc", "task": "x", "model": f"script:{script}", "policy": str(policy)}],
    )
    out = tmp_path / "results.jsonl"
    proc = batch(tmp_path, str(tasks), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    (r,) = results(out)
    assert "+++ b/notes.txt" in r["patch"] and "+new" in r["patch"]
    assert "b/one" not in r["patch"] and "/etc/passwd" not in r["patch"]  # the sanitiser carries neither
    left = {item["path"]: item["reason"] for item in r["left_out"]}
    assert set(left) == {"one", "two", "abs"} and "hard link" in left["two"] and "absolute symlink" in left["abs"], left
    assert sorted(p.name for p in (tmp_path / "calc").iterdir()) == ["calc.py", "test_calc.py"]
