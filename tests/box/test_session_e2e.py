"""Whole sessions through the CLI: real model server on loopback (or a script), real containers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import chown_tree, committed_example, make_workspace, run_busy_in_shell
from tests.helpers.fake_model_server import FakeModelServer

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
OA = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
HOST_KEY = "sk-fake-host-key-7d1f0c2b9a8e4f66"


def run_cli(*args, env=None, timeout=180):
    return subprocess.run(
        [OA, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_every_outcome_names_its_executor(evts: list[dict]) -> None:
    outcomes = [e for e in evts if e["type"] in ("approval", "tool_result", "session_end")]
    assert outcomes
    for e in outcomes:
        assert e.get("executor") in ("openagents", "runtime", "user"), e


def test_scripted_example_fixes_the_bug(sandbox_image, tmp_path):
    ws = committed_example(
        tmp_path / "calc"
    )  # the README's main job fixes examples/calc in place: the committed, buggy version
    chown_tree(ws)
    transcript = tmp_path / "t.jsonl"
    proc = run_cli(
        "run",
        "--workspace",
        str(ws),
        "--model",
        f"script:{ROOT / 'examples/calc.jsonl'}",
        "--non-interactive",
        "--policy",
        str(ROOT / "examples/policy.toml"),
        "--transcript",
        str(transcript),
        "fix the bug",
    )
    assert proc.returncode == 0, proc.stderr
    check = subprocess.run(
        [sys.executable, "-B", "-m", "unittest", "-q", "test_calc"], cwd=ws, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
    evts = events(transcript)
    assert_every_outcome_names_its_executor(evts)
    states = [e["state"] for e in evts if e["type"] == "tool_call" and e["tool"] == "edit_file"]
    assert states == ["validating", "awaiting_approval", "scheduled", "executing", "success"]
    shell_results = [e for e in evts if e["type"] == "tool_result" and e["tool"] == "shell"]
    assert "FAILED" in shell_results[0]["output"] and shell_results[-1]["output"].rstrip().endswith("OK")
    assert all(e["executor"] == "runtime" for e in shell_results)


def test_openai_session_against_the_fake_server(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"app.py": "print('helo')\n"})
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "rules:\n  - {id: edits, kind: edit, decision: allow}\n  - "
        "{id: env, tool: shell, command_prefix: env, decision: allow}\n"
    )
    transcript = tmp_path / "t.jsonl"
    with FakeModelServer() as server:
        (
            server.openai_turn("reading", [("read_file", {"path": "app.py"})])
            .openai_turn("", [("edit_file", '{"path": "app.py", "old_text": ')])  # broken JSON
            .openai_turn("", [("rm_rf", {"path": "."})])  # unknown tool
            .openai_turn("", [("shell", {"command": "curl http://example.invalid"})])  # not allowed: refused
            .openai_turn("", [("edit_file", {"path": "app.py", "old_text": "helo", "new_text": "hello"})])
            .openai_turn("", [("shell", {"command": "env"})])
            .openai_turn("Fixed the typo.")
        )
        proc = run_cli(
            "run",
            "--workspace",
            str(ws),
            "--model",
            "openai:gpt-test",
            "--base-url",
            server.base_url,
            "--non-interactive",
            "--policy",
            str(policy),
            "--transcript",
            str(transcript),
            "fix the typo",
            env={"OPENAI_API_KEY": HOST_KEY},
        )
        requests = server.requests
    assert proc.returncode == 3, proc.stderr  # finished, but the curl call was refused
    assert proc.stdout.strip() == "Fixed the typo."
    assert (ws / "app.py").read_text() == "print('hello')\n"
    tool_messages = [m["content"] for m in requests[-1]["body"]["messages"] if m["role"] == "tool"]
    assert "ERROR invalid_arguments (recoverable)" in tool_messages[1]
    assert "ERROR unknown_tool (recoverable)" in tool_messages[2]
    assert "ERROR refused_by_policy (recoverable)" in tool_messages[3]
    assert "PATH=" in tool_messages[5] and HOST_KEY not in tool_messages[5]
    assert all(r["headers"]["Authorization"] == f"Bearer {HOST_KEY}" for r in requests)
    assert HOST_KEY not in transcript.read_text() and HOST_KEY not in proc.stderr
    evts = events(transcript)
    assert_every_outcome_names_its_executor(evts)
    assert evts[-1]["type"] == "session_end" and evts[-1]["status"] == "finished"


def test_gemini_session_against_the_fake_server(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"notes.md": "TODO: ship\n"})
    with FakeModelServer() as server:
        server.gemini_turn("", [("grep_files", {"pattern": "TODO"})]).gemini_turn("One TODO: ship.")
        proc = run_cli(
            "run",
            "--workspace",
            str(ws),
            "--model",
            "gemini:gemini-test",
            "--base-url",
            f"http://127.0.0.1:{server.port}/v1beta",
            "--non-interactive",
            "--transcript",
            str(tmp_path / "t.jsonl"),
            "find todos",
            env={"GEMINI_API_KEY": "AIza-fake-key-for-tests"},
        )
        second = server.requests[1]["body"]
    assert proc.returncode == 0, proc.stderr
    response = second["contents"][-1]["parts"][0]["functionResponse"]
    assert response["name"] == "grep_files" and "notes.md:1:TODO: ship" in response["response"]["content"]


def test_loop_detector_stops_the_session(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    script = tmp_path / "loop.jsonl"
    script.write_text((json.dumps({"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]}) + "\n") * 8)
    transcript = tmp_path / "t.jsonl"
    proc = run_cli(
        "run",
        "--workspace",
        str(ws),
        "--model",
        f"script:{script}",
        "--non-interactive",
        "--transcript",
        str(transcript),
        "loop",
    )
    assert proc.returncode == 1
    end = events(transcript)[-1]
    assert end["status"] == "stopped" and end["error"]["type"] == "loop_detected" and end["turns"] == 5


def test_max_turns_stops_the_session(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n", "b.txt": "b\n"})
    script = tmp_path / "s.jsonl"
    script.write_text(
        "\n".join(
            json.dumps({"tool_calls": [{"name": "read_file", "arguments": {"path": p}}]})
            for p in ["a.txt", "b.txt"] * 3
        )
    )
    transcript = tmp_path / "t.jsonl"
    proc = run_cli(
        "run",
        "--workspace",
        str(ws),
        "--model",
        f"script:{script}",
        "--max-turns",
        "2",
        "--non-interactive",
        "--transcript",
        str(transcript),
        "x",
    )
    assert proc.returncode == 1 and events(transcript)[-1]["error"]["type"] == "max_turns"


def test_missing_key_and_bad_policy_are_setup_errors(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    proc = subprocess.run(
        [OA, "run", "--workspace", str(ws), "--model", "openai:x", "task"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 2 and "OPENAI_API_KEY" in proc.stderr
    bad = tmp_path / "p.toml"
    bad.write_text("bypass = true\n")
    proc = run_cli("run", "--workspace", str(ws), "--model", "script:/dev/null", "--policy", str(bad), "task")
    assert proc.returncode == 2 and "bypass" in proc.stderr


def test_ctrl_c_cancels_the_running_call_and_removes_the_sandbox(sandbox_image, docker_client, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"keep.txt": "kept\n"})
    proc, transcript = run_busy_in_shell(tmp_path, ws)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130  # cancelled
    end = events(transcript)[-1]
    assert end["type"] == "session_end" and end["status"] == "cancelled" and end["executor"] == "user"
    assert (ws / "keep.txt").read_text() == "kept\n"
    leftovers = docker_client.containers.list(
        all=True, filters={"label": f"dev.openagents.sandbox.host-pid={proc.pid}"}
    )
    assert leftovers == []
