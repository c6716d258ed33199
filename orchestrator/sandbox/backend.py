"""Which backend runs the boxes, chosen from the configuration in one place. The session, the
pool, the self-check and the CLI ask `backend_from_config()` and then speak only to the Sandbox
protocol (base.py); none of them names Docker."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from ..config import SandboxConfig
from ..errors import ErrorType, OpenAgentsError
from ..workspace.integrity import Baseline
from .base import Sandbox


@dataclass
class Diagnosis:
    """`oa-sandbox doctor`'s view of a backend: its checks as (status, text), status one of ok,
    info, fail; the config a box would get (its runtime chosen); whether a box can start at all."""

    checks: list[tuple[str, str]]
    config: SandboxConfig
    reachable: bool  # the backend answers (no daemon: doctor stops here)
    can_start: bool  # the image is there: the attack checks can run
    runtime: Any = field(default=None)  # the backend's own runtime choice, for settings_for


class Backend(Protocol):
    name: str

    def sandbox(self, workspace: str | os.PathLike[str], config: SandboxConfig, *, state_dir: Path | None = None,
                git_dir: Path | None = None, baseline: Baseline | None = None) -> Sandbox:
        """A sandbox for `workspace`, not started yet."""

    def diagnose(self, config: SandboxConfig) -> Diagnosis: ...

    def settings_for(self, diagnosis: Diagnosis, workspace: Path, user: str) -> list[tuple[str, str]]:
        """The security settings a box of `workspace` would get, as (name, value) rows."""

    def gc(self, everything: bool) -> int:
        """Remove leftover boxes; `everything`: also those whose host process is alive. How many went."""

    def build_image(self, tag: str, base: str, *, rebuild_base: bool, only_if_needed: bool,
                    progress: Callable[[str], None]) -> str:
        """Make the sandbox image `tag` on `base` (the backend's meaning: for Docker an image name,
        or 'debootstrap'); `only_if_needed`: leave a current image alone. Returns the tag."""


def backend_from_config(config: SandboxConfig, connection: Any = None) -> Backend:
    """The backend `config.backend` names. `connection`: one already open to it (a
    docker.DockerClient for Docker: tests and the bench share one), else the backend opens its own."""
    if config.backend == "docker":
        from .docker_admin import DockerBackend

        return DockerBackend(connection)
    raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"no sandbox backend named {config.backend!r}")
