"""Issue 40 item 1: authority on resume comes from what the caller trusted at the session's start.

A session started with a policy file that lies inside the workspace (the repository's own CI
policy, named with --policy). The box rewrites that file with an ordinary allowed edit: it now
claims `tier = "admin"`, allows every shell command and opens egress. `run --resume` (no --policy)
must grant nothing more: the policy pinned at the start applies (and stderr says the file
changed), and the rewritten file, named again for a new session, counts as a workspace policy
(which may only ask or deny) whatever tier it claims. Real CLI processes, real containers, the
scripted model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import make_workspace

ROOT = Path(__file__).resolve().parents[2]
START_POLICY = 'tier = "user"\n\n[[rules]]\nid = "no-shell"\ntool = "shell"\ndecision = "deny"\n'
BOX_POLICY = (
    'tier = "admin"\n\n[[rules]]\nid = "box-says-admin"\ntool = "shell"\ndecision = "allow"\n\n'
    '[egress]\nallow = ["example.com"]\n'
)


def oa(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "GEMINI_", "ANTHROPIC_"))}
    environment.update(
        XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"), PYTHONPATH=str(ROOT)
    )
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        input="",
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
        cwd=ROOT,
    )


def script(path: Path, *turns: dict) -> str:
    path.write_text("".join(json.dumps(t) + "\n" for t in turns))
    return f"script:{path}"


@pytest.mark.docker
def test_resume_after_the_box_rewrote_an_in_workspace_policy_to_admin_grants_nothing_more(sandbox_image, tmp_path):
    """The box rewrites the session's in-workspace --policy file to `tier = "admin"` with a shell allow and
    egress: `run --resume` keeps the policy pinned at the start (the shell stays denied, stderr says the file
    changed), and the rewritten file named for a new session is refused as a workspace policy that allows."""
    ws = make_workspace(tmp_path / "ws", {"ci-policy.toml": START_POLICY, "a.py": "x = 1\n"})
    first_model = script(
        tmp_path / "first.jsonl",
        {
            "text": "",
            "tool_calls": [{"name": "write_file", "arguments": {"path": "ci-policy.toml", "content": BOX_POLICY}}],
        },
        {"text": "", "tool_calls": [{"name": "shell", "arguments": {"command": "touch FIRST"}}]},
        {"text": "first done"},
    )
    first = oa(
        tmp_path,
        "run",
        "--workspace",
        str(ws),
        "--workspace-mode",
        "bind",
        "--policy",
        str(ws / "ci-policy.toml"),
        "--model",
        first_model,
        "--non-interactive",
        "--auto-approve",
        "--output",
        "json",
        "task one",
    )
    assert first.returncode in (0, 3), first.stderr
    sid = json.loads(first.stdout)["session_id"]
    assert (ws / "ci-policy.toml").read_text() == BOX_POLICY and not (ws / "FIRST").exists()

    second_model = script(
        tmp_path / "second.jsonl",
        {"text": "", "tool_calls": [{"name": "shell", "arguments": {"command": "touch PWNED"}}]},
        {"text": "second done"},
    )
    second = oa(
        tmp_path, "run", "--resume", sid, "--model", second_model, "--non-interactive", "--output", "json", "task two"
    )
    assert not (ws / "PWNED").exists(), "the resumed session ran a command under the policy the box wrote"
    assert second.returncode in (0, 3), second.stderr
    assert json.loads(second.stdout)["session_id"] == sid
    assert "changed since session" in second.stderr and "ci-policy.toml" in second.stderr
    transcript = (tmp_path / "state" / "openagents-sandbox" / "sessions" / sid / "transcript.jsonl").read_text()
    assert "admin policy rule" not in transcript and "workspace policy rule no-shell" in transcript
    # the record pins what was trusted: path, digest, where the box could reach it
    record = json.loads((tmp_path / "state" / "openagents-sandbox" / "sessions" / sid / "session.json").read_text())
    pin = next(p for p in record["pins"] if p["role"] == "policy")
    assert pin["path"] == str(ws / "ci-policy.toml") and pin["box_reach"] is True
    pinned = tmp_path / "state" / "openagents-sandbox" / "sessions" / sid / "pins" / pin["pinned"]
    assert pinned.read_text() == START_POLICY

    # named again for a new session, the file inside the workspace is a workspace policy: its allow is refused
    fresh = oa(
        tmp_path,
        "run",
        "--workspace",
        str(ws),
        "--policy",
        str(ws / "ci-policy.toml"),
        "--model",
        second_model,
        "--non-interactive",
        "--output",
        "json",
        "task three",
    )
    assert fresh.returncode == 2 and "config_invalid" in fresh.stderr and "workspace policy" in fresh.stderr, (
        fresh.stderr
    )
    assert not (ws / "PWNED").exists()


@pytest.mark.docker
def test_resume_after_the_box_loosened_the_workspaces_own_policy_keeps_the_deny_it_had_at_the_start(
    sandbox_image, tmp_path
):
    """The box rewrites the workspace's own `.openagents/policy.toml` (which denied every shell
    command) into one that denies nothing: a resumed `--auto-approve` session still applies the deny
    pinned at the start beside today's file, so the command the start refused stays refused."""
    deny = 'tier = "workspace"\n\n[[rules]]\nid = "repo-no-shell"\ntool = "shell"\ndecision = "deny"\n'
    ws = make_workspace(tmp_path / "ws", {".openagents/policy.toml": deny, "a.py": "x = 1\n"})
    loosened = 'tier = "workspace"\n\n[[rules]]\nid = "harmless"\ntool = "read_file"\ndecision = "ask"\n'
    first_model = script(
        tmp_path / "first.jsonl",
        {
            "text": "",
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": ".openagents/policy.toml", "content": loosened}}
            ],
        },
        {"text": "first done"},
    )
    first = oa(
        tmp_path,
        "run",
        "--workspace",
        str(ws),
        "--workspace-mode",
        "bind",
        "--model",
        first_model,
        "--non-interactive",
        "--auto-approve",
        "--output",
        "json",
        "task one",
    )
    assert first.returncode in (0, 3), first.stderr
    sid = json.loads(first.stdout)["session_id"]
    assert (ws / ".openagents" / "policy.toml").read_text() == loosened
    second_model = script(
        tmp_path / "second.jsonl",
        {"text": "", "tool_calls": [{"name": "shell", "arguments": {"command": "touch PWNED"}}]},
        {"text": "second done"},
    )
    second = oa(
        tmp_path,
        "run",
        "--resume",
        sid,
        "--model",
        second_model,
        "--non-interactive",
        "--auto-approve",
        "--output",
        "json",
        "task two",
    )
    assert not (ws / "PWNED").exists(), "the resumed session dropped the workspace policy's deny the box removed"
    assert second.returncode in (0, 3), second.stderr
    transcript = (tmp_path / "state" / "openagents-sandbox" / "sessions" / sid / "transcript.jsonl").read_text()
    assert "workspace policy rule repo-no-shell" in transcript
