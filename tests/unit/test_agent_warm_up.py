"""The agent's warm-up (sandbox_agent/server.py): once it has answered its first tool call, every
tool's module is imported in the background, so no later first call pays an import; hello alone, the
host's start-up handshake, starts nothing (the cold start's path stays as short as it was)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL_MODULES = ("sandbox_agent.shell", "sandbox_agent.writing", "sandbox_agent.search", "sandbox_agent.listing")


def _imported(lines: list[str]) -> set[str]:
    return {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")}


def _call(agent: subprocess.Popen, rid: int, tool: str, args: dict) -> dict:
    """One request to the agent over its stdin, and its answer (its acknowledgement passed over)."""
    assert agent.stdin is not None and agent.stdout is not None
    agent.stdin.write(json.dumps({"v": 1, "id": rid, "tool": tool, "args": args}).encode() + b"\n")
    agent.stdin.flush()
    while True:
        answer = json.loads(agent.stdout.readline())
        if not answer.get("ack"):
            return answer


def test_the_first_tool_answer_starts_the_warm_up_and_hello_does_not(tmp_path):
    agent = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-I", "-S", str(ROOT / "sandbox_agent" / "__main__.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert agent.stderr is not None
    err: list[str] = []
    reader = threading.Thread(
        target=lambda: err.extend(line.decode(errors="replace") for line in agent.stderr), daemon=True
    )
    reader.start()
    try:
        for rid, args in enumerate(({}, {"warm_up": False}, {"warm_up": 1}, {"warm_up": True, "more": 1}), start=1):
            assert _call(agent, rid, "hello", args)["ok"]  # only exactly {"warm_up": true} asks
        time.sleep(3)  # had any of them started the warm-up, it would have imported the tools by now
        assert _call(agent, 5, "hello", {})["meta"]["warm"] is False
        assert not _imported(err) & set(TOOL_MODULES), sorted(_imported(err))
        assert not _call(agent, 6, "read_file", {"path": "no-such-file.txt"})["ok"]  # a tool's answer, an error one too
        deadline = time.monotonic() + 60
        while not _call(agent, 7, "hello", {})["meta"]["warm"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(TOOL_MODULES) <= _imported(err), sorted(_imported(err))
    finally:
        agent.kill()
        agent.wait()


def test_a_hello_that_asks_warms_the_agent_up(tmp_path):
    """What a warm pool's box is sent as it is put in line (sandbox/pool.py)."""
    agent = subprocess.Popen(
        [sys.executable, "-I", "-S", str(ROOT / "sandbox_agent" / "__main__.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=tmp_path,
    )
    try:
        answer = _call(agent, 1, "hello", {"warm_up": True})
        deadline = time.monotonic() + 60
        while not answer["meta"]["warm"] and time.monotonic() < deadline:
            time.sleep(0.05)
            answer = _call(agent, 2, "hello", {})
        assert answer["meta"]["warm"]
    finally:
        agent.kill()
        agent.wait()
