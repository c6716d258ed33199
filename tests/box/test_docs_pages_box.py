"""The README's exec and batch examples, run as written against a real box (the Docker half of
tests/unit/test_docs_pages.py)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import committed_example

ROOT = Path(__file__).resolve().parents[2]
OA = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")


def oa(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [OA, *args], cwd=cwd, capture_output=True, text=True, env=environment, timeout=timeout, stdin=subprocess.DEVNULL
    )


def readme_command(section: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(section)
    part = text[start : text.index("\n## ", start + 1)]
    return re.findall(r"^\$ (oa-sandbox .*)$", part, re.MULTILINE)[0]


def run_as_written(tmp_path: Path, line: str) -> subprocess.CompletedProcess:
    """The README's command line, in a directory holding a copy of examples/ (the README runs from the
    repository's root); the session's state in the test's own directory."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    shutil.rmtree(tmp_path / "examples" / "calc")  # the README's main job fixes the working tree's
    committed_example(tmp_path / "examples" / "calc")
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    return oa(*shlex.split(line)[1:], cwd=tmp_path, env=env, timeout=300)


def test_the_readme_exec_example_runs_as_written(tmp_path: Path, sandbox_image):
    proc = run_as_written(tmp_path, readme_command("## One call"))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["ok"] and result["meta"]["exit_code"] == 1 and "AssertionError: -1 != 5" in result["output"]
    part = (ROOT / "README.md").read_text().split("## One call")[1]
    shown = re.findall(r"^\{.*\}$", part, re.MULTILINE)[0]  # the result as the README prints it
    keys = set(re.findall(r'"(\w+)":', shown))
    assert keys >= {"ok", "output", "meta", "error"}
    assert all(f'"{key}":' in proc.stdout for key in keys), keys


def test_the_readme_batch_example_runs_as_written(tmp_path: Path, sandbox_image):
    text = (ROOT / "README.md").read_text()
    part = text[text.index("## Many at once") :]
    tasks = re.findall(r"^\$ cat tasks.jsonl\n(.*)$", part, re.MULTILINE)[0]
    (tmp_path / "tasks.jsonl").write_text(tasks + "\n")
    proc = run_as_written(tmp_path, readme_command("## Many at once"))
    assert proc.returncode == 0, proc.stderr
    (result,) = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert result["status"] == "finished" and "+    return a + b" in result["patch"]
    assert "return a - b" in (tmp_path / "examples" / "calc" / "calc.py").read_text()  # the source is never changed
