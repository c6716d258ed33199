"""A Python caller's wrong argument is refused once, on the host, by the pipeline's validation of the
tool's declaration (issue 48): a typed ToolError(INVALID_ARGUMENTS) naming the tool, the argument and
the type given, recorded as the call's refusal, and nothing reaches the box."""

from __future__ import annotations

import json

import pytest

from orchestrator import ErrorType, Sandbox, ToolError
from tests.helpers import make_workspace

pytestmark = pytest.mark.usefixtures("sandbox_image")


def test_a_wrong_argument_is_refused_by_the_one_validation_named_and_typed(tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "one\n"})
    with Sandbox(ws) as box:
        for call, tool, argument, given in (
            (lambda: box.read_file("a.txt", offset="3"), "read_file", "offset", "str"),
            (lambda: box.read_file("a.txt", limit=2.5), "read_file", "limit", "float"),
            (lambda: box.list_files(".", recursive="yes"), "list_files", "recursive", "str"),
            (lambda: box.grep_files(b"one"), "grep_files", "pattern", "bytes"),
            (lambda: box.write_file("c.txt", b"bytes"), "write_file", "content", "bytes"),
            (lambda: box.edit_file("a.txt", "one", 1), "edit_file", "new_text", "int"),
            (lambda: box.shell("ls", timeout=True), "shell", "timeout", "bool"),
            (lambda: box.shell(["ls"]), "shell", "command", "list"),
            (lambda: box.start(5), "process_start", "command", "int"),
            (lambda: box.read_bytes("a.txt", limit="9"), "read_bytes", "limit", "str"),
            (lambda: box.rollback("0"), "rollback", "turn", "str"),
        ):
            with pytest.raises(ToolError) as wrong:
                call()
            message = wrong.value.message
            assert wrong.value.type is ErrorType.INVALID_ARGUMENTS, message
            assert message.startswith(f"invalid arguments for {tool}: ") and f"{argument}: " in message, message
            assert f"(got {given})" in message, message
        with pytest.raises(ToolError) as folded:  # a command folded with a cwd is checked before it is folded
            box.shell(5, cwd="sub")
        assert folded.value.type is ErrorType.INVALID_ARGUMENTS and "command must be a str" in folded.value.message
        assert box.read_file("a.txt").text == "one\n"  # the sandbox goes on
        transcript = box.transcript_path
    assert not (ws / "c.txt").exists() and (ws / "a.txt").read_text() == "one\n"
    records = [json.loads(line) for line in transcript.read_text().splitlines()]
    refused = [r for r in records if r.get("type") == "tool_result" and not r.get("ok", True)]
    assert len(refused) >= 11  # each wrong call recorded as its refusal, as a model's would be
