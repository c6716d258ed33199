"""Hooks without a box: real hook processes (small scripts in tmp) run through the engine, and the
[[hooks]] tables loaded with their tiers (docs/hooks.md)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.hooks.engine import Hooks
from orchestrator.policy.hook_spec import in_force
from orchestrator.policy.ladder import Tier, parse_policy
from orchestrator.policy.load import load_session_policy
from orchestrator.transcript import Transcript

PY = sys.executable


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"#!{PY}\nimport json, os, sys, time\n{body}\n")
    path.chmod(0o755)
    return path


def hooks_of(tmp_path: Path, toml: str, tier: Tier = Tier.USER) -> tuple[Hooks, Path]:
    policy = parse_policy(toml.encode(), "test", ".toml", tier)
    path = tmp_path / "t.jsonl"
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    specs, _ = in_force(policy.hooks, True, ws, [])
    return Hooks(specs, ws, Transcript(path), "s1", model_key="OPENAI_API_KEY"), path


def records(path: Path) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "hook"]


def hook_toml(command: Path | list[str], event: str = "BeforeTool", extra: str = "") -> str:
    argv = [str(command)] if isinstance(command, Path) else command
    return f'[[hooks]]\nevent = "{event}"\ncommand = {json.dumps(argv)}\n{extra}\n'


def test_exit_2_blocks_with_stderr_as_reason_and_the_payload_is_one_json_object(tmp_path):
    seen = tmp_path / "seen.json"
    hook = script(
        tmp_path,
        "h.py",
        f"d = json.load(sys.stdin); open({str(seen)!r}, 'w').write(json.dumps(d))\n"
        "if 'curl' in d['tool_input']['command']: print('no curl here', file=sys.stderr); sys.exit(2)",
    )
    hooks, path = hooks_of(tmp_path, hook_toml(hook, extra='matcher = "shell"'))
    verdict = hooks.fire(
        "BeforeTool", {"tool_name": "shell", "tool_input": {"command": "curl x"}}, tool="shell", call_id="c1"
    )
    assert verdict.blocked and "no curl here" in verdict.reason
    payload = json.loads(seen.read_text())
    assert (
        payload["hook_event_name"] == "BeforeTool"
        and payload["session_id"] == "s1"
        and payload["cwd"] == str(tmp_path / "ws")
    )
    assert not hooks.fire("BeforeTool", {"tool_name": "shell", "tool_input": {"command": "ls"}}, tool="shell").blocked
    assert not hooks.fire(
        "BeforeTool", {"tool_name": "read_file", "tool_input": {}}, tool="read_file"
    ).blocked  # matcher: shell only
    rec = records(path)
    assert rec[0]["executor"] == "user" and rec[0]["outcome"] == "blocked" and rec[0]["call_id"] == "c1"


def test_json_answer_fields_are_honoured(tmp_path):
    hook = script(
        tmp_path,
        "h.py",
        "print(json.dumps({'decision': 'deny', 'reason': 'policy says no', 'systemMessage': 'hi',"
        " 'hookSpecificOutput': {'additionalContext': 'lint: 2 warnings'}}))",
    )
    hooks, path = hooks_of(tmp_path, hook_toml(hook))
    verdict = hooks.fire("BeforeTool", {}, tool="shell")
    assert verdict.blocked and "policy says no" in verdict.reason and verdict.context == ["lint: 2 warnings"]
    assert records(path)[0]["system_message"] == "hi"


@pytest.mark.parametrize(
    "body,why",
    [
        ("time.sleep(30)", "timeout"),
        ("raise SystemExit(1)", "error"),
        ("print('not json')", "error"),
        ("sys.stdout.write('x' * (50 * 1024 * 1024))", "error"),
    ],
)
def test_a_broken_hook_fails_closed_before_and_is_reported_after(tmp_path, body, why):
    hook = script(tmp_path, "h.py", body)
    hooks, path = hooks_of(tmp_path, hook_toml(hook, extra="timeout = 2") + hook_toml(hook, "AfterTool", "timeout = 2"))
    started = time.monotonic()
    before = hooks.fire("BeforeTool", {}, tool="shell")
    after = hooks.fire("AfterTool", {}, tool="shell")
    assert time.monotonic() - started < 20
    assert before.blocked and before.error_type is ErrorType.HOOK_FAILED
    assert not after.blocked
    rec = records(path)
    assert [r["outcome"] for r in rec] == [why, why] and all(r["error_type"] == "hook_failed" for r in rec)


def test_a_hanging_hook_and_its_children_are_killed_at_the_timeout(tmp_path):
    pidfile = tmp_path / "child.pid"
    hook = script(
        tmp_path,
        "h.py",
        f"import subprocess\np = subprocess.Popen(['sleep', '300'])\nopen({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(300)",
    )
    hooks, _ = hooks_of(tmp_path, hook_toml(hook, extra="timeout = 1.5"))
    assert hooks.fire("BeforeTool", {}, tool="shell").blocked
    pid = int(pidfile.read_text())
    time.sleep(0.3)
    try:
        os.kill(pid, 0)
        alive = Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except ProcessLookupError:
        alive = False
    assert not alive, "the hook's child outlived its timeout"


def test_escape_sequences_in_what_a_hook_prints_are_escaped(tmp_path):
    hook = script(tmp_path, "h.py", "print('\\x1b]52;c;cHduZWQ=\\x07\\x1b[2Jgone', file=sys.stderr); sys.exit(2)")
    hooks, path = hooks_of(tmp_path, hook_toml(hook))
    verdict = hooks.fire("BeforeTool", {}, tool="shell")
    assert "\x1b" not in verdict.reason and "\x07" not in verdict.reason and "gone" in verdict.reason
    assert "\x1b" not in path.read_text() and "\\u001b" not in path.read_text()


def test_the_environment_is_scrubbed_of_the_model_key(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-model-key")
    monkeypatch.setenv("SOME_TOKEN", "tok")
    dump = tmp_path / "env.json"
    hook = script(tmp_path, "h.py", f"open({str(dump)!r}, 'w').write(json.dumps(dict(os.environ)))")
    hooks, _ = hooks_of(tmp_path, hook_toml(hook, extra='env = ["OPENAI_API_KEY", "PATH"]'))
    hooks.fire("BeforeTool", {}, tool="shell")
    env = json.loads(dump.read_text())
    assert "OPENAI_API_KEY" not in env and "SOME_TOKEN" not in env and env["OA_HOOK_EVENT"] == "BeforeTool"


def test_a_workspace_file_cannot_trust_itself_and_its_hooks_do_not_run_untrusted(tmp_path, monkeypatch):
    monkeypatch.setenv("OA_ADMIN_POLICY", str(tmp_path / "none.toml"))
    ws = tmp_path / "ws"
    (ws / ".openagents").mkdir(parents=True)
    with pytest.raises(OpenAgentsError, match="trust"):
        parse_policy(b"trust_workspace_hooks = true\n", "w", ".toml", Tier.WORKSPACE)
    (ws / ".openagents/policy.toml").write_text(hook_toml(["/bin/true"]))
    policy = load_session_policy(ws, [])
    specs, dropped = in_force(list(policy.hooks), policy.hooks_trusted, ws, [ws])
    assert not specs and "trust_workspace_hooks" in dropped[0]
    user = tmp_path / "user.toml"
    user.write_text("trust_workspace_hooks = true\n")
    policy = load_session_policy(ws, [str(user)])
    assert policy.hooks_trusted and len(in_force(list(policy.hooks), policy.hooks_trusted, ws, [ws])[0]) == 1


def test_a_user_hook_naming_a_script_in_the_workspace_is_workspace_content(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "guard.sh").write_text("#!/bin/sh\nexit 0\n")
    policy = parse_policy(hook_toml(["sh", "guard.sh"]).encode(), "u", ".toml", Tier.USER)
    specs, dropped = in_force(policy.hooks, False, ws, [ws])
    assert not specs and "guard.sh" in dropped[0]


def test_admin_hooks_run_first_and_a_user_allow_undoes_no_block(tmp_path, monkeypatch):
    order = tmp_path / "order"
    admin_hook = script(
        tmp_path,
        "a.py",
        f"open({str(order)!r}, 'a').write('admin ')\nprint('admin says no', file=sys.stderr); sys.exit(2)",
    )
    user_hook = script(
        tmp_path, "u.py", f"open({str(order)!r}, 'a').write('user ')\nprint(json.dumps({{'decision': 'allow'}}))"
    )
    admin = tmp_path / "admin.toml"
    admin.write_text(hook_toml(admin_hook, extra="order = 5"))
    user = tmp_path / "user.toml"
    user.write_text(
        'tier = "admin"\n' + hook_toml(user_hook, extra="order = -100")
    )  # a user file naming itself admin is still given as --policy
    monkeypatch.setenv("OA_ADMIN_POLICY", str(admin))
    ws = tmp_path / "ws"
    ws.mkdir()
    policy = load_session_policy(ws, [str(user)])
    specs, _ = in_force(list(policy.hooks), policy.hooks_trusted, ws, [ws])
    hooks = Hooks(specs, ws, Transcript(tmp_path / "t.jsonl"))
    verdict = hooks.fire("BeforeTool", {}, tool="shell")
    assert verdict.blocked and "admin says no" in verdict.reason


def test_the_hooks_command_lists_hooks_their_origin_and_what_cannot_run(tmp_path):
    import subprocess

    ws = tmp_path / "ws"
    (ws / ".openagents").mkdir(parents=True)
    (ws / ".openagents/policy.toml").write_text(hook_toml(["/bin/true"]))
    user = tmp_path / "u.toml"
    user.write_text(
        hook_toml(["/nonexistent/guard"], "AfterTool", 'matcher = "shell"') + hook_toml(["/bin/true"], "SessionStart")
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
        "OA_ADMIN_POLICY": str(tmp_path / "none"),
    }
    proc = subprocess.run(
        [PY, "-m", "orchestrator.cli", "hooks", "--workspace", str(ws), "--policy", str(user)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("FAIL AfterTool") and str(user) in lines[0] and "cannot run" in proc.stdout
    assert any(line.startswith("ok   SessionStart") for line in lines)
    assert "not in force: BeforeTool hook 0 of .openagents/policy.toml" in proc.stdout


def test_transcript_show_prints_a_hook_block_escaped(tmp_path):
    import subprocess

    hook = script(
        tmp_path,
        "h.py",
        "print(json.dumps({'decision': 'block', 'reason': 'no \\x1b[31mred', 'systemMessage': 'told \\x07you'}))",
    )
    hooks, path = hooks_of(tmp_path, hook_toml(hook, extra='id = "guard"'))
    hooks.fire("BeforeTool", {}, tool="shell", call_id="c1")
    hooks.transcript.close()
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    shown = subprocess.run(
        [PY, "-m", "orchestrator.cli", "transcript", "show", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "hook guard BeforeTool blocked" in shown.stdout and "told" in shown.stdout
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout


def test_a_hook_never_runs_in_the_workspace_so_box_planted_modules_are_not_loaded(tmp_path):
    """Attack (review of issue 35): the box writes json.py into the workspace; a user's hook
    `python3 -c 'import json, ...'` run with the workspace as its working directory imported it and
    ran the box's code on the host. A hook now runs in an empty directory of its own."""
    hooks, _ = hooks_of(
        tmp_path,
        hook_toml([PY, "-c", "import json, os, sys; json.load(sys.stdin); print(os.getcwd(), file=sys.stderr)"]),
    )
    ws = tmp_path / "ws"
    marker = tmp_path / "pwned"
    (ws / "json.py").write_text(f"open({str(marker)!r}, 'w').write('box code ran on the host')\n")
    verdict = hooks.fire("BeforeTool", {"tool_name": "shell", "tool_input": {"command": "ls"}}, tool="shell")
    assert not verdict.blocked, verdict.reason
    assert not marker.exists()


def test_a_hook_naming_a_workspace_file_that_appears_later_is_workspace_content(tmp_path):
    """Attack: a user hook named `hooks/check.py` (relative) or WORKSPACE/hooks/check.py (absolute) while
    the file did not exist yet was not flagged; the box then made it and the next event ran it. A
    relative word now resolves in the hook's own empty directory (nothing of the box's), and an
    absolute one under a box root is workspace content whether or not it exists."""
    ws = tmp_path / "ws"
    ws.mkdir()
    marker = tmp_path / "pwned"
    absolute = ws / "hooks" / "check.py"
    policy = parse_policy(hook_toml([PY, str(absolute)]).encode(), "test", ".toml", Tier.USER)
    kept, dropped = in_force(policy.hooks, False, ws, [ws])
    assert kept == [] and dropped  # untrusted: not in force, though the file is not there yet
    hooks, path = hooks_of(tmp_path, hook_toml([PY, "hooks/check.py"]))
    absolute.parent.mkdir(exist_ok=True)
    absolute.write_text(f"open({str(marker)!r}, 'w').write('box code ran on the host')\n")
    verdict = hooks.fire("BeforeTool", {"tool_name": "shell", "tool_input": {"command": "ls"}}, tool="shell")
    assert verdict.blocked and not marker.exists()  # the relative script is not found where the hook runs: fails closed
