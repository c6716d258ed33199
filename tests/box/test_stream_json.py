"""`oa-sandbox run --output stream-json` (issue 27 item 2) as a script meets it: the real CLI (this
worktree's code, in a subprocess), real sandboxes, the scripted model or a streaming model server of
our own on loopback. Every stdout line is parsed; the last is always one session_end holding what
`--output json` prints, set-up errors and Ctrl-C included; whatever the box or the model wrote
reaches stdout as JSON escapes, never as a raw control byte."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.cli.json_exits import exit_json as _exit_json
from tests.helpers import make_workspace
from tests.helpers.fake_model_server import FakeModelServer
from tests.helpers.transcript import _raw_hidden

ROOT = Path(__file__).resolve().parents[2]
SUMMARY_KEYS = set(_exit_json(0, "finished", None))
ESCAPES = r"printf 'before\033[2J\033]52;c;aGk=\007\033[8mhidden\033[0m\rfake prompt\n'; seq 1 3"


def environment(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "GEMINI_", "ANTHROPIC_"))}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"), PYTHONPATH=str(ROOT))
    return env


def oa(tmp_path: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        input=b"",
        capture_output=True,
        timeout=timeout,
        env=environment(tmp_path),
        cwd=ROOT,
    )


def lines_of(stdout: bytes) -> list[dict]:
    """Every stdout line as JSON, each with a type; nothing else is there, and nothing raw."""
    text = stdout.decode("utf-8")
    assert text.endswith("\n") and _raw_hidden(text.replace("\n", "")) == [], text[-500:]
    parsed = [json.loads(line) for line in text.split("\n")[:-1]]
    assert all(isinstance(p, dict) and isinstance(p.get("type"), str) for p in parsed)
    assert [p["type"] for p in parsed].count("session_end") == 1 and parsed[-1]["type"] == "session_end"
    assert SUMMARY_KEYS <= set(parsed[-1])
    return parsed


def script(tmp_path: Path, turns: list[dict]) -> Path:
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in turns) + "\n")
    return path


@pytest.mark.docker
def test_a_session_streams_each_typed_event_as_one_escaped_json_line(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "one\n"})
    s = script(
        tmp_path,
        [
            {
                "text": "Looking \x1b]0;title\x07first.",
                "tool_calls": [
                    {"name": "read_file", "arguments": {"path": "a.txt"}},
                    {"name": "shell", "arguments": {"command": ESCAPES}},
                ],
                "usage": {"prompt_tokens": 100, "completion_tokens": 10},
            },
            {
                "tool_calls": [
                    {"name": "edit_file", "arguments": {"path": "a.txt", "old_text": "one", "new_text": "two"}}
                ]
            },
            {"text": "done \x1b[31mred", "usage": {"prompt_tokens": 150, "completion_tokens": 5}},
        ],
    )
    proc = oa(
        tmp_path,
        "run",
        "--workspace",
        str(ws),
        "--model",
        f"script:{s}",
        "--auto-approve",
        "--workspace-mode",
        "bind",
        "--output",
        "stream-json",
        "go",
    )
    assert proc.returncode == 0, proc.stderr.decode()
    events = lines_of(proc.stdout)
    types = [e["type"] for e in events]
    assert (
        types.index("session_start")
        < types.index("model_request")
        < types.index("model_response")
        < types.index("budget")
    )
    assert {"tool_call", "approval", "tool_result", "tool_output", "checkpoint"} <= set(types)
    start, end = events[types.index("session_start")], events[-1]
    assert (
        start["session_id"]
        and end["session_id"] == start["session_id"]
        and end["status"] == "finished"
        and end["exit_code"] == 0
    )
    assert (
        end["final_text"] == "done \x1b[31mred" and end["turns"] == 3 and end["tokens"] == {"input": 250, "output": 15}
    )
    assert [c["path"] for c in end["changed_files"]] == ["a.txt"] and end["transcript"]
    shell = next(e for e in events if e["type"] == "tool_result" and e["tool"] == "shell")
    assert shell["output"].startswith(
        "before\x1b[2J\x1b]52;c;aGk=\x07\x1b[8mhidden\x1b[0m\rfake prompt\n1\n"
    )  # whole, once parsed
    assert (
        b"\\u001b[2J" in proc.stdout
        and b"\x1b" not in proc.stdout
        and b"\r" not in proc.stdout
        and b"\x07" not in proc.stdout
    )
    budget = [e for e in events if e["type"] == "budget"]
    assert [b["tokens"] for b in budget] == [
        {"input": 100, "output": 10},
        {"input": 100, "output": 10},
        {"input": 250, "output": 15},
    ]
    assert all(b["context_window"] == 128_000 and b["max_tokens"] is None for b in budget)
    states = [e["state"] for e in events if e["type"] == "tool_call" and e["tool"] == "edit_file"]
    assert states == ["validating", "awaiting_approval", "scheduled", "executing", "success"]
    approval = next(e for e in events if e["type"] == "approval" and e["tool"] == "edit_file")
    assert approval["decision"] == "auto_approved" and approval["executor"] == "user"
    assert "● task: go" in proc.stderr.decode()  # a person still reads stderr
    transcript = [json.loads(line) for line in Path(end["transcript"]).read_text().splitlines()]
    assert [e for e in events if "seq" in e and e["type"] != "session_end"] == [
        e for e in transcript if e["type"] != "session_end"
    ]


@pytest.mark.docker
def test_a_streamed_answer_arrives_as_model_text_lines_before_its_response(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws")
    with FakeModelServer() as server:
        server.openai_stream("Reading \x1b[2J first, then", [("list_files", {})], delay_s=0.01)
        server.openai_stream("All done:\nfine.", delay_s=0.01)
        proc = oa(
            tmp_path,
            "run",
            "--workspace",
            str(ws),
            "--model",
            "openai:m",
            "--base-url",
            server.base_url,
            "--output",
            "stream-json",
            "go",
        )
    assert proc.returncode == 0, proc.stderr.decode()
    events = lines_of(proc.stdout)
    texts = [(i, e) for i, e in enumerate(events) if e["type"] == "model_text"]
    responses = [(i, e) for i, e in enumerate(events) if e["type"] == "model_response"]
    for turn, (at, response) in enumerate(responses, start=1):
        pieces = [e["text"] for i, e in texts if e["turn"] == turn]
        assert (
            len(pieces) > 1
            and "".join(pieces) == response["text"]
            and all(i < at for i, e in texts if e["turn"] == turn)
        )
    assert events[-1]["final_text"] == "All done:\nfine." and b"\x1b" not in proc.stdout


@pytest.mark.parametrize(
    "args,code,error_type",
    [
        (["--output", "stream-json", "go"], 2, "config_invalid"),  # no model anywhere
        (
            ["--output", "stream-json", "--max-turns", "0", "--model", "script:x", "go"],
            2,
            "invalid_arguments",
        ),  # click's own check
        (
            ["--output=stream-json", "--model", "openai:m", "--base-url", "http://127.0.0.1:{port}/v1", "go"],
            2,
            "model_api_error",
        ),  # preflight
    ],
)
def test_set_up_errors_end_the_stream_with_one_session_end_line(tmp_path, args, code, error_type):
    ws = make_workspace(tmp_path / "ws")
    with socket.socket() as sock:  # bound, never listening: a refused connection
        sock.bind(("127.0.0.1", 0))
        args = [a.replace("{port}", str(sock.getsockname()[1])) for a in args]
        proc = oa(tmp_path, "run", "--workspace", str(ws), *args, timeout=60)
    assert proc.returncode == code, proc.stderr.decode()
    events = lines_of(proc.stdout)
    assert len(events) == 1 and events[0]["error"]["type"] == error_type and events[0]["exit_code"] == code
    assert proc.stderr.decode().startswith(("oa-sandbox: ", "Usage:", "Error:"))


@pytest.mark.docker
def test_ctrl_c_ends_the_stream_cancelled_and_removes_the_box(sandbox_image, docker_client, tmp_path):
    ws = make_workspace(tmp_path / "ws")
    s = script(
        tmp_path,
        [{"tool_calls": [{"name": "shell", "arguments": {"command": "echo started; sleep 120"}}]}, {"text": "never"}],
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "run",
            "--workspace",
            str(ws),
            "--model",
            f"script:{s}",
            "--auto-approve",
            "--output",
            "stream-json",
            "go",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment(tmp_path),
        cwd=ROOT,
    )
    seen = b""
    try:
        deadline = time.monotonic() + 120
        while (
            b'"type": "tool_output"' not in seen and time.monotonic() < deadline
        ):  # the command runs: its first line came
            ready, _, _ = select.select([proc.stdout], [], [], 1)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                seen += chunk
        assert b'"type": "tool_output"' in seen, seen[-2000:]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err.decode()
    events = lines_of(seen + out)
    end = events[-1]
    assert end["status"] == "cancelled" and end["exit_code"] == 130 and "Ctrl-C" in end["reason"]
    assert end["session_id"] == next(e for e in events if e["type"] == "session_start")["session_id"]
    assert (
        docker_client.containers.list(all=True, filters={"label": f"dev.openagents.sandbox.host-pid={proc.pid}"}) == []
    )
    assert b"Traceback" not in err
