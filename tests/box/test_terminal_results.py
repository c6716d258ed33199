"""At a real terminal (a pty), issue 27 item 6: a result shows its bounded tail, escaped, and
`transcript show --full` the whole of it; `A` at a shell prompt approves the command's prefix for
the rest of the session, and a compound command is asked about again with no `A` offered."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.helpers import make_workspace
from tests.helpers.cli_terminal import ROOT, finish, spawn
from tests.helpers.terminal_prompt import read_until

pytestmark = pytest.mark.docker


def test_a_result_shows_its_escaped_tail_and_transcript_show_full_shows_it_all(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws")
    pid, fd, transcript = spawn(
        tmp_path,
        ws,
        [
            {"tool_calls": [{"name": "shell", "arguments": {"command": r"seq 1 30; printf 'x\033[2Jcleared\n'"}}]},
            {"text": "done"},
        ],
        "--auto-approve",
    )
    try:
        seen = read_until(fd, b"transcript:")
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        code = finish(pid, fd)
    assert code == 0, seen.decode(errors="replace")
    shown = seen.decode(errors="replace").replace("\r\n", "\n")
    result = shown[shown.index("← ok [runtime]") :]
    assert "… 23 earlier lines (all of it: `oa-sandbox transcript show " in result and " --full`)" in result
    tail = [line.strip() for line in result.split("\n")[2:10]]
    assert tail == [f"│ {n}" for n in range(24, 31)] + [
        "│ x\\x1b[2Jcleared"
    ]  # the last 8 lines, the box's escape made visible
    assert b"x\x1b[2Jcleared" not in seen
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONPATH": str(ROOT)}
    full = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "transcript", "show", "--full", str(transcript)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
        check=True,
    ).stdout
    assert (
        all(f"    │ {n}\n" in full for n in range(1, 31))
        and "│ x\\x1b[2Jcleared" in full
        and "earlier line" not in full
    )
    default = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "transcript", "show", str(transcript)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
        check=True,
    ).stdout
    assert (
        "… 23 earlier lines" in default
        and "    │ 23\n" not in default
        and "    │ 24\n" in default
        and "\x1b" not in default + full
    )


def test_A_allows_the_shell_prefix_for_the_session_and_a_compound_command_still_asks(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws")
    pid, fd, transcript = spawn(
        tmp_path,
        ws,
        [
            {"tool_calls": [{"name": "shell", "arguments": {"command": "echo one"}}]},
            {"tool_calls": [{"name": "shell", "arguments": {"command": "echo two -n"}}]},
            {"tool_calls": [{"name": "shell", "arguments": {"command": "echo three; touch x"}}]},
            {"tool_calls": [{"name": "shell", "arguments": {"command": "ls"}}]},
            {"text": "done"},
        ],
    )
    try:
        first = read_until(fd, b"this session (y, n, A): ")
        os.write(fd, b"A\n")
        compound = read_until(fd, b"(y, n): ")
        os.write(fd, b"n\n")
        other = read_until(fd, b"(y, n, A): ")
        os.write(fd, b"n\n")
        rest = read_until(fd, b"transcript:")
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        code = finish(pid, fd)
    assert code == 3, rest.decode(errors="replace")  # finished; two calls refused
    assert b"A = allow every command starting `echo` this session" in first
    assert b"Run in the sandbox: echo three; touch x" in compound and b"A =" not in compound.split(b"echo three")[-1]
    assert b"Run in the sandbox: ls" in other and b"A = allow every command starting `ls` this session" in other
    assert (
        b"Run in the sandbox: echo two" not in compound.split(b"echo three")[0].split(b"y, n, A")[0]
    )  # never asked about
    approvals = [
        (e["decision"], e["executor"], e["reason"])
        for e in map(json.loads, transcript.read_text().splitlines())
        if e["type"] == "approval"
    ]
    assert [a[:2] for a in approvals] == [
        ("approved_for_session", "user"),
        ("approved_for_session", "user"),
        ("reject_once", "user"),
        ("reject_once", "user"),
    ]
    assert "`echo`" in approvals[0][2] and "commands starting `echo` approved for this session" in approvals[1][2]
    outputs = [
        e.get("output") for e in map(json.loads, transcript.read_text().splitlines()) if e["type"] == "tool_result"
    ]
    assert outputs[:2] == ["one\n", "two -n\n"]
