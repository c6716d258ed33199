"""The agent ends at once on SIGTERM whichever of its threads the kernel hands the signal to.

`kill 1` is process-directed: the kernel picks any thread that does not block it. Python runs a
handler only in the main thread, so one that landed on a tool's thread used to wait until the main
thread woke for the next request (2 `kill 1` in 150 under runc answered with the command's output
instead of agent_lost). Here the signal is sent to each of the tool's threads on purpose (tgkill),
with the agent as a plain child process, so the case is not left to the scheduler."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SYS_TGKILL = {"x86_64": 234, "aarch64": 131}.get(platform.machine())


def _tgkill(pid: int, tid: int, sig: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_TGKILL, pid, tid, sig) != 0 and ctypes.get_errno() != 3:  # ESRCH: that thread just ended
        raise OSError(ctypes.get_errno(), "tgkill")


@pytest.mark.skipif(SYS_TGKILL is None, reason="tgkill's number is known here for x86_64 and aarch64 only")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_on_a_tool_thread_ends_the_agent_at_once(tmp_path, sig):
    env = {"PATH": os.environ["PATH"], "OA_AGENT_WORKSPACE": str(tmp_path), "PYTHONPATH": str(ROOT)}
    agent = subprocess.Popen(
        [sys.executable, "-m", "sandbox_agent"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
        env=env,
        start_new_session=True,
    )
    assert agent.stdin is not None and agent.stdout is not None
    children: list[int] = []
    try:
        agent.stdin.write(
            json.dumps({"v": 1, "id": 1, "tool": "shell", "args": {"command": "sleep 20"}}).encode() + b"\n"
        )
        agent.stdin.flush()
        assert json.loads(agent.stdout.readline()).get("ack") is True
        tasks = Path(f"/proc/{agent.pid}/task")
        for _ in range(200):  # the tool's thread has started its command
            children = [int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()]
            if children:
                break
            subprocess.run(["sleep", "0.05"])
        assert children, "the shell command never started"
        tool_threads = [int(t.name) for t in tasks.iterdir() if int(t.name) != agent.pid]
        for tid in tool_threads:
            _tgkill(agent.pid, tid, sig)
        assert agent.wait(timeout=5) == 0  # before: still waiting in read() for the next request
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        for child in children:
            try:
                os.killpg(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
