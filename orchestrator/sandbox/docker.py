"""The Docker deployment: a hardened container running the agent, attached over Docker's API.

How a box is started, reached and removed on Docker lives here (container settings, the attach
stream's demultiplexing, the detached exec that kills); the deadlines, restarts, quota and sweep
that supervise it are backend-neutral (base.py). DockerSandbox is the two put together.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
from docker.types import Mount, Ulimit

from .. import state
from ..config import LABEL, DockerBackendConfig, EgressRule, SandboxConfig
from ..errors import ErrorType, OpenAgentsError
from ..protocol import EgressRecord
from ..workspace.integrity import Baseline
from . import handoff, lifetime, mounts, owner, reaper
from .base import WORKSPACE_IN_BOX, BoxSpec, SupervisedSandbox
from .daemon import DOCKER_ERRORS, DaemonWatch, engine_name
from .engine import box_on_copy, docker_client, engine_of, engine_settings, exit_sweep
from .runtimes import RUNC, RuntimeChoice, choose_runtime, seccomp_security_opt
from .sweep_journal import capture_baseline

if TYPE_CHECKING:  # the egress gate's modules only for a box with egress
    from .egress import EgressGate
    from .egress_tls import SessionCA

log = logging.getLogger(__name__)

__all__ = [
    "DockerSandbox",
    "DockerDeployment",
    "DockerStream",
    "box_on_copy",
    "container_settings",
    "docker_client",
    "docker_options",
    "git_mounts",
    "run_detached",
]
STDERR_KEEP = 8192
_KILL_ALL = "import os,signal\ntry:\n os.kill(-1,signal.SIGKILL)\nexcept OSError:\n pass"


def _lacks_python(message: str) -> bool:
    """The runtime's words for an entrypoint it cannot find (runc: `exec: "python3": executable file not
    found in $PATH`; runsc: `error finding executable "python3" in PATH`)."""
    return '"python3"' in message and ("executable file not found" in message or "error finding executable" in message)


def docker_options(config: SandboxConfig) -> DockerBackendConfig:
    """The Docker part of `config`; a config for another backend is refused, typed (backend.py
    hands each backend only its own, so this fails only for a caller that skipped it)."""
    if not isinstance(config.backend, DockerBackendConfig):
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID, f"the Docker backend was given a {config.backend.kind!r} backend's config"
        )
    return config.backend


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
    except DOCKER_ERRORS as err:
        log.debug("exec in %s failed: %s", container.id[:12], err)
        return None


# Every repository present at the start gets its own read-only mount: one left writable is one whose
# config (core.fsmonitor, core.pager, ...) the box could rewrite for the user's own git, and the sweep
# keeps it (same inode). Past this many the box is not started at all, rather than half protected.
MAX_GIT_MOUNTS = 1024
# runsc 20240729 fails to start a box with more than about 55 bind mounts here ("urpc method
# containerManager.StartRoot failed: EOF"; 50 started, 60 did not): past this, gVisor is not chosen.
MAX_GIT_MOUNTS_GVISOR = 48


def git_mounts(workspace: Path, baseline: Baseline, git_dir: Path | None = None, top: bool = True) -> list[Mount]:
    """Every .git the workspace had at the start (its baseline), read-only: the box can change none
    of them. Copy mode (`git_dir` given: `workspace` is the session's own copy) with none at the top
    gets `git_dir` there (the real workspace's .git) or an empty read-only placeholder.

    Bind mode with no .git at the top gets nothing there: a mount point is a directory the runtime
    creates in the workspace itself (runc and runsc alike), and every session on the workspace would
    share it, one creating it while another's sweep removes it (issue 40: `bind source path does not
    exist`, `Duplicate mount point`). A repository the box plants at the top is moved out by the
    sweep, by identity, as a nested one is. Decided from the baseline alone, never from the host's
    state now (a .git another session's box made or its sweep moved must not change this box's mounts).
    Not `top`: a workspace mounted read-only needs no placeholder (nothing can be planted)."""
    if len(baseline.git_entries) > MAX_GIT_MOUNTS:
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID,
            f"the workspace {workspace} holds {len(baseline.git_entries)} repositories (.git entries); "
            f"the sandbox mounts each read-only and takes at most {MAX_GIT_MOUNTS}: give it a smaller part of the tree",
        )
    found = []
    for rel in sorted(baseline.git_entries, key=lambda r: (r.count("/"), r)):
        # One gone since the baseline (another session's sweep moved what its box planted) is not
        # mounted: a mount of a missing source fails the start, and one the box makes there is not
        # the baseline's (by identity) and is moved out.
        if os.path.lexists(workspace / rel) and not os.path.islink(workspace / rel):
            found.append(mounts.read_only(workspace / rel, f"{WORKSPACE_IN_BOX}/{rel}"))
    if top and git_dir is not None and ".git" not in baseline.git_entries:
        top_dir = git_dir if os.path.lexists(git_dir) and not os.path.islink(git_dir) else state.empty_dir()
        found.append(mounts.read_only(top_dir, f"{WORKSPACE_IN_BOX}/.git"))
    return found


def container_settings(
    config: SandboxConfig,
    workspace: Path,
    user: str,
    egress_network: str | None = None,
    baseline: Baseline | None = None,
    git_dir: Path | None = None,
    egress_ca: SessionCA | None = None,
) -> dict[str, Any]:
    """Every security-relevant option a sandbox gets, in one place (`oa-sandbox doctor` prints it)."""
    options = docker_options(config)
    box_mounts = [mounts.workspace(workspace, WORKSPACE_IN_BOX, config.workspace_read_only)]
    box_mounts += git_mounts(
        workspace, baseline or capture_baseline(workspace), git_dir, top=not config.workspace_read_only
    )
    if not config.workspace_read_only:  # the host's own code in the workspace (--host-code-read-only)
        box_mounts += mounts.host_code(workspace, config.read_only_entries, WORKSPACE_IN_BOX)
    settings: dict[str, Any] = {
        "image": options.image,
        "user": user,
        "working_dir": WORKSPACE_IN_BOX,
        "environment": config.environment(),
        "stdin_open": True,
        "tty": False,
        "read_only": True,
        "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={config.tmp_size},mode=1777"},
        "cap_drop": ["ALL"],
        # seccomp.py: no setuid/setgid bits, no io_uring, ...; under gVisor with clone3 left to its kernel (runtimes.py)
        "security_opt": ["no-new-privileges", seccomp_security_opt(options.runtime)],
        "pids_limit": config.pids,
        "mem_limit": config.memory,
        "memswap_limit": config.memory,
        "nano_cpus": int(config.cpus * 1e9),
        "ulimits": [
            Ulimit(name="fsize", soft=config.max_file_size, hard=config.max_file_size),
            Ulimit(name="core", soft=0, hard=0),
        ],
        "ipc_mode": "private",
        "mounts": box_mounts,
        # Who started it (owner.py): the next oa-sandbox command removes it once that process is gone.
        "labels": {LABEL: "1", f"{LABEL}.workspace": str(workspace), **owner.labels_here()},
        # No container log: the agent's stdout is the attached channel, and json-file would store every
        # byte the box writes there on the host's disk. Attach streams do not need a log driver.
        "log_config": {"type": "none", "config": {}},
    }
    if config.egress and egress_network:
        settings["network"] = egress_network  # internal: its only other member is the proxy
        settings["environment"] = {**settings["environment"], **config.egress.environment()}
        if egress_ca is not None:  # the session CA's certificate only: trusted for the hosts the gate opens
            settings["environment"].update(egress_ca.box_environment())
            box_mounts += egress_ca.box_mounts()
    else:
        settings["network_mode"] = "none"
    if options.runtime:
        settings["runtime"] = options.runtime
    return settings


# A start the daemon or the runtime failed for a passing reason is tried again: Docker's 5xx answers
# under load, and runsc's `cannot read client sync file: EOF` (its sandbox process lost while the
# machine was saturated) are gone on the next try (issue 40: 4 to 10 of 200 starts at concurrency 8
# under a CPU burner). A 4xx (a bad mount, an unknown option) is the same every time: never retried.
START_ATTEMPTS = 4


def start_backoff(attempt: int) -> float:
    """Seconds before try `attempt` + 1: 0.5, 1, 2 s (+ up to 0.5 s each), at most ~5 s in all. A loop of its
    own, not tenacity's: importing tenacity cost every `oa-sandbox exec` about 50 ms (issue 50)."""
    return min(0.5 * 2.0 ** (attempt - 1), 4.0) + random.uniform(0, 0.5)


def transient_start_failure(err: BaseException) -> bool:
    """A start failure worth another try: the daemon's own 5xx answer (never a 4xx, never a lost daemon)."""
    return isinstance(err, docker.errors.APIError) and err.is_server_error()


class DockerStream:
    """The agent's stdout out of a container's attach socket. Without a TTY, Docker multiplexes
    stdout and stderr: each frame has an 8-byte header (stream type, three zero bytes, big-endian
    length). stderr is kept (its tail) for error messages; anything else is a protocol error."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._frame_left = 0  # stdout bytes of the current frame not yet returned
        self._stderr = b""

    def recv(self, size: int) -> bytes:
        while self._frame_left == 0:
            header = self._recv_exact(8)
            if header is None:
                return b""
            stream, length = header[0], struct.unpack(">I", header[4:])[0]
            if stream == 2:
                payload = self._recv_exact(length) if length else b""
                if payload is None:
                    return b""
                self._stderr = (self._stderr + payload)[-STDERR_KEEP:]
                continue
            if stream != 1:
                raise OpenAgentsError(ErrorType.PROTOCOL_ERROR, f"unexpected stream type {stream} from the container")
            self._frame_left = length
        chunk = self._sock.recv(min(size, self._frame_left))
        if not chunk:
            raise OpenAgentsError(ErrorType.AGENT_LOST, "the agent exited mid-message")
        self._frame_left -= len(chunk)
        return chunk

    def _recv_exact(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            chunk = self._sock.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(data)

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        # docker-py's attach response keeps a file object on this socket, in a reference cycle with
        # it: socket.close() would leave the descriptor open until the garbage collector finds the
        # cycle, one descriptor per box and per restart in a long-lived host. Closed here instead.
        try:
            os.close(self._sock.detach())
        except OSError:
            pass

    def stderr_tail(self) -> bytes:
        return self._stderr


class DockerDeployment:
    """Starts, kills in and removes one container at a time for a SupervisedSandbox; keeps the
    runtime chosen at the first start and the egress gate across restarts."""

    def __init__(self, spec: BoxSpec, config: SandboxConfig, client: docker.DockerClient | None = None) -> None:
        self.spec = spec
        self.config = config  # after the first start it names the runtime chosen
        docker_options(config)  # refused here, before anything starts, if it is not Docker's
        self._client = client
        self.container: Any = None
        self.runtime: RuntimeChoice | None = None  # chosen at the first start: gVisor where the daemon has it
        self.egress: EgressGate | None = None
        self.daemon = DaemonWatch()
        self.left_behind: list[str] = []  # ids of boxes not removed yet (no daemon, or a removal failed)
        # A box may exist that nothing here names: a create call cut short (its answer never came back).
        # Then, as while left_behind is not empty, this deployment stays in the process's registry, so
        # that the exit removes the process's boxes by their owner labels (lifetime.py).
        self._unsure = False

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = docker_client(engine=docker_options(self.config).engine)
            reaper.reap_leftovers_once(self._client)  # before the process's first box: the boxes of gone owners
        return self._client

    def start(self) -> DockerStream:
        problem = self.daemon.problem(self.client)
        if problem is not None:
            raise problem
        self._remove_left_behind()
        image = docker_options(self.config).image
        try:
            self.client.images.get(image)
        except docker.errors.ImageNotFound:
            raise OpenAgentsError(
                ErrorType.IMAGE_MISSING, f"image {image} is missing; build it with `oa-sandbox image build`"
            ) from None
        except DOCKER_ERRORS as err:
            raise OpenAgentsError(ErrorType.DOCKER_UNAVAILABLE, f"Docker failed: {err}") from None
        if self.runtime is None:
            self.runtime = self.choose_runtime()
            self.config = self.config.with_backend(runtime=self.runtime.name)
        lifetime.track(self, exit_sweep(self.client))
        if self.config.egress is not None and self.egress is None:
            from .egress import EgressGate

            self.egress = EgressGate(self.client, self.config.egress)
            self._unsure = True
            self.egress.start()
            self._unsure = False
        tries = 0
        while True:
            tries += 1
            try:
                try:
                    return self._create_and_start()
                except DOCKER_ERRORS:
                    self.remove()
                    lost = self.daemon.problem(self.client)  # the daemon went away while the box started: say that
                    if lost is not None:
                        raise lost from None
                    raise
            except DOCKER_ERRORS as err:
                if transient_start_failure(err) and tries < START_ATTEMPTS:
                    log.info("sandbox start failed (%s); try %d of %d", str(err)[:200], tries + 1, START_ATTEMPTS)
                    time.sleep(start_backoff(tries))
                    continue
                if _lacks_python(str(err)):  # any image with python3 works; one without it can never start the agent
                    raise OpenAgentsError(
                        ErrorType.IMAGE_MISSING,
                        f"image {image} has no python3 on its PATH (/usr/local/bin, /usr/bin, "
                        "/bin), which the box's agent needs: use an image with python3 (build on ours: FROM it)",
                    ) from None
                tried = f" (tried {tries} times)" if tries > 1 else ""
                raise OpenAgentsError(
                    ErrorType.SANDBOX_START_FAILED, f"could not start the sandbox{tried}: {err}"
                ) from None

    def _create_and_start(self) -> DockerStream:
        network = self.egress.network_name if self.egress else None
        self._unsure = True
        settings = container_settings(
            self.config,
            self.spec.workspace,
            self.spec.user,
            network,
            self.spec.baseline,
            self.spec.git_dir,
            self.egress.ca if self.egress else None,
        )
        self.container = self.client.containers.create(**engine_settings(self.client, settings))
        self._unsure = False
        sock = self.container.attach_socket(params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
        raw = getattr(sock, "_sock", sock)
        try:
            self.container.start()
        except BaseException:
            raw.close()  # a retry attaches afresh: this one's socket would stay open with nothing reading it
            raise
        return DockerStream(raw)

    def choose_runtime(self) -> RuntimeChoice:
        """--runtime as given, or gVisor when the daemon offers a usable registration (runtimes.py)
        and the workspace's repositories fit in the mounts gVisor can start with."""
        asked = docker_options(self.config).runtime
        try:
            choice = choose_runtime(asked, self.config.egress is not None, self.client)
        except DOCKER_ERRORS as err:
            raise OpenAgentsError(ErrorType.DOCKER_UNAVAILABLE, f"Docker failed: {err}") from None
        repositories = len(self.spec.baseline.git_entries) + len(self.config.read_only_entries)  # each a mount
        if choice.gvisor and repositories > MAX_GIT_MOUNTS_GVISOR:
            if asked is not None:
                raise OpenAgentsError(
                    ErrorType.CONFIG_INVALID,
                    f"--runtime {asked}: the workspace holds {repositories} repositories, each mounted "
                    f"read-only, and gVisor starts with at most {MAX_GIT_MOUNTS_GVISOR}: use --runtime runc",
                )
            return RuntimeChoice(
                RUNC,
                f"runc: the workspace holds {repositories} repositories, each mounted read-only, and gVisor starts "
                f"with at most {MAX_GIT_MOUNTS_GVISOR} mounts",
            )
        return choice

    def remove(self) -> None:
        """Removed and confirmed gone (reaper.remove_container waits out a removal in progress); when
        it is not, or the daemon does not answer, a warning names it and it is removed at the next
        start or close that reaches the daemon, else by the exit or the next command."""
        container, self.container = self.container, None
        if container is None:
            return
        # a read-only workspace's box in a one-shot command: its removal asked of Docker's daemon, not
        # waited for (handoff.py); Podman's boxes (their own socket, named volumes) are removed as always
        handoff_ok = engine_of(self.client) == "docker" and self.egress is None
        if handoff.enabled() and self.config.workspace_read_only and handoff_ok:
            if handoff.remove_detached(container.id):
                return
        self.left_behind.append(container.id)
        self._remove_left_behind()

    def _remove_left_behind(self) -> None:
        """The one place for every box this deployment has not removed yet: retried and verified
        whenever the daemon answers; until then the exit removes them by their owner labels
        (lifetime.py), and a daemon restarted without live-restore stops them as it comes back."""
        if not self.left_behind:
            return
        if self.daemon.problem(self.client) is not None:
            log.warning(
                "sandbox container(s) %s left behind: %s does not answer; removed once it does",
                ", ".join(c[:12] for c in self.left_behind),
                engine_name(self.client),
            )
            return
        self.left_behind = [
            c for c in self.left_behind if reaper.remove_container(self.client, c) is reaper.Removal.FAILED
        ]

    def close(self) -> None:
        if self._client is None:
            return
        if self.daemon.problem(self._client) is not None:
            if (
                self.egress is not None and self.egress.proxy is not None
            ):  # its proxy and network stay for `oa-sandbox gc`
                log.warning(
                    "the egress gate %s is left behind: %s does not answer",
                    self.egress.network_name,
                    engine_name(self._client),
                )
            self.egress = None
            self._unsure = True
            return
        self._remove_left_behind()
        if self.egress is not None:
            if not self.egress.close():
                self._unsure = True
            self.egress = None
        if not self._unsure and not self.left_behind:
            lifetime.untrack(self)

    def kill_processes(self) -> None:
        container = self.container
        if container is None or self.daemon.problem(self.client) is not None:
            return  # no daemon: nobody to ask, and nothing in the box outlives its agent's EOF
        run_detached(container, ["python3", "-I", "-S", "-c", _KILL_ALL], self.spec.user)

    def others_on_workspace(self) -> bool:
        if self._client is None or self.daemon.problem(self._client) is not None:
            return True  # unknown (no box was ever started, or the daemon is gone), as below
        try:
            # the low-level listing: one request, where containers.list inspects each box it finds
            return bool(self.client.api.containers(filters={"label": f"{LABEL}.workspace={self.spec.workspace}"}))
        except DOCKER_ERRORS:
            return True  # unknown: keep the placeholder, it is only an empty directory

    def drain_egress(self) -> list[EgressRecord]:
        return self.egress.drain() if self.egress is not None else []

    def widen_egress(self, rule: EgressRule, once: bool) -> bool:
        return self.egress.widen(rule, once) if self.egress is not None else False

    def why_lost(self, err: OpenAgentsError) -> OpenAgentsError:
        """When the daemon is gone, say that (DOCKER_UNAVAILABLE: the box is not replaced, so a dead
        daemon never becomes a restart loop); when Docker says the box was killed for memory, say
        that instead (under gVisor the whole box shares one memory cgroup, so a memory bomb takes
        the agent with it)."""
        problem = self.daemon.problem(self.client)
        if problem is not None:
            return OpenAgentsError(
                ErrorType.DOCKER_UNAVAILABLE,
                f"the sandbox was lost with {engine_name(self.client)}: {problem.message}; "
                "once it runs again, the next call or session gets a fresh sandbox",
            )
        container = self.container
        if container is None:
            return err
        try:
            container.reload()
            oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
        except DOCKER_ERRORS:
            return err
        unsaid = getattr(self.client, "killed_for_memory", None)  # Podman's inspect does not say it (podman.py)
        if not oom and unsaid is not None and unsaid(container.id, container.attrs):
            return OpenAgentsError(
                ErrorType.AGENT_LOST,
                f"the sandbox was killed (SIGKILL) with everything in it, most likely for memory (limit "
                f"{self.config.memory}, swap included; Podman does not report memory kills here); "
                "a fresh one takes over with the workspace as it was left",
            )
        if not oom:
            return err
        return OpenAgentsError(
            ErrorType.AGENT_LOST,
            f"the sandbox ran out of memory (limit {self.config.memory}, swap included) and was "
            "killed with everything in it; a fresh one takes over with the workspace as it was left",
        )

    @property
    def gvisor(self) -> bool:
        return self.runtime is not None and self.runtime.gvisor


class DockerSandbox(SupervisedSandbox):
    """One container, one agent, one workspace: the supervised sandbox over a DockerDeployment.
    Use as a context manager: the container is removed on exit, also after Ctrl-C."""

    deployment: DockerDeployment

    def __init__(
        self,
        workspace: str | os.PathLike[str],
        config: SandboxConfig | None = None,
        client: docker.DockerClient | None = None,
        *,
        state_dir: Path | None = None,
        git_dir: Path | None = None,
        baseline: Baseline | None = None,
    ) -> None:
        config = config or SandboxConfig()
        super().__init__(
            workspace,
            config,
            lambda spec: DockerDeployment(spec, config, client),
            state_dir=state_dir,
            git_dir=git_dir,
            baseline=baseline,
        )

    def __enter__(self) -> "DockerSandbox":
        self.start()
        return self

    @property  # type: ignore[override]  # narrower than the base's SandboxLimits: a Docker box's config is always a SandboxConfig
    def config(self) -> SandboxConfig:
        """The deployment's: after the first start it names the runtime chosen."""
        deployment = self.__dict__.get("deployment")
        config: SandboxConfig = deployment.config if deployment is not None else self.__dict__["_config"]
        return config

    @config.setter
    def config(self, value: SandboxConfig) -> None:
        self.__dict__["_config"] = value

    @property
    def container(self) -> Any:
        return self.deployment.container

    @property
    def client(self) -> docker.DockerClient:
        return self.deployment.client

    @property
    def runtime(self) -> RuntimeChoice | None:
        return self.deployment.runtime

    @property
    def egress(self) -> EgressGate | None:
        return self.deployment.egress
