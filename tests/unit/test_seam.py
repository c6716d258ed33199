"""The backend seam without Docker: the supervised sandbox over a second deployment (the real agent
as a local subprocess, orchestrator/sandbox/local.py: no isolation), and Docker's stream
demultiplexing over a socket pair.

The local deployment shows that deadlines, recovery and resending live in base.py, not in a
backend: a killed agent is replaced, a hung one is killed and replaced at the host's deadline.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import threading
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import SandboxConfig
from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.sandbox.backend import backend_from_config
from orchestrator.sandbox.docker import DockerStream
from orchestrator.sandbox.docker_admin import DockerBackend
from orchestrator.sandbox.local import LocalSandbox

ROOT = Path(__file__).resolve().parents[2]


def _sandbox(ws: Path, **limits: Any) -> LocalSandbox:
    ws.mkdir(exist_ok=True)
    (ws / "a.txt").write_text("a\n")
    config = SandboxConfig(user=f"{os.getuid() or 1000}:{os.getgid() or 1000}", **limits)
    return LocalSandbox(ws, config, state_dir=ws.parent / "state")


def test_the_supervisor_runs_calls_over_another_deployment(tmp_path: Path) -> None:
    box = _sandbox(tmp_path / "ws")
    with box:
        assert box.started and box.agent_info["pid"] == box.deployment.proc.pid  # type: ignore[union-attr]
        assert box.call("read_file", {"path": "a.txt"}).output == "a\n"
        assert box.call("shell", {"command": "echo hi"}).output == "hi\n"
    assert not box.started and box.deployment.proc is None


def test_a_killed_agent_is_replaced_by_the_supervisor_not_the_backend(tmp_path):
    box = _sandbox(tmp_path / "ws")
    made = [box.deployment]
    with box:
        lost = box.call("shell", {"command": "kill -9 $PPID; sleep 5"})
        assert lost.error is not None and lost.error.type is ErrorType.AGENT_LOST  # acknowledged, so not resent
        assert box.call("read_file", {"path": "a.txt"}).ok
        assert box.restarts == 1 and made[0].started == 2


def test_a_hung_agent_is_killed_and_replaced_at_the_hosts_deadline(tmp_path: Path) -> None:
    box = _sandbox(tmp_path / "ws", shell_grace_s=1.0)
    made = [box.deployment]
    with box:
        os.kill(made[0].proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
        result = box.call("shell", {"command": "true", "timeout": 1})  # the host's deadline: 1 s + 1 s of grace
        assert result.error is not None and result.error.type is ErrorType.TIMEOUT
        assert "replaced" in result.error.message and made[0].kills == 1 and box.restarts == 1
        assert box.call("read_file", {"path": "a.txt"}).output == "a\n"


def test_the_backend_comes_from_the_config():
    assert isinstance(backend_from_config(SandboxConfig()), DockerBackend)
    with pytest.raises(ValueError):
        SandboxConfig(backend="podman")  # only what exists can be named


# -- Docker's attach stream -----------------------------------------------------------------


def _frame(stream: int, payload: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + struct.pack(">I", len(payload)) + payload


def _docker_stream(data: bytes) -> DockerStream:
    ours, theirs = socket.socketpair()

    def feed() -> None:
        theirs.sendall(data)
        theirs.close()

    threading.Thread(target=feed, daemon=True).start()
    return DockerStream(ours)


def _read_all(stream: DockerStream, size: int = 3) -> bytes:
    out = b""
    while chunk := stream.recv(size):
        out += chunk
    return out


def test_docker_frames_become_the_agents_stdout_and_stderr_is_kept_apart():
    stream = _docker_stream(_frame(1, b'{"a":') + _frame(2, b"warning\n") + _frame(1, b"") + _frame(1, b"1}\n"))
    assert _read_all(stream) == b'{"a":1}\n'
    assert stream.stderr_tail() == b"warning\n"


def test_an_unknown_docker_stream_type_is_a_protocol_error():
    stream = _docker_stream(_frame(3, b"x"))
    with pytest.raises(OpenAgentsError) as info:
        stream.recv(10)
    assert info.value.type is ErrorType.PROTOCOL_ERROR


def test_a_docker_frame_cut_short_is_a_lost_agent():
    stream = _docker_stream(_frame(1, b"abcdef")[:-2])
    with pytest.raises(OpenAgentsError) as info:
        _read_all(stream, 100)
    assert info.value.type is ErrorType.AGENT_LOST
