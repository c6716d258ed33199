"""DockerSandbox: a hardened container running the agent, with every limit enforced from outside.

Nothing in the container is trusted once the model has run a command: the host keeps its own
deadline for every call, kills the command's whole process tree itself when it expires, and
replaces the container when the agent dies, hangs or speaks garbage.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Callable

import docker
import docker.errors
from docker.types import Mount, Ulimit

from sandbox_agent import limits

from .. import state
from ..config import LABEL, SandboxConfig
from ..errors import ErrorType, OpenAgentsError
from ..integrity import Baseline, SweepReport, Sweeper
from ..protocol import Executor, ToolResult
from ..quota import WriteQuota
from .channel import Channel
from .egress import EgressGate
from .runtimes import RuntimeChoice, choose_runtime, seccomp_security_opt

log = logging.getLogger(__name__)

WORKSPACE_IN_BOX = "/workspace"
START_DEADLINE_S = 30.0  # from `docker start` to the agent's first answer
_KILL_ALL = "import os,signal\ntry:\n os.kill(-1,signal.SIGKILL)\nexcept OSError:\n pass"


def docker_client(timeout: int = 60) -> docker.DockerClient:
    """A client that answers, or a fatal typed error that says how to start a daemon."""
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
        return client
    except docker.errors.DockerException as err:
        raise OpenAgentsError(
            ErrorType.DOCKER_UNAVAILABLE,
            f"no Docker daemon answers ({err}). Start one: `sudo systemctl start docker`, or `sudo dockerd &`; "
            "on Debian without Docker: `sudo apt-get install docker.io`. Set DOCKER_HOST if it listens elsewhere.",
        ) from None


EXEC_WAIT_S = 5.0


def run_detached(container: Any, command: list[str], user: str, wait_s: float = EXEC_WAIT_S) -> int | None:
    """Run `command` in the box without attaching to it, and wait at most `wait_s` for its exit code.

    An attached exec (`exec_run`) waits for the exec's stream to end; when the box's PID 1 dies at
    the same moment (the agent killed, the container stopping), under gVisor that stream never ends
    and the host thread would hang for good. Detached, the host only polls, so it always comes back.
    None: no exit code within the wait, or Docker refused (the box is gone: nothing left to kill)."""
    api = container.client.api
    try:
        exec_id = api.exec_create(container.id, command, user=user, stdin=False, stdout=False, stderr=False)["Id"]
        api.exec_start(exec_id, detach=True)
        deadline = time.monotonic() + wait_s
        while True:
            info = api.exec_inspect(exec_id)
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)
    except docker.errors.DockerException as err:
        log.debug("exec in %s failed: %s", container.id[:12], err)
        return None


MAX_GIT_MOUNTS = 64


def git_mounts(workspace: Path, baseline: Baseline, git_dir: Path | None = None) -> list[Mount]:
    """Every .git the workspace had at the start, read-only (the box can change none of them), and
    at the top either `git_dir` (copy mode: the real workspace's .git over the copy) or, when there
    is none, an empty read-only placeholder (the box can plant no repository there)."""
    mounts = []
    for rel in sorted(baseline.git_entries, key=lambda r: (r.count("/"), r))[:MAX_GIT_MOUNTS]:
        if not os.path.islink(workspace / rel):
            mounts.append(Mount(target=f"{WORKSPACE_IN_BOX}/{rel}", source=str(workspace / rel), type="bind", read_only=True))
    if not os.path.lexists(workspace / ".git"):
        top = git_dir if git_dir is not None and os.path.lexists(git_dir) and not os.path.islink(git_dir) else state.empty_dir()
        mounts.append(Mount(target=f"{WORKSPACE_IN_BOX}/.git", source=str(top), type="bind", read_only=True))
    return mounts


def container_settings(config: SandboxConfig, workspace: Path, user: str, egress_network: str | None = None,
                       baseline: Baseline | None = None, git_dir: Path | None = None) -> dict[str, Any]:
    """Every security-relevant option a sandbox gets, in one place (`oa-sandbox doctor` prints it)."""
    mounts = [Mount(target=WORKSPACE_IN_BOX, source=str(workspace), type="bind", read_only=False)]
    mounts += git_mounts(workspace, baseline or Baseline.capture(workspace), git_dir)
    settings: dict[str, Any] = {
        "image": config.image,
        "user": user,
        "working_dir": WORKSPACE_IN_BOX,
        "environment": config.environment(),
        "stdin_open": True,
        "tty": False,
        "read_only": True,
        "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={config.tmp_size},mode=1777"},
        "cap_drop": ["ALL"],
        # seccomp.py: no setuid/setgid bits, no io_uring, ...; under gVisor with clone3 left to its kernel (runtimes.py)
        "security_opt": ["no-new-privileges", seccomp_security_opt(config.runtime)],
        "pids_limit": config.pids,
        "mem_limit": config.memory,
        "memswap_limit": config.memory,
        "nano_cpus": int(config.cpus * 1e9),
        "ulimits": [Ulimit(name="fsize", soft=config.max_file_size, hard=config.max_file_size), Ulimit(name="core", soft=0, hard=0)],
        "ipc_mode": "private",
        "mounts": mounts,
        "labels": {LABEL: "1", f"{LABEL}.workspace": str(workspace), f"{LABEL}.host-pid": str(os.getpid())},
        # No container log: the agent's stdout is the attached channel, and json-file would store every
        # byte the box writes there on the host's disk. Attach streams do not need a log driver.
        "log_config": {"type": "none", "config": {}},
    }
    if config.egress and egress_network:
        settings["network"] = egress_network  # internal: its only other member is the proxy
        settings["environment"] = {**settings["environment"], **config.egress.environment()}
    else:
        settings["network_mode"] = "none"
    if config.runtime:
        settings["runtime"] = config.runtime
    return settings


def workspace_user(workspace: Path, config: SandboxConfig) -> str:
    """The workspace owner's uid:gid, so files written in the box keep their owner on the host.
    Never uid 0: a root-owned workspace is worked on as a copy (sessions.resolve_mode)."""
    user = config.user or f"{workspace.stat().st_uid}:{workspace.stat().st_gid}"
    if user.split(":", 1)[0].strip() in ("0", "root"):
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"the sandbox never runs as uid 0 (the workspace {workspace} is owned by root, or --user 0 "
                              "was given): use --workspace-mode copy, the default for root-owned workspaces, or --user UID:GID")
    return user


class DockerSandbox:
    """One container, one agent, one workspace. Use as a context manager: the container is removed on
    exit, also after Ctrl-C."""

    def __init__(self, workspace: str | os.PathLike[str], config: SandboxConfig | None = None, client: docker.DockerClient | None = None,
                 *, state_dir: Path | None = None, git_dir: Path | None = None, baseline: Baseline | None = None) -> None:
        """`state_dir`: where the sweep's quarantine goes (a session's directory; default a fresh one).
        `git_dir`: mounted read-only at /workspace/.git (copy mode: the real workspace's .git).
        `baseline`: taken earlier by the caller (a warm pool's, from before any of its boxes ran)."""
        self.workspace = Path(workspace).resolve()
        if not self.workspace.is_dir():
            raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"workspace {self.workspace} is not a directory")
        self.config = config or SandboxConfig()
        self._client = client
        self.user = workspace_user(self.workspace, self.config)
        self.container = None
        self._channel: Channel | None = None
        self.restarts = 0
        self.agent_info: dict[str, Any] = {}
        self.egress: EgressGate | None = None
        # Taken before the box can write anything: what the sweep and the quota compare against.
        self.id = state.new_id()
        self.state_dir = state_dir or state.sandbox_state_dir(self.workspace, self.id)
        self.git_dir = git_dir
        self.baseline = baseline or Baseline.capture(self.workspace)
        self.sweeper = Sweeper(self.workspace, self.baseline, self.state_dir / "quarantine",
                               placeholder_mountpoint=not os.path.lexists(self.workspace / ".git"))
        self.on_sweep: Callable[[SweepReport], None] | None = None
        self.runtime: RuntimeChoice | None = None  # chosen at the first start: gVisor where the daemon has it
        self.quota: WriteQuota | None = None
        # Calls run in parallel; when the agent dies they all fail at once. One of them replaces
        # the container, under this lock; the others see the new channel and do nothing.
        self._lifecycle = threading.RLock()
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> "DockerSandbox":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = docker_client()
        return self._client

    def start(self) -> None:
        self._closed = False
        try:
            self.client.images.get(self.config.image)
        except docker.errors.ImageNotFound:
            raise OpenAgentsError(ErrorType.IMAGE_MISSING, f"image {self.config.image} is missing; build it with `oa-sandbox image build`") from None
        except docker.errors.DockerException as err:
            raise OpenAgentsError(ErrorType.DOCKER_UNAVAILABLE, f"Docker failed: {err}") from None
        if self.runtime is None:
            self.runtime = self.choose_runtime()
            self.config = self.config.model_copy(update={"runtime": self.runtime.name})
        if self.quota is None:
            skip = set(self.baseline.git_entries.values())
            self.quota = WriteQuota(self.workspace, self.config.write_quota, self.baseline.usage_bytes, skip, on_exceeded=self.kill_processes)
        self.quota.start()
        new_gate = self.config.egress is not None and self.egress is None
        if new_gate:
            self.egress = EgressGate(self.client, self.config.egress)
            self.egress.start()
        try:
            self._start_container()
        except BaseException:
            if new_gate:
                self.close()
            raise

    def choose_runtime(self) -> RuntimeChoice:
        """--runtime as given, or gVisor when the daemon offers a usable registration (runtimes.py)."""
        try:
            return choose_runtime(self.config.runtime, self.config.egress is not None, self.client)
        except docker.errors.DockerException as err:
            raise OpenAgentsError(ErrorType.DOCKER_UNAVAILABLE, f"Docker failed: {err}") from None

    def _start_container(self) -> None:
        try:
            network = self.egress.network_name if self.egress else None
            self.container = self.client.containers.create(**container_settings(self.config, self.workspace, self.user, network, self.baseline, self.git_dir))
            sock = self.container.attach_socket(params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            self._channel = Channel(getattr(sock, "_sock", sock))
            self.container.start()
        except docker.errors.DockerException as err:
            self._remove()
            raise OpenAgentsError(ErrorType.SANDBOX_START_FAILED, f"could not start the sandbox: {err}") from None
        try:
            _, future = self._channel.request("hello", {})
            hello = future.result(timeout=min(self.config.call_deadline_s, START_DEADLINE_S))
        except (OpenAgentsError, FutureTimeout) as err:
            self._remove()
            raise OpenAgentsError(ErrorType.SANDBOX_START_FAILED, f"the agent did not answer: {err}") from None
        self.agent_info = hello.meta

    def restart(self) -> None:
        with self._lifecycle:
            self._remove()
            self.sweep()
            self.restarts += 1
            self.start()

    def close(self) -> None:
        with self._lifecycle:
            self._closed = True
            self._remove()
            if self.quota is not None:
                self.quota.stop()
            self.sweep()
        if self.egress is not None:
            self.egress.close()
            self.egress = None

    def sweep(self) -> SweepReport:
        """After our container is gone. Another session's box may still run on the same workspace;
        the walk acts only through O_NOFOLLOW directory fds, so it cannot be steered outside."""
        report = self.sweeper.sweep(shared=self._others_on_workspace())
        if report and self.on_sweep:
            self.on_sweep(report)
        return report

    def _remove(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self.container is not None:
            try:
                self.container.remove(force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as err:  # "removal already in progress" and the like
                log.debug("removing %s: %s", self.container.id[:12], err)
            self.container = None

    def _others_on_workspace(self) -> bool:
        try:
            return bool(self.client.containers.list(filters={"label": f"{LABEL}.workspace={self.workspace}"}))
        except docker.errors.DockerException:
            return True  # unknown: keep the placeholder, it is only an empty directory

    # -- calls -----------------------------------------------------------------------------
    def deadline_for(self, tool: str, args: dict[str, Any]) -> float:
        if tool == "shell":
            requested = args.get("timeout", limits.SHELL_DEFAULT_TIMEOUT_S)
            if not isinstance(requested, int) or isinstance(requested, bool):
                requested = limits.SHELL_DEFAULT_TIMEOUT_S
            return min(max(requested, 1), limits.SHELL_MAX_TIMEOUT_S) + self.config.shell_grace_s
        return self.config.call_deadline_s

    def call(self, tool: str, args: dict[str, Any], on_output: Callable[[str], None] | None = None) -> ToolResult:
        """`on_output(text)`: a shell call's output while it runs (the result still holds it all)."""
        if self.quota is not None and self.quota.exceeded.is_set():
            return self._over_quota()
        result = self._call(tool, args, on_output=on_output)
        if self.quota is not None and tool in ("write_file", "edit_file", "shell") and self.quota.poll():
            return self._over_quota(result.output)
        return result

    def _over_quota(self, output: str = "") -> ToolResult:
        assert self.quota is not None
        err = OpenAgentsError(ErrorType.WORKSPACE_QUOTA_EXCEEDED, self.quota.message())
        return ToolResult.failure(err, executor=Executor.OPENAGENTS, output=output, meta={"workspace_growth_bytes": self.quota.growth})

    def _call(self, tool: str, args: dict[str, Any], resent: bool = False, on_output: Callable[[str], None] | None = None) -> ToolResult:
        with self._lifecycle:
            if self._channel is None or self._channel.broken:
                self.restart()
            channel = self._channel
        assert channel is not None
        deadline = self.deadline_for(tool, args)
        started = time.monotonic()
        rid: int | None = None
        try:
            rid, future = channel.request(tool, args, on_output if tool == "shell" else None)
            try:
                response = future.result(timeout=deadline)
            except FutureTimeout:
                return self._on_deadline(tool, channel, rid, future, deadline)
        except OpenAgentsError as err:
            if err.type is ErrorType.AGENT_LOST:
                err = self._why_lost(err)
            if err.type in (ErrorType.AGENT_LOST, ErrorType.PROTOCOL_ERROR):
                self._recover(err, channel)
                # The agent died before it read this request (e.g. right after a `kill 1`): nothing
                # of it ran, so it goes once to the fresh agent instead of failing for nothing.
                if err.type is ErrorType.AGENT_LOST and not resent and not self._closed and (rid is None or not channel.was_received(rid)):
                    return self._call(tool, args, resent=True, on_output=on_output)
            return ToolResult.failure(err, executor=Executor.OPENAGENTS)
        result = ToolResult.from_agent(response)
        result.meta.setdefault("host_elapsed_s", round(time.monotonic() - started, 3))
        if self.egress is not None:
            records = self.egress.drain()
            if records:
                result.meta["egress"] = records
        return result

    def _on_deadline(self, tool: str, channel: Channel, rid: int, future, deadline: float) -> ToolResult:
        """The host's deadline passed: kill every process in the box but the agent, from outside."""
        message = f"{tool} passed the host's deadline of {deadline:.0f}s; the command and everything it started were killed"
        self.kill_processes()
        try:
            response = future.result(timeout=3)
        except (FutureTimeout, OpenAgentsError):
            channel.forget(rid)
            with self._lifecycle:
                if self._channel is channel:
                    self.restart()
            err = OpenAgentsError(ErrorType.TIMEOUT, message + "; the agent did not answer and the sandbox was replaced")
            return ToolResult.failure(err, executor=Executor.OPENAGENTS)
        # Whatever the agent claims, the host's deadline decides: this call timed out.
        err = OpenAgentsError(ErrorType.TIMEOUT, message)
        return ToolResult.failure(err, executor=Executor.OPENAGENTS, output=response.output, meta={**response.meta, "timed_out": True})

    def kill_processes(self) -> None:
        """SIGKILL to every process of the sandbox user except PID 1 (the agent): setsid'd and
        daemonized children too, since kill(-1) does not care about process groups."""
        container = self.container
        if container is None:
            return
        run_detached(container, ["python3", "-I", "-S", "-c", _KILL_ALL], self.user)

    def _why_lost(self, err: OpenAgentsError) -> OpenAgentsError:
        """The agent is gone: when Docker says the box was killed for memory, say that instead (under
        gVisor the whole box shares one memory cgroup, so a memory bomb takes the agent with it)."""
        container = self.container
        if container is None:
            return err
        try:
            container.reload()
            oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
        except docker.errors.DockerException:
            return err
        if not oom:
            return err
        return OpenAgentsError(ErrorType.AGENT_LOST, f"the sandbox ran out of memory (limit {self.config.memory}, swap included) and was "
                               "killed with everything in it; a fresh one takes over with the workspace as it was left")

    def _recover(self, err: OpenAgentsError, channel: Channel) -> None:
        """The agent is gone or untrustworthy: a fresh one on the same workspace, so the session goes on."""
        with self._lifecycle:
            if self._channel is not channel:
                return  # another call already replaced it
            log.warning("sandbox agent lost (%s): %s; starting a fresh one", err.type.value, err.message)
            try:
                self.restart()
            except OpenAgentsError as restart_err:
                log.error("could not restart the sandbox: %s", restart_err.message)
