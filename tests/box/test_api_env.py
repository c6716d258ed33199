"""`env=` and `cwd=` against real boxes (issue 46): what a program passes explicitly reaches the
box's commands whatever its name (GIT_AUTHOR_NAME, MAX_TOKENS and AUTHORS_FILE look secret to the
agent's shell, which drops such names), with secret-looking values redacted in the transcript;
a model key or an egress credential's variable never enters the box, and the warning names it."""

from __future__ import annotations

import asyncio
import warnings

import pytest

from orchestrator import AsyncSandbox, ErrorType, Sandbox, ToolError
from orchestrator.api.environment import EnvWarning
from tests.helpers import make_workspace

pytestmark = pytest.mark.usefixtures("sandbox_image")

NAMES = {"GIT_AUTHOR_NAME": "Ada Lovelace", "MAX_TOKENS": "4096", "AUTHORS_FILE": 'it\'s "quoted"\n$HOME `x`'}
SHOW = 'printf "%s|" "$GIT_AUTHOR_NAME" "$MAX_TOKENS" "$AUTHORS_FILE"'
SHOWN = 'Ada Lovelace|4096|it\'s "quoted"\n$HOME `x`|'


def test_a_calls_env_reaches_its_command_whatever_the_name(tmp_path):
    ws = make_workspace(tmp_path / "ws", {"sub dir/f.txt": "f\n"})
    with Sandbox(ws) as box:
        assert box.shell(SHOW, env=NAMES).output == SHOWN
        assert box.shell(SHOW).output == "|||"  # for that command only
        assert box.shell("pwd; cat f.txt", cwd="sub dir").output == "/workspace/sub dir\nf\n"
        assert box.shell("pwd", cwd="/tmp").output == "/tmp\n"
        missing = box.shell("echo never", cwd="nowhere")
        assert missing.exit_code == 1 and "never" not in missing.output
        assert box.shell("exit 7", env={"A": "1"}).exit_code == 7  # the command's own exit status
        for bad in ({"1X": "v"}, {"A": 1}, {"A": "a\0b"}, ["A=1"]):
            with pytest.raises(ToolError) as wrong:
                box.shell("true", env=bad)
            assert wrong.value.type is ErrorType.INVALID_ARGUMENTS


def test_the_boxs_env_reaches_every_command_whatever_the_name(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    with Sandbox(ws, env={**NAMES, "PLAIN": "p"}) as box:
        assert box.shell(SHOW).output == SHOWN
        assert box.shell('echo "$PLAIN"').output == "p\n"
        run = box.call("shell", {"command": SHOW})  # a call by name (a model's, a front-end's) too
        assert run.output == SHOWN


def test_secret_looking_values_are_redacted_in_the_transcript(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    with Sandbox(ws, env={"DEPLOY_TOKEN": "box-level-s3cret"}) as box:
        seen = box.shell('echo "$DEPLOY_TOKEN $SERVICE_PASSWORD"', env={"SERVICE_PASSWORD": "call-level-s3cret"})
        assert seen.output == "box-level-s3cret call-level-s3cret\n"  # the program gets what it asked for
        transcript = box.transcript_path
    text = transcript.read_text()
    assert "box-level-s3cret" not in text and "call-level-s3cret" not in text and "[REDACTED]" in text


def test_a_model_key_or_an_egress_credential_never_enters_the_box(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-model-key-0123456789")
    ws = make_workspace(tmp_path / "ws")
    with pytest.warns(EnvWarning, match="OPENAI_API_KEY"):
        box = Sandbox(ws, env={"OPENAI_API_KEY": "sk-anything", "KEEP": "kept"}).open()
    with box:
        assert box.shell('echo "${OPENAI_API_KEY:-unset} $KEEP"').output == "unset kept\n"
        with pytest.warns(EnvWarning, match="OPENAI_API_KEY"):  # by value too: the host's key under another name
            out = box.shell('echo "${MY_KEY:-unset}"', env={"MY_KEY": "sk-host-model-key-0123456789"}).output
        assert out == "unset\n"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert (
                box.shell('echo "$GIT_AUTHOR_NAME"', env={"GIT_AUTHOR_NAME": "Ada"}).output == "Ada\n"
            )  # no warning for the rest


def test_async_shell_and_stream_take_cwd_and_env(tmp_path):
    ws = make_workspace(tmp_path / "ws", {"d/x": ""})

    async def main():
        async with AsyncSandbox(ws) as box:
            result = await box.shell("pwd; echo $GIT_AUTHOR_NAME", cwd="d", env={"GIT_AUTHOR_NAME": "Ada"})
            stream = box.shell_stream("echo $MAX_TOKENS", env={"MAX_TOKENS": "7"})
            chunks = [text async for text in stream]
            return result.output, "".join(chunks)

    assert asyncio.run(main()) == ("/workspace/d\nAda\n", "7\n")
