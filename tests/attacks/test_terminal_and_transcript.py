"""Terminal injection and host resources: what the box and the model write reaches the person's
terminal only with its control characters made visible, every transcript line is capped, and our
containers keep no log that could fill the host's disk.
"""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from orchestrator.transcript import MAX_EVENT_BYTES
from tests.helpers import make_workspace
from tests.helpers.terminal_prompt import read_until

pytestmark = pytest.mark.docker
OA = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")

# Clear screen, an OSC 52 clipboard write ("pwned"), concealed text, a fake prompt after a lone CR,
# C1 CSI, DEL, bidi overrides and a zero-width space.
PAYLOAD = (
    "\x1b[2J\x1b]52;c;cHduZWQ=\x07\x1b[8mhidden\x1b[0m harmless\r? Run in the sandbox: true  y = allow once"
    " \x9b2J\x7f \u202eexe.txt\u202c \u2066x\u2069\u200b"
)
# The same bytes from a shell: printf's octal escapes.
PRINTF = (
    r"printf '\033[2J\033]52;c;cHduZWQ=\007\033[8mhidden\033[0m "
    r"harmless\r? fake prompt \302\233 2J \342\200\256exe.txt\n'"
)
FAKE_PROMPT = "\n? Run in the sandbox: rm -rf ~\n  y = allow once, n = reject"


def raw_controls(data: bytes) -> list[str]:
    """Every character in `data` a terminal would act on or hide: C0 but LF and TAB (CR only as
    part of CRLF, which a pty writes for each LF), DEL, C1, format characters (bidi), separators."""
    text = data.decode("utf-8", errors="surrogateescape").replace("\r\n", "\n")
    return [repr(c) for c in text if c not in "\n\t" and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")]


def session_script(tmp_path: Path, turns: list[dict]) -> Path:
    script = tmp_path / "s.jsonl"
    script.write_text("\n".join(json.dumps(t) for t in turns))
    return script


def hostile_workspace(tmp_path: Path) -> Path:
    return make_workspace(
        tmp_path / "ws", {"evil.txt": PAYLOAD + "\n", f"names/\x1b[2J\x1b]0;title\x07{chr(0x202E)}x.txt": "x\n"}
    )


def test_escape_sequences_from_the_box_and_the_model_reach_the_terminal_visible(sandbox_image, tmp_path):
    """Shell output, a file's content, file names and the model's text with ESC[2J, OSC 52,
    ESC[8m, a CR fake prompt, C1 and bidi: `run` and `transcript show` print none of them raw."""
    ws = hostile_workspace(tmp_path)
    policy = tmp_path / "policy.toml"
    policy.write_text('tier = "user"\n[[rules]]\ntool = "shell"\ndecision = "allow"\n')
    script = session_script(
        tmp_path,
        [
            {
                "text": PAYLOAD + FAKE_PROMPT,
                "tool_calls": [
                    {"name": "read_file", "arguments": {"path": "evil.txt"}},
                    {"name": "list_files", "arguments": {"path": "names"}},
                ],
            },
            {
                "text": PAYLOAD,
                "tool_calls": [
                    {"name": "shell", "arguments": {"command": PRINTF}},
                    {"name": "read_file", "arguments": {"path": PAYLOAD}},
                ],
            },
            {"text": "done " + PAYLOAD + FAKE_PROMPT},
        ],
    )
    transcript = tmp_path / "t.jsonl"
    proc = subprocess.run(
        [
            OA,
            "run",
            "--workspace",
            str(ws),
            "--model",
            f"script:{script}",
            "--non-interactive",
            "--policy",
            str(policy),
            "--transcript",
            str(transcript),
            "go",
        ],
        capture_output=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    events = [json.loads(line) for line in transcript.read_text().splitlines()]
    shell = [e for e in events if e["type"] == "tool_result" and e["tool"] == "shell"]
    assert shell and "\x1b[2J" in shell[0]["output"]  # the attack really ran: the box printed the raw sequence
    for name, out in (("stdout", proc.stdout), ("stderr", proc.stderr)):
        assert raw_controls(out) == [], (name, raw_controls(out))
    err = proc.stderr.decode()
    assert (
        "\\x1b[2J" in err
        and "\\x1b]52;c;cHduZWQ=\\x07" in err
        and "\\x1b[8mhidden" in err
        and "\\x0d? Run in the sandbox" in err
    )
    assert "\\u202eexe.txt" in err and "\\x9b2J" in err
    assert "\\x1b[2J" in proc.stdout.decode()  # the final text too
    # A newline the model wrote never starts a line where real prompts start.
    assert not any(line.startswith(("? Run", "  y = allow")) for line in err.splitlines())
    # The JSONL itself: JSON escapes, nothing raw, even for C1 and bidi.
    assert raw_controls(transcript.read_bytes()) == []
    shown = subprocess.run(
        [OA, "transcript", "show", str(transcript)], capture_output=True, timeout=60, check=True
    ).stdout
    assert raw_controls(shown) == [] and b"\\x1b[2J" in shown and b"\\x1b]52;c;" in shown


def test_the_approval_prompt_shows_no_raw_control_character(sandbox_image, tmp_path):
    """At a real terminal (a pty), the shell command, its arguments and the
    model text before the y/n prompt carry no raw control character."""
    ws = hostile_workspace(tmp_path)
    script = session_script(
        tmp_path,
        [
            {"text": PAYLOAD + FAKE_PROMPT, "tool_calls": [{"name": "read_file", "arguments": {"path": "evil.txt"}}]},
            {
                "text": PAYLOAD,
                "tool_calls": [
                    {"name": "shell", "arguments": {"command": "touch marker.txt # " + PAYLOAD + FAKE_PROMPT}}
                ],
            },
            {"text": "done"},
        ],
    )
    transcript = tmp_path / "t.jsonl"
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(
            OA,
            [OA, "run", "--workspace", str(ws), "--model", f"script:{script}", "--transcript", str(transcript), "go"],
        )
    try:
        seen = read_until(fd, b"y = allow once, n = reject")
        os.write(fd, b"n\n")
        seen += read_until(fd, b"transcript:")
    except BaseException:
        os.kill(pid, signal.SIGKILL)  # never leave the child waiting for an answer
        raise
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 3  # finished, with the shell call refused at the prompt
    assert raw_controls(seen) == [], raw_controls(seen)
    text = seen.decode().replace("\r\n", "\n")
    prompt = text[text.index("\n? Run in the sandbox: touch marker.txt") :]
    assert "\\x1b[2J" in prompt and "\\x0d? Run in the sandbox: true" in prompt
    # The command's own newline is marked as a continuation: the fake hint is not at the margin.
    hints = [line for line in prompt.splitlines() if line.startswith("  y = allow once")]
    assert len(hints) == 1 and hints[0].startswith("  y = allow once, n = reject (y, n): "), hints
    assert not (ws / "marker.txt").exists()


def test_every_transcript_line_is_capped(sandbox_image, tmp_path):
    """10 MB of shell output and 10 MB of model text: every JSONL line
    stays under the cap, with a marker saying how much was cut."""
    ws = make_workspace(tmp_path / "ws")
    policy = tmp_path / "policy.toml"
    policy.write_text('tier = "user"\n[[rules]]\ntool = "shell"\ndecision = "allow"\n')
    big = "m" * (10 << 20)
    script = session_script(
        tmp_path,
        [
            {
                "text": big,
                "tool_calls": [{"name": "shell", "arguments": {"command": "head -c 10000000 /dev/zero | tr '\\0' x"}}],
            },
            {"text": "done"},
        ],
    )
    transcript = tmp_path / "t.jsonl"
    proc = subprocess.run(
        [
            OA,
            "run",
            "--workspace",
            str(ws),
            "--model",
            f"script:{script}",
            "--non-interactive",
            "--policy",
            str(policy),
            "--transcript",
            str(transcript),
            "go",
        ],
        capture_output=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    lines = transcript.read_bytes().splitlines()
    assert max(len(line) for line in lines) <= MAX_EVENT_BYTES
    events = [json.loads(line) for line in lines]
    response = next(e for e in events if e["type"] == "model_response")
    assert response["text"].startswith("mmmm") and response["text"].endswith("chars]") and "cut" in response["text"]
    result = next(e for e in events if e["type"] == "tool_result" and e["tool"] == "shell")
    assert result["ok"] and result["output"].startswith("xxxx")


def test_our_sandbox_keeps_no_container_log(victim):
    """The agent's stdout (every byte the box sends back) is never stored
    by Docker: log driver none, and the attached channel still works."""
    container = victim.box.container
    container.reload()
    log_config = container.attrs["HostConfig"]["LogConfig"]
    # Podman's inspect says the options as null where Docker's says {}: no options either way
    assert log_config["Type"] == "none" and set(log_config) == {"Type", "Config"} and not log_config["Config"]
    out = victim.sh("head -c 200000 /dev/zero | tr '\\0' y; echo")
    assert out.ok and out.output.startswith("yyyy")
    assert victim.call("read_file", {"path": "README.md"}).ok
    container.reload()
    assert not container.attrs.get("LogPath")  # no json-file on the host's disk
    victim.assert_intact()
