"""The README's Python example and every example of docs/api.md run as written: each in a fresh
directory, as a user's program (a new interpreter, the package from this tree), against the real
daemon; each must exit 0 and leave no container behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config import LABEL

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(path: Path, section: str | None = None) -> list[str]:
    text = path.read_text()
    if section is not None:
        start = text.index(section)
        text = text[start : text.index("\n## ", start + 1)]
    return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


README_BLOCKS = python_blocks(ROOT / "README.md", "## Python API")
DOC_BLOCKS = python_blocks(ROOT / "docs" / "api.md")


def test_the_examples_are_found():
    assert len(README_BLOCKS) == 1 and len(DOC_BLOCKS) >= 7


def run_program(tmp_path: Path, source: str) -> str:
    program = tmp_path / "example.py"
    program.write_text(source)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(program)], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def no_boxes(docker_client, tmp_path: Path) -> list[str]:
    listed = docker_client.api.containers(
        all=True, filters={"label": LABEL}
    )  # one listing: no inspect of boxes others remove meanwhile
    return [c["Id"] for c in listed if str(tmp_path) in (c.get("Labels") or {}).get(f"{LABEL}.workspace", "")]


def test_the_readme_example_runs_as_written(tmp_path, sandbox_image, docker_client):
    out = run_program(tmp_path, README_BLOCKS[0])
    assert "hello from the sandbox" in out and "+print('hello from the sandbox')" in out
    assert (tmp_path / "demo-repo" / "app.py").read_text() == "print('hello from the sandbox')\n"
    assert not no_boxes(docker_client, tmp_path)


@pytest.mark.parametrize("index", range(len(DOC_BLOCKS)))
def test_each_docs_api_example_runs_as_written(tmp_path, sandbox_image, docker_client, index):
    run_program(tmp_path, DOC_BLOCKS[index])
    assert not no_boxes(docker_client, tmp_path)
