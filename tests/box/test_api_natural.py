"""The first lines a new user writes (issue 46), against real boxes: the workspace by keyword, no
workspace at all (a scratch directory, removed at close), a program's own calls run as `oa-sandbox
exec`'s do (a deny still refuses; `approve="ask"` puts them to the ladder's approver), and set-up
errors that name the keyword the program passed rather than the CLI's flag."""

from __future__ import annotations

import json

import pytest

from orchestrator import ErrorType, OpenAgentsError, Sandbox, SandboxOptions, ToolError
from orchestrator.config import LABEL
from tests.helpers import make_workspace

pytestmark = pytest.mark.usefixtures("sandbox_image")


def test_the_workspace_by_keyword(tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    with Sandbox(workspace=ws) as box:
        assert box.read_file("a.txt").text == "a\n"
    with Sandbox(workspace=str(ws), options=SandboxOptions(mode="copy")) as box:
        assert box.mode == "copy"
        box.discard()


def test_no_workspace_is_a_scratch_directory_removed_at_close(tmp_path, docker_client):
    with Sandbox() as box:
        scratch = box.workspace
        assert scratch is not None and scratch.is_dir() and not any(scratch.iterdir())
        box.write_file("notes.txt", "hello\n")
        assert box.shell("cat notes.txt; id -u").output.splitlines()[0] == "hello"
        assert (scratch / "notes.txt").read_text() == "hello\n"
        session = box.id
    assert not scratch.exists()
    assert not docker_client.api.containers(all=True, filters={"label": f"{LABEL}.workspace={scratch}"})
    with Sandbox(mode="copy") as box:  # a copy session on a scratch directory: discarded with it
        box.write_file("x.txt", "x")
        scratch = box.workspace
    assert not scratch.exists() and box.record.discarded
    assert session != box.id


def test_a_scratch_sandbox_that_fails_to_open_leaves_no_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    with pytest.raises(OpenAgentsError):
        Sandbox(runtime="no-such-runtime").open()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("oa-scratch-")] == []


def test_a_programs_own_calls_run_as_execs_and_a_deny_still_refuses(tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    with Sandbox(ws) as box:  # no auto_approve, no approver: the program asked for its calls
        assert box.shell("echo hi").output == "hi\n"
        box.write_file("b.txt", "b\n")
        transcript = box.transcript_path
    approvals = [json.loads(line) for line in transcript.read_text().splitlines() if '"approval"' in line]
    assert {a["decision"] for a in approvals if a["tool"] in ("shell", "write_file")} == {"allow_once"}
    assert all(a["executor"] == "user" for a in approvals if a["tool"] == "shell")
    deny = tmp_path / "deny.toml"
    deny.write_text('[[rules]]\ntool = "shell"\ndecision = "deny"\n')
    with Sandbox(ws, policy_files=[deny]) as box:
        with pytest.raises(ToolError) as refused:
            box.shell("touch pwned")
        assert refused.value.type is ErrorType.REFUSED_BY_POLICY
    assert not (ws / "pwned").exists()


def test_approve_ask_puts_the_programs_calls_to_the_ladder(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    with Sandbox(ws, approve="ask") as box:  # no approver: what would ask is refused, as --non-interactive
        with pytest.raises(ToolError) as refused:
            box.shell("touch asked")
        assert refused.value.type in (ErrorType.REFUSED_BY_POLICY, ErrorType.REJECTED_BY_USER)
    asked = []
    with Sandbox(ws, approve="ask", approver=lambda request: asked.append(request.tool) or True) as box:
        box.shell("true")
    assert asked == ["shell"] and not (ws / "asked").exists()


def test_a_models_calls_are_still_asked_without_auto_approve(tmp_path):
    """Only the program's own calls are answered by the program: a model's in run() are not."""
    ws = make_workspace(tmp_path / "ws")
    script = tmp_path / "model.jsonl"
    script.write_text(
        json.dumps({"tool_calls": [{"name": "shell", "arguments": {"command": "touch by-model"}}]})
        + "\n"
        + json.dumps({"text": "done"})
        + "\n"
    )
    with Sandbox(ws) as box:
        run = box.run("touch it", model=f"script:{script}")
        run.wait()
        assert run.result.refused_calls and not (ws / "by-model").exists()
        box.shell("touch by-program")
    assert (ws / "by-program").exists()


def test_errors_name_the_python_keyword_not_the_cli_flag(tmp_path):
    ws = make_workspace(tmp_path / "ws", {f"f{i}.txt": "x" for i in range(5)})
    with pytest.raises(OpenAgentsError) as too_big:
        Sandbox(ws, mode="copy", copy_max_entries=2).open()
    assert "copy_max_entries=" in too_big.value.message and 'mode="bind"' in too_big.value.message
    assert "--" not in too_big.value.message and "--" not in str(too_big.value)
    with pytest.raises(OpenAgentsError) as root_user:
        Sandbox(ws, user="0").open()
    assert "user=" in root_user.value.message and "--user" not in root_user.value.message
