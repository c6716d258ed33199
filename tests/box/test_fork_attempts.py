"""Issue 37, best-of-N: `run --attempts N --pick COMMAND TASK`, with real containers and the real CLI.

Three scripted attempts of one task from one copy (`{attempt}` in a script's name picks one script
per attempt): one leaves the tests failing, two fix them, one of those with more changed lines.
The pick command runs in each attempt's own box; the passing attempt with the fewest changed lines
is chosen, the others are discarded, what the pick command wrote is rolled back, and `--apply`
lands only the chosen one. Bad flag combinations are typed set-up errors.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import make_workspace
from tests.helpers.fork import oa, sessions_dir
from tests.helpers.fork_attempts import CALC, TEST, edit


@pytest.mark.docker
@pytest.mark.slow
def test_best_of_three_keeps_the_passing_attempt_with_the_fewest_changed_lines(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"calc.py": CALC, "test_calc.py": TEST})
    scripts = {
        1: edit("    return a * b"),  # still fails
        2: edit("    # add the two numbers\n    # (they are numbers)\n    total = a + b\n    return total"),
        3: edit("    return a + b"),
    }
    for number, call in scripts.items():
        (tmp_path / f"attempt{number}.jsonl").write_text(
            json.dumps({"text": "", "tool_calls": [call]})
            + "\n"
            + json.dumps({"text": f"attempt {number} done"})
            + "\n"
        )
    pick = "python3 -B -m unittest -q test_calc && echo scored > picked.txt"
    proc = oa(
        tmp_path,
        "run",
        "--workspace",
        str(ws),
        "--model",
        f"script:{tmp_path}/attempt{{attempt}}.jsonl",
        "--non-interactive",
        "--auto-approve",
        "--output",
        "json",
        "--attempts",
        "3",
        "--pick",
        pick,
        "--apply",
        "fix add",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    attempts = {a["number"]: a for a in out["attempts"]}
    assert len({a["session_id"] for a in attempts.values()}) == 3
    assert attempts[1]["score"] is None and attempts[1]["pick_exit_code"] != 0
    assert attempts[2]["score"] == 1.0 and attempts[3]["score"] == 1.0
    assert attempts[3]["changed_lines"] < attempts[2]["changed_lines"]
    assert out["chosen"] == attempts[3]["session_id"] == out["session_id"]
    assert attempts[1]["discarded"] and attempts[2]["discarded"] and not attempts[3]["discarded"]
    assert out["landing"]["applied"] == 1 and out["landing"]["conflicts"] == 0
    assert (ws / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    assert not (ws / "picked.txt").exists()  # what the pick command wrote was rolled back
    chosen_copy = sessions_dir(tmp_path) / out["chosen"] / "copy"
    assert not (chosen_copy / "picked.txt").exists()
    listed = {r["id"]: r for r in json.loads(oa(tmp_path, "sessions", "--json").stdout)}
    for a in attempts.values():
        assert listed[a["session_id"]]["forked_from"]
    assert listed[attempts[1]["session_id"]]["discarded"] and listed[out["chosen"]]["applied"]


def test_attempts_and_pick_go_together_on_a_new_copy(tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    common = ["run", "--workspace", str(ws), "--model", "script:/nonexistent", "--output", "json"]
    for extra in (
        ["--attempts", "2"],
        ["--pick", "true"],
        ["--attempts", "2", "--pick", "true", "--workspace-mode", "bind"],
        ["--attempts", "2", "--pick", "true", "--resume", "20260101-000000-abcdef"],
    ):
        proc = oa(tmp_path, *common, *extra, "task")
        assert proc.returncode == 2, (extra, proc.stderr)
        assert json.loads(proc.stdout)["error"]["type"] == "invalid_arguments"
    assert oa(tmp_path, *common, "--attempts", "17", "--pick", "true", "task").returncode == 2
    assert not (tmp_path / "state" / "openagents-sandbox" / "sessions").exists() or not any(
        Path(tmp_path / "state" / "openagents-sandbox" / "sessions").iterdir()
    )


@pytest.mark.docker
@pytest.mark.slow
def test_a_pick_command_that_hangs_is_killed_and_fails_and_nothing_is_chosen(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"calc.py": CALC})
    (tmp_path / "m.jsonl").write_text(json.dumps({"text": "nothing to do"}) + "\n")
    proc = oa(
        tmp_path,
        "run",
        "--workspace",
        str(ws),
        "--model",
        f"script:{tmp_path}/m.jsonl",
        "--non-interactive",
        "--output",
        "json",
        "--attempts",
        "2",
        "--pick",
        "sleep 100000",
        "--pick-timeout",
        "2",
        "task",
        timeout=400,
    )
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["chosen"] is None and len(out["attempts"]) == 2
    assert all(a["score"] is None and not a["discarded"] for a in out["attempts"])  # none passed: all kept


def test_scores_and_the_tie_break():
    from orchestrator.api.attempts import Attempt, best, parse_score

    assert parse_score(True, 0, "ok\n") == 1.0 and parse_score(True, 0, "ran 3\n0.75\n") == 0.75
    assert (
        parse_score(True, 1, "0.9\n") is None
        and parse_score(False, None, "") is None
        and parse_score(True, 0, "nan\n") == 1.0
    )
    a, b, c = (
        Attempt(1, "a", score=None),
        Attempt(2, "b", score=1.0, changed_lines=9),
        Attempt(3, "c", score=1.0, changed_lines=2),
    )
    assert best([a, b, c]) is c and best([a]) is None
    assert best([Attempt(1, "x", score=2.0, changed_lines=50), c]).session_id == "x"


@pytest.mark.docker
@pytest.mark.slow
def test_ctrl_c_cancels_every_attempt_and_leaves_no_box(sandbox_image, docker_client, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from orchestrator.config import LABEL
    from tests.helpers.fork import ROOT

    ws = make_workspace(tmp_path / "ws", {"calc.py": CALC})
    (tmp_path / "m.jsonl").write_text(
        json.dumps({"text": "", "tool_calls": [{"name": "shell", "arguments": {"command": "sleep 300"}}]}) + "\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "GEMINI_", "ANTHROPIC_"))}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"), PYTHONPATH=str(ROOT))
    err = tmp_path / "stderr.txt"
    with err.open("w") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "run",
                "--workspace",
                str(ws),
                "--model",
                f"script:{tmp_path}/m.jsonl",
                "--non-interactive",
                "--auto-approve",
                "--attempts",
                "2",
                "--pick",
                "true",
                "task",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=sink,
            env=env,
            cwd=ROOT,
        )
        deadline = time.monotonic() + 120

        def boxes() -> list:
            listed = docker_client.api.containers(all=True, filters={"label": LABEL})
            return [c for c in listed if str(tmp_path) in (c.get("Labels") or {}).get(f"{LABEL}.workspace", "")]

        while len(boxes()) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        assert len(boxes()) == 2, err.read_text()
        time.sleep(3)  # both in their `sleep 300`
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, err.read_text()
    assert "cancelling the attempts" in err.read_text()
    assert not boxes()


@pytest.mark.docker
@pytest.mark.slow
def test_every_attempt_keeps_the_workspace_hooks_the_user_trusts(sandbox_image, tmp_path):
    """Review of issue 37: each attempt opens its fork as a resume, and a resume takes workspace hooks
    only from what the start pinned; the start pinned nothing, so a trusted workspace guard (here:
    block every shell call) silently did not run in any attempt. The start now pins as a session does."""
    import sys

    ws = make_workspace(tmp_path / "ws", {"calc.py": CALC, "test_calc.py": TEST})
    (ws / ".openagents").mkdir()
    guard = [sys.executable, "-c", "import sys; print('no shell here', file=sys.stderr); sys.exit(2)"]
    (ws / ".openagents" / "policy.toml").write_text(
        f'[[hooks]]\nevent = "BeforeTool"\nmatcher = "shell"\ncommand = {json.dumps(guard)}\n'
    )
    user_policy = tmp_path / "user.toml"
    user_policy.write_text("trust_workspace_hooks = true\n")
    call = {"name": "shell", "arguments": {"command": "touch made-by-the-attempt.txt"}}
    (tmp_path / "a.jsonl").write_text(
        json.dumps({"text": "", "tool_calls": [call]}) + "\n" + json.dumps({"text": "done"}) + "\n"
    )
    proc = oa(
        tmp_path,
        "run",
        "--workspace",
        str(ws),
        "--model",
        f"script:{tmp_path}/a.jsonl",
        "--non-interactive",
        "--auto-approve",
        "--policy",
        str(user_policy),
        "--output",
        "json",
        "--attempts",
        "2",
        "--pick",
        "true",
        "guarded",
        timeout=600,
    )
    out = json.loads(proc.stdout)
    assert len(out["attempts"]) == 2, proc.stderr
    for attempt in out["attempts"]:
        copy = sessions_dir(tmp_path) / attempt["session_id"] / "copy"
        assert not (copy / "made-by-the-attempt.txt").exists(), proc.stderr
