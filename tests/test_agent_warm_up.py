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

ROOT = Path(__file__).resolve().parents[1]
TOOL_MODULES = ("sandbox_agent.shell", "sandbox_agent.writing", "sandbox_agent.search", "sandbox_agent.listing")


def _imported(lines: list[str]) -> set[str]:
    return {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")}


def test_the_first_tool_answer_starts_the_warm_up_and_hello_does_not(tmp_path):
    agent = subprocess.Popen([sys.executable, "-X", "importtime", "-I", "-S", str(ROOT / "sandbox_agent" / "__main__.py")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    assert agent.stdin is not None and agent.stdout is not None and agent.stderr is not None
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(line.decode(errors="replace") for line in agent.stderr), daemon=True)
    reader.start()

    def call(rid: int, tool: str, args: dict) -> dict:
        agent.stdin.write(json.dumps({"v": 1, "id": rid, "tool": tool, "args": args}).encode() + b"\n")
        agent.stdin.flush()
        while True:
            answer = json.loads(agent.stdout.readline())
            if not answer.get("ack"):
                return answer

    try:
        for rid, args in enumerate(({}, {"warm_up": False}, {"warm_up": 1}, {"warm_up": True, "more": 1}), start=1):
            assert call(rid, "hello", args)["ok"]  # only exactly {"warm_up": true} asks
        time.sleep(3)  # had any of them started the warm-up, it would have imported the tools by now
        assert call(5, "hello", {})["meta"]["warm"] is False
        assert not _imported(err) & set(TOOL_MODULES), sorted(_imported(err))
        assert not call(6, "read_file", {"path": "no-such-file.txt"})["ok"]  # a tool's answer, an error one too
        deadline = time.monotonic() + 60
        while not call(7, "hello", {})["meta"]["warm"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(TOOL_MODULES) <= _imported(err), sorted(_imported(err))
    finally:
        agent.kill()
        agent.wait()


def test_a_hello_that_asks_warms_the_agent_up(tmp_path):
    """What a warm pool's box is sent as it is put in line (sandbox/pool.py)."""
    agent = subprocess.Popen([sys.executable, "-I", "-S", str(ROOT / "sandbox_agent" / "__main__.py")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=tmp_path)
    assert agent.stdin is not None and agent.stdout is not None
    try:
        for rid in range(1, 1000):
            agent.stdin.write(json.dumps({"v": 1, "id": rid, "tool": "hello", "args": {"warm_up": True} if rid == 1 else {}}).encode() + b"\n")
            agent.stdin.flush()
            answer = json.loads(agent.stdout.readline())
            while answer.get("ack"):
                answer = json.loads(agent.stdout.readline())
            if answer["meta"]["warm"]:
                break
            time.sleep(0.05)
        assert answer["meta"]["warm"]
    finally:
        agent.kill()
        agent.wait()
