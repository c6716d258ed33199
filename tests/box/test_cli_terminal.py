"""`oa-sandbox run` at a real terminal (a pty), issue 14: Ctrl-C at a prompt ends the session
(cancelled, exit 130) and a second Ctrl-C during clean-up is ignored until the container is gone;
`n REASON` reaches the model; the edit prompt shows the diff the edit would make."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.helpers import make_workspace
from tests.helpers.cli_terminal import finish, spawn
from tests.helpers.terminal_prompt import read_until

pytestmark = pytest.mark.docker
LABEL = "dev.openagents.sandbox"


def test_ctrl_c_at_the_prompt_cancels_the_session_and_a_second_one_does_not_stop_the_clean_up(
    sandbox_image, docker_client, tmp_path
):
    ws = make_workspace(tmp_path / "ws")
    pid, fd, transcript = spawn(
        tmp_path,
        ws,
        [
            {"tool_calls": [{"name": "shell", "arguments": {"command": "touch one"}}]},
            {"tool_calls": [{"name": "shell", "arguments": {"command": "touch two"}}]},
            {"text": "done"},
        ],
    )
    try:
        read_until(fd, b"y = allow once, n = reject")
        assert docker_client.containers.list(filters={"label": f"{LABEL}.host-pid={pid}"})  # the box is up while we ask
        os.write(fd, b"\x03")
        seen = read_until(fd, b"cancelling: removing the sandbox")
        os.write(fd, b"\x03")  # a second Ctrl-C during the clean-up
        seen += read_until(fd, b"session:")
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        code = finish(pid, fd)
    assert code == 130, seen.decode(errors="replace")
    end = [e for e in map(json.loads, transcript.read_text().splitlines()) if e["type"] == "session_end"]
    assert len(end) == 1 and end[0]["status"] == "cancelled" and end[0]["executor"] == "user"
    assert docker_client.containers.list(all=True, filters={"label": f"{LABEL}.host-pid={pid}"}) == []
    assert not (ws / "one").exists() and not (ws / "two").exists()
    assert b"cancelled" in seen and b"Traceback" not in seen


def test_n_with_a_reason_reaches_the_model_and_the_edit_prompt_shows_the_diff(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "one\n"})
    pid, fd, transcript = spawn(
        tmp_path,
        ws,
        [
            {
                "tool_calls": [
                    {"name": "edit_file", "arguments": {"path": "a.txt", "old_text": "one", "new_text": "two"}}
                ]
            },
            {"tool_calls": [{"name": "shell", "arguments": {"command": "rm -rf build"}}]},
            {"text": "done"},
        ],
    )
    try:
        prompt = read_until(fd, b"a = allow every edit this session")
        os.write(fd, b"y\n")
        read_until(fd, b"y = allow once, n = reject")
        os.write(fd, b"n keep the build directory, it has the fixtures\n")
        seen = read_until(fd, b"session:")
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        code = finish(pid, fd)
    assert code == 3
    text = prompt.decode()
    assert (
        "--- a/a.txt" in text
        and "-one" in text
        and "+two" in text
        and text.index("+two") < text.index("y = allow once")
    )
    assert (ws / "a.txt").read_text() == "two\n"
    events = [json.loads(line) for line in transcript.read_text().splitlines()]
    refusal = next(e for e in events if e["type"] == "tool_result" and e["tool"] == "shell")
    assert refusal["error"]["type"] == "rejected_by_user"
    assert "keep the build directory, it has the fixtures" in refusal["error"]["message"]  # the text the model reads
    assert b"refused  shell [user]" in seen


def test_a_long_call_shows_a_live_elapsed_line_with_its_output_tail_at_a_terminal(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws")
    pid, fd, _ = spawn(
        tmp_path,
        ws,
        [
            {"tool_calls": [{"name": "shell", "arguments": {"command": "echo tail-line; sleep 3"}}]},
            {"text": "done"},
        ],
        "--auto-approve",
    )
    try:
        seen = read_until(fd, b"running: shell 1 s")
        seen += read_until(fd, b"session:")
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        code = finish(pid, fd)
    assert code == 0
    live = seen.split(b"running: shell 1 s", 1)[1]
    assert "┆ tail-line".encode() in live[:400]  # the command's output under the live line, while it runs
