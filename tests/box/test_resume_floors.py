"""Pinned levels are floors (issue 49): a resumed session given other policy files still holds what
the files pinned at its start refused (a workspace_access level, a deny), unless a file the user
gives now says otherwise explicitly; the admin's pinned word is never dropped. Through the real
CLI with real sandboxes (`run --resume ID --apply --policy other.toml` over a copy-only start), and
the loader directly for each way a floor holds or is lifted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.policy.ladder import Access, Level
from orchestrator.policy.load import authority_sources, load_session_policy
from orchestrator.tools.catalog import LAND_ACTION, LAND_KIND, LAND_TOOL
from orchestrator.workspace.records import SessionRecord, WorkspaceMode
from tests.helpers import make_workspace
from tests.helpers.fake_model_server import FakeModelServer

ROOT = Path(__file__).resolve().parents[2]
COPY_ONLY = 'workspace_access = "copy-only"\n'
ALLOW_SHELL = '[[rules]]\ntool = "shell"\ndecision = "allow"\n'


def oa(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "GEMINI_", "ANTHROPIC_", "OA_ADMIN"))
    }
    environment.update(
        XDG_STATE_HOME=str(tmp_path / "state"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        PYTHONPATH=str(ROOT),
        **(env or {}),
    )
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        input="",
        capture_output=True,
        text=True,
        timeout=240,
        env=environment,
        cwd=ROOT,
    )


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_resume_with_a_new_policy_over_a_copy_only_pin_still_refuses_the_landing(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "mine.toml").write_text(COPY_ONLY)
    (policies / "other.toml").write_text(ALLOW_SHELL)
    (policies / "lift.toml").write_text('workspace_access = "read-write"\n' + ALLOW_SHELL)
    with FakeModelServer() as server:
        server.openai_stream("", [("write_file", {"path": "b.txt", "content": "from the box\n"})])
        server.openai_stream("first done")
        server.openai_stream("second done")
        server.openai_stream("third done")
        model = [
            "--model",
            "openai:m",
            "--base-url",
            server.base_url,
            "--non-interactive",
            "--auto-approve",
            "--output",
            "json",
        ]
        first = oa(tmp_path, "run", "--workspace", str(ws), "--policy", str(policies / "mine.toml"), *model, "task one")
        assert first.returncode == 0, first.stderr
        sid = json.loads(first.stdout)["session_id"]
        assert json.loads(first.stdout)["workspace_mode"] == "copy"
        second = oa(
            tmp_path, "run", "--resume", sid, "--apply", "--policy", str(policies / "other.toml"), *model, "task two"
        )
        out = json.loads(second.stdout)
        assert second.returncode == 3 and out["error"]["type"] == "refused_by_policy", second.stderr
        assert "copy-only" in out["error"]["message"] and not (ws / "b.txt").exists()
        assert "mine.toml" in second.stderr and "still holds on resume: workspace_access = copy-only" in second.stderr
        applied = oa(tmp_path, "apply", sid)  # the session's own landing later: the same floor
        assert applied.returncode != 0 and "copy-only" in applied.stderr and not (ws / "b.txt").exists()
        # the user's own explicit word lifts it, and says so
        third = oa(
            tmp_path, "run", "--resume", sid, "--apply", "--policy", str(policies / "lift.toml"), *model, "task three"
        )
        assert third.returncode == 0, third.stderr
        assert "workspace_access = copy-only (the policy" in third.stderr and "no longer applies" in third.stderr
    assert (ws / "b.txt").read_text() == "from the box\n"


# -- the loader: each floor, how it holds and how it is lifted ------------------------------------------------


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("OA_ADMIN_POLICY", str(tmp_path / "no-admin.toml"))  # none, unless a test writes it
    return tmp_path


def started(tmp_path: Path, ws: Path, files: list[Path]) -> SessionRecord:
    """A session record whose start pinned `files` (and the admin file, if any), as session.open does."""
    record = SessionRecord(
        id=f"20270101-000000-{len(list(tmp_path.iterdir())):06d}",
        created=time.time(),
        workspace=str(ws),
        mode=WorkspaceMode.COPY,
        box_workspace=str(ws),
        user="1000:1000",
        status="finished",
        transcript=str(tmp_path / "t.jsonl"),
    )
    record.save()
    read = authority_sources(load_session_policy(ws, [str(f) for f in files]), ws, None)
    from orchestrator.policy import pins

    pins.save(record, read)
    record.policy_files = [str(f.resolve()) for f in files]
    record.save()
    return record


def landing(policy) -> Level:
    return policy.ladder().level(LAND_TOOL, LAND_KIND, LAND_ACTION)[0]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_pinned_level_holds_under_new_files_until_one_sets_the_level_itself(state, capsys):
    ws = make_workspace(state / "ws", {"a.txt": "a\n"})
    record = started(state, ws, [write(state / "mine.toml", COPY_ONLY)])
    policy = load_session_policy(ws, [str(write(state / "other.toml", ALLOW_SHELL))], record)
    assert policy.access == Access.COPY_ONLY and landing(policy) == Level.REFUSE
    assert "mine.toml" in capsys.readouterr().err
    policy = load_session_policy(ws, [], record)  # no file at all now (the API's resume without policy_files): the same
    assert policy.access == Access.COPY_ONLY
    policy = load_session_policy(ws, [str(write(state / "tier.toml", 'tier = "admin"\n' + ALLOW_SHELL))], record)
    assert policy.access == Access.COPY_ONLY  # a higher tier is no word about the level
    policy = load_session_policy(ws, [str(write(state / "lift.toml", 'workspace_access = "read-write"\n'))], record)
    assert policy.access == Access.READ_WRITE and landing(policy) == Level.AUTOMATIC
    assert "no longer applies" in capsys.readouterr().err
    policy = load_session_policy(ws, [str(state / "mine.toml")], record)  # named again: its pin, as ever
    assert policy.access == Access.COPY_ONLY


def test_a_file_where_the_box_writes_cannot_lift_a_pinned_level(state):
    ws = make_workspace(state / "ws", {"a.txt": "a\n"})
    record = started(state, ws, [write(state / "mine.toml", COPY_ONLY)])
    planted = write(ws / "lift.toml", 'workspace_access = "read-write"\n')
    policy = load_session_policy(ws, [str(planted)], record)
    assert policy.access == Access.COPY_ONLY


def test_a_pinned_deny_holds_until_a_rule_for_the_same_call_says_otherwise(state, capsys):
    ws = make_workspace(state / "ws", {"a.txt": "a\n"})
    record = started(state, ws, [write(state / "mine.toml", '[[rules]]\ntool = "shell"\ndecision = "deny"\n')])
    wider = write(state / "wider.toml", '[[rules]]\nkind = "execute"\ndecision = "allow"\n')
    policy = load_session_policy(ws, [str(wider)], record)
    assert policy.ladder().level("shell", "execute", "shell", "ls")[0] == Level.REFUSE
    policy = load_session_policy(ws, [str(write(state / "same.toml", ALLOW_SHELL))], record)
    assert policy.ladder().level("shell", "execute", "shell", "ls")[0] == Level.AUTOMATIC
    assert "a deny rule (the policy" in capsys.readouterr().err


def test_the_admins_pinned_level_and_denies_are_never_dropped(state, monkeypatch, capsys):
    ws = make_workspace(state / "ws", {"a.txt": "a\n"})
    admin = write(state / "admin.toml", COPY_ONLY + '[[rules]]\ntool = "shell"\ndecision = "deny"\n')
    monkeypatch.setenv("OA_ADMIN_POLICY", str(admin))
    record = started(state, ws, [])
    write(admin, 'workspace_access = "read-write"\n')  # the admin file changed since the start
    lift = write(state / "lift.toml", 'workspace_access = "read-write"\n' + ALLOW_SHELL)
    policy = load_session_policy(ws, [str(lift)], record)
    assert (
        policy.access == Access.COPY_ONLY
        and policy.ladder().level("shell", "execute", "shell", "ls")[0] == Level.REFUSE
    )
    assert "never dropped" in capsys.readouterr().err
    monkeypatch.setenv("OA_ADMIN_POLICY", str(state / "elsewhere.toml"))  # pointed away: the pin still holds
    policy = load_session_policy(ws, [str(lift)], record)
    assert policy.access == Access.COPY_ONLY


def test_a_pinned_egress_deny_holds_before_a_new_files_allow(state):
    ws = make_workspace(state / "ws", {"a.txt": "a\n"})
    deny = '[[egress.rules]]\naction = "deny"\nhost = "evil.example"\n'
    record = started(state, ws, [write(state / "mine.toml", deny)])
    allow = '[egress]\nallow = ["evil.example"]\n[[egress.rules]]\naction = "allow"\nhost = "*.example"\n'
    egress = load_session_policy(ws, [str(write(state / "other.toml", allow))], record).egress
    assert [(r.action, r.host) for r in egress.rules][:1] == [("deny", "evil.example")]
    lift = '[[egress.rules]]\naction = "allow"\nhost = "evil.example"\n'
    egress = load_session_policy(ws, [str(write(state / "lift.toml", lift))], record).egress
    assert [(r.action, r.host) for r in egress.rules] == [("allow", "evil.example")]
