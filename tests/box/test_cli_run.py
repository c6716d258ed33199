"""`oa-sandbox run` as a user meets it (issue 14): exit codes, the summary and --output json, budgets,
compaction, --auto-approve, diffs, progress, the config file, stdin tasks, `transcript list`.

Every test runs the real CLI in a subprocess against real sandboxes, with the scripted model or the
fake model server on loopback. Each gets its own XDG_STATE_HOME and XDG_CONFIG_HOME.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import make_workspace
from tests.helpers.cli_run import OA, oa
from tests.helpers.fake_model_server import FakeModelServer

pytestmark = pytest.mark.docker


def script(tmp_path: Path, turns: list[dict], name: str = "s.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(t) for t in turns) + "\n")
    return path


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_run_whose_calls_were_refused_exits_3_with_each_refusal_in_the_json_and_the_summary(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "one\n"})
    s = script(
        tmp_path,
        [
            {
                "tool_calls": [
                    {"name": "edit_file", "arguments": {"path": "a.txt", "old_text": "one", "new_text": "two"}}
                ],
                "usage": {"prompt_tokens": 120, "completion_tokens": 30},
            },
            {
                "tool_calls": [
                    {"name": "shell", "arguments": {"command": "make test"}},
                    {"name": "shell", "arguments": {"command": "make lint"}},
                ],
                "usage": {"prompt_tokens": 200, "completion_tokens": 12},
            },
            {"text": "Fixed: the bug", "usage": {"prompt_tokens": 260, "completion_tokens": 8}},
        ],
    )
    proc = oa(
        tmp_path,
        "run",
        "--workspace",
        str(ws),
        "--model",
        f"script:{s}",
        "--non-interactive",
        "--output",
        "json",
        "fix it",
    )
    assert proc.returncode == 3, proc.stderr
    out = json.loads(proc.stdout)  # one JSON object, nothing else on stdout
    assert out["status"] == "finished" and out["turns"] == 3 and out["final_text"] == "Fixed: the bug"
    assert [c["tool"] for c in out["refused_calls"]] == ["edit_file", "shell", "shell"]
    assert all("non-interactive session" in c["reason"] and c["executor"] == "openagents" for c in out["refused_calls"])
    assert out["failed_calls"] == [] and out["changed_files"] == [] and out["tokens"] == {"input": 580, "output": 50}
    assert out["session_id"] and out["reason"] == "the model gave its final answer"
    assert (ws / "a.txt").read_text() == "one\n"
    assert (
        "calls: 3 refused" in proc.stderr
        and "refused  shell [openagents]" in proc.stderr
        and "tokens: 580 in, 50 out" in proc.stderr
    )


def test_a_clean_run_exits_0_shows_the_diff_under_its_call_and_a_diffstat(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "one\ntwo\n"})
    s = script(
        tmp_path,
        [
            {
                "tool_calls": [
                    {"name": "edit_file", "arguments": {"path": "a.txt", "old_text": "two", "new_text": "deux\ntrois"}}
                ]
            },
            {"tool_calls": [{"name": "shell", "arguments": {"command": "echo started; echo boom >&2; exit 4"}}]},
            {"text": "done"},
        ],
    )
    proc = oa(tmp_path, "run", "--workspace", str(ws), "--model", f"script:{s}", "--auto-approve", "go")
    assert proc.returncode == 0, proc.stderr  # a failed command is the model's to handle; nothing was refused
    err = proc.stderr
    assert "auto-approve: on" in err
    edit = err.index("→ edit_file path=a.txt")
    assert err.index("  ← ok [runtime]", edit) < err.index("    -two", edit) < err.index("    +deux", edit)
    shell = err.index("→ shell command=")
    assert "← failed: exit code 4" in err[shell:]
    assert "calls: 1 ok, 1 failed" in err and "failed   shell: exit code 4" in err
    assert "1 file changed:" in err and "a.txt  +2 -1" in err
    assert proc.stdout.strip() == "done"
    transcript = err.split("transcript: ")[1].split()[0]
    approvals = [(e["tool"], e["decision"], e["executor"]) for e in events(Path(transcript)) if e["type"] == "approval"]
    assert approvals == [("edit_file", "auto_approved", "user"), ("shell", "auto_approved", "user")]
    shown = oa(tmp_path, "transcript", "show", transcript).stdout
    assert shown.index("→ edit_file") < shown.index("-two") < shown.index("+deux") < shown.index("→ shell")


def test_auto_approve_never_beats_a_deny(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws")
    policy = tmp_path / "p.toml"
    policy.write_text('[[rules]]\nid = "no-rm"\ntool = "shell"\ncommand_prefix = "rm"\ndecision = "deny"\n')
    s = script(tmp_path, [{"tool_calls": [{"name": "shell", "arguments": {"command": "rm -f x"}}]}, {"text": "ok"}])
    proc = oa(
        tmp_path,
        "run",
        "--workspace",
        str(ws),
        "--model",
        f"script:{s}",
        "--auto-approve",
        "--policy",
        str(policy),
        "--output",
        "json",
        "go",
    )
    assert proc.returncode == 3, proc.stderr
    refused = json.loads(proc.stdout)["refused_calls"]
    assert len(refused) == 1 and "no-rm" in refused[0]["reason"]


def test_max_tokens_stops_the_session_typed_budget_exceeded(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws")
    turn = {
        "tool_calls": [{"name": "list_files", "arguments": {}}],
        "usage": {"prompt_tokens": 400, "completion_tokens": 100},
    }
    s = script(tmp_path, [turn] * 10 + [{"text": "never"}])
    proc = oa(
        tmp_path,
        "run",
        "--workspace",
        str(ws),
        "--model",
        f"script:{s}",
        "--max-tokens",
        "1200",
        "--output",
        "json",
        "go",
    )
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "stopped" and out["error"]["type"] == "budget_exceeded" and not out["error"]["recoverable"]
    assert (
        out["tokens"] == {"input": 1200, "output": 300} and out["turns"] == 3
    )  # the third reply spends it; its call does not run
    assert "1500 of 1200 tokens" in out["reason"]


def test_max_wall_stops_the_session_and_a_long_call_shows_its_elapsed_time(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws")
    s = script(tmp_path, [{"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 60"}}]}, {"text": "never"}])
    proc = oa(
        tmp_path,
        "run",
        "--workspace",
        str(ws),
        "--model",
        f"script:{s}",
        "--auto-approve",
        "--max-wall",
        "3",
        "--output",
        "json",
        "go",
    )
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["error"]["type"] == "budget_exceeded" and "--max-wall" in out["reason"] and out["turns"] == 1
    assert out["calls"]["cancelled"] == 1  # the running command was killed when the time ran out, not waited for
    assert "shell still running (1 s)" in proc.stderr  # stderr is a pipe here: plain progress lines
    result = next(e for e in events(Path(out["transcript"])) if e["type"] == "tool_result")
    assert result["state"] == "cancelled" and result["error"]["type"] == "budget_exceeded"


def test_compaction_keeps_a_long_session_under_a_small_context_window(sandbox_image, tmp_path):
    """12 turns each reading a 6 KB file, under a 3000-token window: without compaction the
    conversation would pass 18000 tokens; every request stays under the window, and the elided
    outputs say how to get them back."""
    ws = make_workspace(tmp_path / "ws", {f"f{i}.txt": str(i % 10) * 6000 for i in range(12)})
    window = 3000
    with FakeModelServer() as server:
        for i in range(12):
            server.openai_turn(tool_calls=[("read_file", {"path": f"f{i}.txt"})])
        server.openai_turn(text="read them all")
        proc = oa(
            tmp_path,
            "run",
            "--workspace",
            str(ws),
            "--model",
            "openai:local",
            "--base-url",
            server.base_url,
            "--context-window",
            str(window),
            "--output",
            "json",
            "go",
        )
        assert proc.returncode == 0, proc.stderr
        requests = [r["body"]["messages"] for r in server.requests]
    assert len(requests) == 13
    sizes = [sum(len(m.get("content") or "") for m in messages) // 4 for messages in requests]
    assert max(sizes) < window, sizes
    assert sum(len(m.get("content") or "") for m in requests[-1] if m["role"] == "tool") < 12 * 6000 / 2
    markers = [m["content"] for m in requests[-1] if m["role"] == "tool" and m["content"].startswith("[output elided")]
    assert markers and "call the tool again" in markers[0] and "read_file" in markers[0]
    assert "⋯ context: elided" in proc.stderr
    assert not any(
        "Authorization" in r["headers"] or "authorization" in r["headers"] for r in server.requests
    )  # no key on loopback


def test_openai_base_url_is_honoured_and_retries_are_said_as_they_happen(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws")
    with FakeModelServer() as server:
        server.reply({"error": "slow down"}, status=429, headers={"retry-after": "0"})
        server.reply({"error": "busy"}, status=503, headers={"retry-after": "0"})
        server.openai_turn(text="hello")
        proc = oa(
            tmp_path,
            "run",
            "--workspace",
            str(ws),
            "--model",
            "openai:local",
            "go",
            env={"OPENAI_BASE_URL": server.base_url},
        )
        assert proc.returncode == 0, proc.stderr
        assert len(server.requests) == 3
    assert "⟳ model: HTTP 429, retry 2/5 in 0 s" in proc.stderr and "⟳ model: HTTP 503, retry 3/5 in 0 s" in proc.stderr
    assert proc.stdout.strip() == "hello"


def test_config_file_gives_defaults_flags_win_workspace_is_the_cwd_and_the_task_comes_from_stdin(
    sandbox_image, tmp_path
):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "x\n"})
    s = script(tmp_path, [{"tool_calls": [{"name": "list_files", "arguments": {}}]}] * 3 + [{"text": "listed"}])
    config = tmp_path / "config" / "openagents-sandbox" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'model = "script:{s}"\nmax_turns = 2\n')
    proc = oa(tmp_path, "run", "--output", "json", "-", stdin="list the files\n", cwd=ws)
    assert proc.returncode == 1, proc.stderr  # max_turns = 2 from the file
    out = json.loads(proc.stdout)
    assert out["error"]["type"] == "max_turns" and out["turns"] == 2
    start = next(e for e in events(Path(out["transcript"])) if e["type"] == "session_start")
    assert start["task"] == "list the files\n" and start["workspace"] == str(ws)
    proc = oa(tmp_path, "run", "--max-turns", "10", "--output", "json", "-", stdin="again", cwd=ws)
    assert proc.returncode == 0 and json.loads(proc.stdout)["final_text"] == "listed"  # the flag wins


def test_transcript_list_is_newest_first(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws")
    s = script(tmp_path, [{"text": "hi"}])
    ids = [
        json.loads(
            oa(tmp_path, "run", "--workspace", str(ws), "--model", f"script:{s}", "--output", "json", "go").stdout
        )["session_id"]
        for _ in range(2)
    ]
    listed = oa(tmp_path, "transcript", "list").stdout.splitlines()
    assert [line.split()[2] for line in listed] == ids[::-1]
    assert all(line.split()[3] == "finished" and line.split()[4].endswith("transcript.jsonl") for line in listed)


def test_shell_output_is_streamed_while_the_command_runs_and_the_result_is_unchanged(sandbox_image, tmp_path):
    """stderr is read line by line while the session runs: the first line of the command's output
    arrives while the command still sleeps (it waits for a file this test creates only after)."""
    import select
    import time

    ws = make_workspace(tmp_path / "ws")
    gate = ws / "go-on"
    s = script(
        tmp_path,
        [
            {
                "tool_calls": [
                    {
                        "name": "shell",
                        "arguments": {
                            "command": "echo first-line; i=0; while [ ! -e go-on ] && [ $i -lt "
                            "600 ]; do sleep 0.1; i=$((i+1)); done; echo second-line"
                        },
                    }
                ]
            },
            {"text": "done"},
        ],
    )
    environment = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    proc = subprocess.Popen(
        [OA, "run", "--workspace", str(ws), "--model", f"script:{s}", "--auto-approve", "--output", "json", "go"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment,
    )
    seen = b""
    try:
        deadline = time.monotonic() + 120
        while "┆ first-line".encode() not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stderr], [], [], 1)
            if ready:
                chunk = os.read(proc.stderr.fileno(), 65536)
                if not chunk:
                    break
                seen += chunk
        assert b"\xe2\x94\x86 first-line" in seen, seen  # "┆ first-line": streamed, before the command could end
        assert b"second-line" not in seen and not gate.exists()
        gate.write_text("")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    transcript = Path(json.loads(out)["transcript"])
    result = next(e for e in events(transcript) if e["type"] == "tool_result")
    assert result["output"] == "first-line\nsecond-line\n" and result["meta"]["exit_code"] == 0
    assert not any(e["type"] == "tool_output" for e in events(transcript))  # chunks are for live views, not the record


def test_mcp_servers_from_the_config_file_are_offered_to_run_asked_for_and_stopped(sandbox_image, tmp_path):
    """issue 13: the user's stdio MCP servers named in config.toml start on the host for `run`, their
    tool is offered as mcp__<server>__<tool>, a call is refused without a policy in a non-interactive
    run (host-side tools ask every time), and the server is gone when the run ends."""
    from tests.helpers.acp_sdk import MCP_SERVER, alive

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    server_py = tmp_path / "notes_server.py"
    server_py.write_text(MCP_SERVER)
    pid_file, notes = tmp_path / "mcp.pid", tmp_path / "notes.txt"
    config = tmp_path / "config" / "openagents-sandbox" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(
        '[[mcp_servers]]\nname = "notes"\ncommand = '
        f"{json.dumps(sys.executable)}\nargs = [{json.dumps(str(server_py))}]\n"
        f"env = {{ PID_FILE = {json.dumps(str(pid_file))}, NOTES_FILE = {json.dumps(str(notes))} }}\n"
    )
    s = script(
        tmp_path,
        [{"tool_calls": [{"name": "mcp__notes__add_note", "arguments": {"text": "buy milk"}}]}, {"text": "done"}],
    )
    transcript = tmp_path / "t.jsonl"
    proc = oa(
        tmp_path,
        "run",
        "--workspace",
        str(ws),
        "--model",
        f"script:{s}",
        "--non-interactive",
        "--transcript",
        str(transcript),
        "--output",
        "json",
        "note it",
    )
    assert proc.returncode == 3, proc.stderr  # finished, with the MCP call refused (no policy allows it)
    out = json.loads(proc.stdout)
    assert [c["tool"] for c in out["refused_calls"]] == ["mcp__notes__add_note"]
    started = [e for e in events(transcript) if e["type"] == "session_start"][0]
    assert "mcp__notes__add_note" in started["tools"]
    assert not notes.exists(), "a refused call reached the server"
    pid = int(pid_file.read_text())
    assert not alive(pid), "the MCP server outlived the run"
