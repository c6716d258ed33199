"""Issue 37, best-of-N in `oa-sandbox batch`: a task line with `attempts` and `pick` (or the batch's
--attempts/--pick) runs as N attempts from one copy, scored by the pick command in each attempt's
own box; the best is kept (ties: fewest changed lines), the others discarded, and the result line is
the chosen attempt's (its session and patch) with every attempt's score. Real containers, the real
CLI in a subprocess, scripted models (`{attempt}` in a script's name: one script per attempt).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import make_workspace
from tests.helpers.batch import batch, results, write_tasks
from tests.helpers.fork import oa, sessions_dir
from tests.helpers.fork_attempts import CALC, TEST, edit

PICK = "python3 -B -m unittest -q test_calc && echo scored > picked.txt"


def scripts(tmp_path: Path) -> str:
    """Attempt 1 leaves the test failing, 2 fixes it in four lines, 3 in one."""
    calls = {
        1: edit("    return a * b"),
        2: edit("    # add the two numbers\n    # (they are numbers)\n    total = a + b\n    return total"),
        3: edit("    return a + b"),
    }
    for number, call in calls.items():
        (tmp_path / f"attempt{number}.jsonl").write_text(
            json.dumps({"text": "", "tool_calls": [call]})
            + "\n"
            + json.dumps({"text": f"attempt {number} done"})
            + "\n"
        )
    return f"script:{tmp_path}/attempt{{attempt}}.jsonl"


@pytest.mark.docker
@pytest.mark.slow
def test_a_batch_task_with_attempts_keeps_the_passing_attempt_with_the_fewest_changed_lines(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"calc.py": CALC, "test_calc.py": TEST})
    model = scripts(tmp_path)
    tasks = write_tasks(
        tmp_path / "tasks.jsonl",
        [
            {"id": "best", "workspace": str(ws), "task": "fix add", "model": model, "attempts": 3, "pick": PICK},
            {
                "id": "none-passes",
                "workspace": str(ws),
                "task": "fix add",
                "model": f"script:{tmp_path}/attempt1.jsonl",
                "attempts": 2,
                "pick": PICK,
            },
            {"id": "no-pick", "workspace": str(ws), "task": "fix add", "model": model, "attempts": 2},
            {"id": "too-many", "workspace": str(ws), "task": "fix add", "model": model, "attempts": 17, "pick": "true"},
        ],
    )
    proc = batch(
        tmp_path, str(tasks), "--out", str(tmp_path / "out.jsonl"), "--auto-approve", "--concurrency", "2", timeout=900
    )
    assert proc.returncode == 1, proc.stderr  # not every task finished
    out = {r["id"]: r for r in results(tmp_path / "out.jsonl")}

    best = out["best"]
    assert best["status"] == "finished" and best["exit_code"] == 0, json.dumps(best)[:3000]
    tried = {a["number"]: a for a in best["best_of"]["attempts"]}
    assert best["best_of"]["pick"] == PICK and len({a["session_id"] for a in tried.values()}) == 3
    assert tried[1]["score"] is None and tried[1]["pick_exit_code"] != 0
    assert (
        tried[2]["score"] == 1.0 and tried[3]["score"] == 1.0 and tried[3]["changed_lines"] < tried[2]["changed_lines"]
    ), json.dumps(best)[:4000]
    assert best["best_of"]["chosen"] == tried[3]["session_id"] == best["session_id"]
    assert tried[1]["discarded"] and tried[2]["discarded"] and not tried[3]["discarded"]
    assert (
        "+    return a + b" in best["patch"] and "picked.txt" not in best["patch"]
    )  # the chosen one's patch; the pick's writes rolled back
    assert (ws / "calc.py").read_text() == CALC  # the source is never the box's
    listed = {r["id"]: r for r in json.loads(oa(tmp_path, "sessions", "--json").stdout)}
    assert listed[tried[1]["session_id"]]["discarded"] and listed[tried[2]["session_id"]]["discarded"]
    assert not listed[best["session_id"]]["discarded"] and listed[best["session_id"]]["forked_from"]
    assert not (sessions_dir(tmp_path) / tried[2]["session_id"] / "copy").exists()  # a loser's copy is gone

    none = out["none-passes"]
    assert none["status"] == "stopped" and none["exit_code"] == 1 and none["best_of"]["chosen"] is None
    assert all(a["score"] is None and not a["discarded"] for a in none["best_of"]["attempts"])  # none passed: all kept

    for bad in ("no-pick", "too-many"):
        assert out[bad]["status"] in ("invalid", "error") and out[bad]["error"]["type"] == "invalid_arguments", out[bad]


@pytest.mark.docker
@pytest.mark.slow
def test_the_batch_flags_give_every_task_its_attempts_and_pick(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"calc.py": CALC, "test_calc.py": TEST})
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": "t", "workspace": str(ws), "task": "fix add"}])
    proc = batch(
        tmp_path,
        str(tasks),
        "--out",
        str(tmp_path / "out.jsonl"),
        "--auto-approve",
        "--model",
        scripts(tmp_path),
        "--attempts",
        "3",
        "--pick",
        PICK,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    (result,) = results(tmp_path / "out.jsonl")
    tried = {a["number"]: a for a in result["best_of"]["attempts"]}
    assert result["session_id"] == result["best_of"]["chosen"] == tried[3]["session_id"]
    assert (
        batch(
            tmp_path, str(tasks), "--out", str(tmp_path / "o2.jsonl"), "--attempts", "17", "--pick", "true"
        ).returncode
        == 2
    )
