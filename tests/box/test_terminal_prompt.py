"""The y/n/a prompt at a real terminal (a pty): `a` approves edits for the session, shell asks every time."""

from __future__ import annotations

import json
import os
import pty
import sys

import pytest

from tests.helpers import make_workspace
from tests.helpers.terminal_prompt import read_until

pytestmark = pytest.mark.docker
OA = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")


def test_a_approves_edits_for_the_session_and_shell_still_asks(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "one\n"})
    script = tmp_path / "s.jsonl"
    script.write_text(
        "\n".join(
            json.dumps(t)
            for t in [
                {
                    "tool_calls": [
                        {"name": "edit_file", "arguments": {"path": "a.txt", "old_text": "one", "new_text": "two"}}
                    ]
                },
                {"tool_calls": [{"name": "write_file", "arguments": {"path": "b.txt", "content": "new\n"}}]},
                {"tool_calls": [{"name": "shell", "arguments": {"command": "touch c.txt"}}]},
                {"text": "done"},
            ]
        )
    )
    transcript = tmp_path / "t.jsonl"
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(
            OA,
            [OA, "run", "--workspace", str(ws), "--model", f"script:{script}", "--transcript", str(transcript), "go"],
        )
    try:
        read_until(fd, b"a = allow every edit this session")
        os.write(fd, b"a\n")
        shell_prompt = read_until(fd, b"y = allow once, n = reject")
        assert (
            b"Run in the sandbox: touch c.txt" in shell_prompt
            and b"a = allow every" not in shell_prompt.split(b"touch c.txt")[-1]
        )
        os.write(fd, b"n\n")
        read_until(fd, b"transcript:")
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 3  # finished, but the shell call was refused
    assert (
        (ws / "a.txt").read_text() == "two\n" and (ws / "b.txt").read_text() == "new\n" and not (ws / "c.txt").exists()
    )
    approvals = [
        (e["tool"], e["decision"], e["executor"])
        for e in map(json.loads, transcript.read_text().splitlines())
        if e["type"] == "approval"
    ]
    assert approvals == [
        ("edit_file", "approved_for_session", "user"),
        ("write_file", "approved_for_session", "user"),
        ("shell", "reject_once", "user"),
    ]
