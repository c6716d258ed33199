"""The README and the topic pages of docs/ hold true: every relative link (and its #anchor) leads
somewhere, every TOML example loads as the file it says it is (a policy through `oa-sandbox hooks
--policy`, a config.toml as the user's config), every JSON example parses, every command the CLI has
is documented, every flag a command table names is one the command takes, docs/cli.md's set-up error
example prints what it shows; and the README's shell examples (`exec`, `batch`) run as written against
the real daemon (those two need Docker; the rest run without it, as real CLI subprocesses of this
checkout, in about 30 s)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OA = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# the pages whose command tables are the command line's reference
COMMAND_PAGES = [ROOT / "docs" / "cli.md", ROOT / "docs" / "workspaces.md"]


def blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", path.read_text(), re.DOTALL | re.MULTILINE)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.DOTALL | re.MULTILINE)
    return {slug(h) for h in re.findall(r"^#+ (.*)$", text, re.MULTILINE)}


def oa(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [OA, *args], cwd=cwd, capture_output=True, text=True, env=environment, timeout=timeout, stdin=subprocess.DEVNULL
    )


def test_the_pages_are_found():
    names = {p.name for p in PAGES}
    assert {"README.md", "workspaces.md", "cli.md", "batch.md", "policy.md", "egress.md", "performance.md"} <= names
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300  # a front door, not the manual


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_leads_somewhere(page: Path):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.DOTALL | re.MULTILINE)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"


def toml_examples() -> list[tuple[str, str]]:
    return [(f"{p.name}[{i}]", b) for p in PAGES for i, b in enumerate(blocks(p, "toml"))]


def is_config(block: str) -> bool:
    first = block.splitlines()[0]
    return "openagents-sandbox/config.toml" in first or bool(re.search(r"^(model|base_url) =", block, re.MULTILINE))


def is_another_programs(block: str) -> bool:
    """Another program's file (`# ~/.codex/config.toml (Codex CLI)`): only parsed."""
    return bool(re.match(r"# ~/\.(?!config/openagents-sandbox)", block))


@pytest.mark.parametrize("name,block", toml_examples(), ids=[n for n, _ in toml_examples()])
def test_every_toml_example_loads_as_what_it_is(tmp_path: Path, name: str, block: str):
    """A policy example through `oa-sandbox hooks --policy` (which loads policy files as `run` does),
    a config.toml example as the user's config: a typo or a renamed key is a set-up error, exit 2.
    Exit 1 is a hook whose example program is not on this machine, which the loader accepted."""
    ws = tmp_path / "ws"
    ws.mkdir()
    home = tmp_path / "home"
    (home / "policies").mkdir(parents=True)
    (home / "policies" / "mine.toml").write_text('[[rules]]\nkind = "read"\ndecision = "allow"\n')
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_STATE_HOME": str(tmp_path / "state")}
    if is_another_programs(block):
        tomllib.loads(block)
        return
    if is_config(block):
        config = tmp_path / "config" / "openagents-sandbox" / "config.toml"
        config.parent.mkdir(parents=True)
        config.write_text(block)
        proc = oa("hooks", "--workspace", str(ws), cwd=tmp_path, env=env)
    else:
        policy = tmp_path / "policy.toml"
        policy.write_text(block)
        proc = oa("hooks", "--workspace", str(ws), "--policy", str(policy), cwd=tmp_path, env=env)
    assert proc.returncode in (0, 1) and "config_invalid" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_json_example_parses(page: Path):
    for block in blocks(page, "json"):
        json.loads("\n".join(line for line in block.splitlines() if not line.lstrip().startswith("//")))


def table_commands() -> list[str]:
    """The first cells of the command tables: `oa-sandbox run [--workspace DIR] ... TASK`."""
    rows = []
    for page in COMMAND_PAGES:
        rows += re.findall(r"^\| `oa-sandbox ([^`]+)` \|", page.read_text(), re.MULTILINE)
    return rows


def test_every_command_of_the_cli_is_in_a_command_table(tmp_path: Path):
    listed = oa("--help", cwd=tmp_path).stdout
    commands = re.findall(r"^  ([a-z]+)  ", listed.split("Commands:")[1], re.MULTILINE)
    assert len(commands) >= 15
    documented = {row.split()[0] for row in table_commands()}
    assert set(commands) <= documented, set(commands) - documented


def command_of(row: str) -> list[str]:
    """`sessions prune [--older-than DURATION]` -> ["sessions", "prune"]; `apply ID` -> ["apply"]."""
    words = row.split()
    return words[:2] if len(words) > 1 and re.fullmatch(r"[a-z]+", words[1]) else words[:1]


@pytest.mark.parametrize("row", table_commands(), ids=lambda r: " ".join(command_of(r)))
def test_every_flag_a_command_table_names_exists(tmp_path: Path, row: str):
    command = command_of(row)
    helped = oa(*command, "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-zA-Z])\b", row)) - {"--help"}
    missing = [f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}\b", helped.stdout)]
    assert not missing, f"oa-sandbox {' '.join(command)}: {missing}"


def test_the_cli_pages_set_up_error_example_prints_what_it_shows(tmp_path: Path):
    """docs/cli.md's one-line stream-json of a set-up error (a model endpoint that refuses): run as
    written, it prints one line with every key the page shows, and no box is needed for it."""
    text = (ROOT / "docs" / "cli.md").read_text()
    line, shown = re.findall(r"^\$ (oa-sandbox run .*127\.0\.0\.1:9.*) 2>/dev/null\n(.*)$", text, re.MULTILINE)[0]
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    proc = oa(*shlex.split(line)[1:], cwd=tmp_path, env=env)
    assert proc.returncode == 2 and len(proc.stdout.splitlines()) == 1, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["type"] == "session_end" and out["status"] == "setup_error" and out["error"]["type"] == "model_api_error"
    assert out["reason"] in shown
    assert all(f'"{key}":' in proc.stdout for key in re.findall(r'"(\w+)":', shown))
