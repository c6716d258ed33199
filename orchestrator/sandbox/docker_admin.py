"""The Docker backend as the CLI sees it: making sandboxes, `doctor`'s checks and settings table,
and `gc`. Next to the deployment (docker.py) because every line of it knows Docker."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import docker
import docker.errors

from ..config import DockerBackendConfig, SandboxConfig
from ..errors import ErrorType, OpenAgentsError
from ..workspace.integrity import Baseline
from .base import Diagnosis
from .daemon import DOCKER_ERRORS
from .docker import DockerSandbox, container_settings, docker_client, docker_options
from .engine import engine_of
from .reaper import Scope, reap, reap_leftovers_once
from .runtimes import RuntimeChoice, available_runtimes, choose_runtime, gvisor_settings, is_gvisor
from .seccomp import DESCRIPTION as SECCOMP


def security_rows(
    config: SandboxConfig, workspace: Path, user: str, choice: RuntimeChoice | None = None
) -> list[tuple[str, str]]:
    """What `container_settings` gives a box, as doctor's rows (the runtime as chosen, or as configured)."""
    settings = container_settings(config, workspace, user)
    asked = docker_options(config).runtime
    runtime = choice.name if choice else asked or "runc"
    gvisor = choice.gvisor if choice else is_gvisor(asked)
    return [
        ("root filesystem", "read-only" if settings["read_only"] else "writable"),
        ("/tmp", settings["tmpfs"]["/tmp"]),
        ("capabilities", "drop " + ",".join(settings["cap_drop"])),
        (
            "security options",
            ", ".join(f"seccomp: {SECCOMP}" if o.startswith("seccomp=") else o for o in settings["security_opt"]),
        ),
        ("pids limit", str(settings["pids_limit"])),
        ("memory limit", f"{settings['mem_limit']} (swap included)"),
        ("cpus", str(settings["nano_cpus"] / 1e9)),
        ("file size limit", f"{config.max_file_size} bytes"),
        ("environment", ", ".join(sorted(settings["environment"]))),
        (
            "runtime",
            f"{runtime} ({'gVisor: a second kernel between the box and the host' if gvisor else 'the host kernel'})",
        ),
    ]


def engine_line(client: docker.DockerClient, version: dict[str, str]) -> str:
    """doctor's first row: which engine runs the boxes, and how it was reached."""
    api = f"API {version.get('ApiVersion')}"
    if engine_of(client) == "podman":
        from .podman import rootless

        mode = "rootless" if rootless() else "rootful"
        return (
            f"engine podman {version.get('Version')} ({mode}, {api}, its service on {getattr(client, 'socket', '?')})"
        )
    return f"engine docker: Docker daemon {version.get('Version')} ({api})"


class DockerBackend:
    """Sandboxes as hardened containers on the local Docker daemon (the default backend)."""

    def __init__(self, options: DockerBackendConfig | None = None, client: docker.DockerClient | None = None) -> None:
        """`options`: the config it was made from (backend.py); its image is the one `build_image` makes by default."""
        self.options = options or DockerBackendConfig()
        self._client = client

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = docker_client(engine=self.options.engine)
            reap_leftovers_once(self._client)
        return self._client

    def sandbox(
        self,
        workspace: str | os.PathLike[str],
        config: SandboxConfig,
        *,
        state_dir: Path | None = None,
        git_dir: Path | None = None,
        baseline: Baseline | None = None,
    ) -> DockerSandbox:
        return DockerSandbox(workspace, config, self._client, state_dir=state_dir, git_dir=git_dir, baseline=baseline)

    def diagnose(self, config: SandboxConfig) -> Diagnosis:
        """The daemon, the image and the runtime a box would get; settings_for() then gives the rows."""
        try:
            client = self._client or docker_client(timeout=10, engine=self.options.engine)
            self._client = client
            reap_leftovers_once(client)  # `doctor` reaps the boxes of gone owners and says so
            version = client.version()
        except OpenAgentsError as err:
            return Diagnosis(checks=[("fail", err.message)], config=config, reachable=False, can_start=False)
        checks = [("ok", engine_line(client, version))]
        if getattr(client, "limits_ignored", lambda: False)():
            checks.append(
                (
                    "warn",
                    "rootless Podman on cgroups v1 cannot limit a box's memory, pids or CPU: the box's processes "
                    "are held to the pids limit by RLIMIT_NPROC, its memory is not bounded (boot with cgroups v2, "
                    "systemd.unified_cgroup_hierarchy=1, or run Podman as root)",
                )
            )
        options = docker_options(config)
        from .image import image_status

        status = image_status(client, options.image)
        checks.append(
            (
                "ok" if status == "current" else "fail",
                f"image {options.image}: {status}"
                + ("" if status == "current" else "  (run `oa-sandbox image build`)"),
            )
        )
        choice = choose_runtime(options.runtime, config.egress is not None, client)  # CONFIG_INVALID propagates
        checks.append(("ok" if choice.gvisor else "info", f"runtime {choice.name}: {choice.why}"))
        if choice.gvisor:
            checks.append(("info", f"gVisor settings of {choice.name}: {gvisor_settings(client.info(), choice.name)}"))
        checks.append(("info", f"runtimes the engine has: {', '.join(sorted(available_runtimes(client)))}"))
        return Diagnosis(
            checks=checks,
            config=config.with_backend(runtime=choice.name),
            reachable=True,
            can_start=status != "missing",
            runtime=choice,
        )

    def settings_for(self, diagnosis: Diagnosis, workspace: Path, user: str) -> list[tuple[str, str]]:
        return security_rows(diagnosis.config, workspace, user, diagnosis.runtime)

    def gc(self, everything: bool) -> int:
        """Remove leftover sandbox containers and egress networks (reaper.py says which); `everything`:
        also those whose host process is alive. Returns how many containers went."""
        client = self._client or docker_client(timeout=30, engine=self.options.engine)
        try:
            reaped = reap(client, Scope.ALL if everything else Scope.GC)
        except DOCKER_ERRORS as err:
            raise OpenAgentsError(ErrorType.DOCKER_UNAVAILABLE, f"Docker failed: {str(err)[:300]}") from None
        return len(reaped.containers)

    def build_image(
        self, tag: str | None, base: str, *, rebuild_base: bool, only_if_needed: bool, progress: Callable[[str], None]
    ) -> str:
        from .image import build_image, ensure_image

        tag = tag or self.options.image
        client = self._client or docker_client(
            timeout=600, engine=self.options.engine
        )  # a build outlasts the default API timeout
        reap_leftovers_once(client)
        if only_if_needed:
            return ensure_image(client, tag, progress, base=base, rebuild_base=rebuild_base)
        return build_image(client, base=base, tag=tag, progress=progress, rebuild_base=rebuild_base)
