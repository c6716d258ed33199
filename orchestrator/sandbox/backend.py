"""The one place a backend is made from its config (SWE-ReX's `get_deployment(config)`): the
session, the pool, the self-check and the CLI ask `backend_from_config()` and then speak only to
the Backend and Box protocols (base.py); none of them names Docker."""

from __future__ import annotations

from typing import Any, assert_never

from ..config import DockerBackendConfig, SandboxConfig
from .base import Backend


def backend_from_config(config: SandboxConfig, connection: Any = None) -> Backend:
    """The backend `config.backend` is the config of (its `kind` tells). `connection`: one already
    open to it (a docker.DockerClient for Docker: tests and the bench share one), else the backend
    opens its own. Each backend's module is imported only when it is the one chosen (its SDK with
    it); a new kind that is not handled here fails mypy at assert_never."""
    options = config.backend
    match options:
        case DockerBackendConfig():
            from .docker_admin import DockerBackend

            return DockerBackend(options, connection)
    assert_never(options)
