"""A deployment with no box, shipped for tests (as httpx ships MockTransport): the real agent
(sandbox_agent) as a child process of the host, on the workspace itself, over its stdin and stdout.

It shows what the seam promises: deadlines, recovery and resending live in base.py, not in a
backend, so a test of the supervisor, the pipeline or the tools' host side runs in a second, with
no daemon. It isolates NOTHING: a command runs on the host as the host's user, with the host's
file system and network. Configuration never chooses it (backend_from_config knows no such kind);
code asks for it by name, `LocalSandbox(workspace)`, and only tests do.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from ..config import SandboxConfig
from ..errors import OpenAgentsError
from ..protocol import EgressRecord
from .base import BoxSpec, SupervisedSandbox

# sandbox_agent lies beside orchestrator/, in a checkout as in site-packages.
_PROJECT = Path(__file__).resolve().parents[2]


class PipeStream:
    """A child agent's stdout and stdin pipes as the AgentStream the channel reads and writes."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def recv(self, size: int) -> bytes:
        assert self.proc.stdout is not None
        return os.read(self.proc.stdout.fileno(), size)

    def sendall(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass

    def stderr_tail(self) -> bytes:
        return b""


class LocalDeployment:
    """The agent as a plain child process in its own session, on the workspace. `started` and `kills`
    count the starts and the supervisor's kill requests, for tests to read."""

    gvisor = False

    def __init__(self, spec: BoxSpec) -> None:
        self.spec = spec
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0
        self.kills = 0

    def start(self) -> PipeStream:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "OA_AGENT_WORKSPACE": str(self.spec.workspace),
            "PYTHONPATH": str(_PROJECT),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sandbox_agent"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=self.spec.workspace,
            env=env,
            start_new_session=True,
        )
        self.started += 1
        return PipeStream(self.proc)

    def kill_processes(self) -> None:
        self.kills += 1  # the agent's commands run in sessions of their own; the agent is what hangs here

    def remove(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def close(self) -> None:
        pass

    def others_on_workspace(self) -> bool:
        return False

    def drain_egress(self) -> list[EgressRecord]:
        return []

    def why_lost(self, err: OpenAgentsError) -> OpenAgentsError:
        return err


class LocalSandbox(SupervisedSandbox):
    """The supervised sandbox over a LocalDeployment (`deployment`: made once, restarted by the
    supervisor). The config's `user` is only a label here, as the agent runs as the host's user: by
    default the host's uid:gid, 1000:1000 for root (base.py refuses uid 0 as a box's user)."""

    deployment: LocalDeployment

    def __init__(
        self,
        workspace: str | os.PathLike[str],
        config: SandboxConfig | None = None,
        *,
        state_dir: Path | None = None,
    ) -> None:
        config = config or SandboxConfig(user=f"{os.getuid() or 1000}:{os.getgid() or 1000}")
        super().__init__(workspace, config, LocalDeployment, state_dir=state_dir)

    def __enter__(self) -> LocalSandbox:
        self.start()
        return self
