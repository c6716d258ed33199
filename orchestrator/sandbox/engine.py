"""Who runs the boxes: the Docker daemon, or Podman through its Docker-compatible service (podman.py).

Both are spoken to with docker-py, so everything past the connection is the same code. The engine
is the config's (`--engine`, config.toml's `engine`, SandboxOptions.engine), else OA_ENGINE, else
chosen: Docker when a daemon answers, Podman when none does (and DOCKER_HOST names none) and
Podman is installed.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import docker

from ..config import LABEL
from ..errors import ErrorType, OpenAgentsError
from .daemon import DAEMON_CHECK_S, DOCKER_ERRORS, share_one_pool

ENGINES = ("docker", "podman")
ENGINE_ENV = "OA_ENGINE"


def wanted_engine(engine: str | None = None) -> str | None:
    """The engine asked for (the config's, else OA_ENGINE's), None to choose; an unknown name is refused, typed."""
    name = engine or os.environ.get(ENGINE_ENV) or None
    if name is not None and name not in ENGINES:
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID, f"engine {name!r} (from {ENGINE_ENV} or --engine): use docker or podman"
        )
    return name


def engine_of(client: Any) -> str:
    """Which engine a connection speaks to (a PodmanClient says podman)."""
    return str(getattr(client, "engine", "docker"))


def _docker_daemon(timeout: int) -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=min(timeout, int(DAEMON_CHECK_S)))
        share_one_pool(client)
        client.ping()
        client.api.timeout = timeout
    except DOCKER_ERRORS as err:
        raise OpenAgentsError(
            ErrorType.DOCKER_UNAVAILABLE,
            f"no Docker daemon answers ({err}). Start one: `sudo systemctl start docker`, or `sudo dockerd &`; "
            "on Debian without Docker: `sudo apt-get install docker.io`, or use Podman (--engine podman). "
            "Set DOCKER_HOST if it listens elsewhere.",
        ) from None
    return client


def docker_client(timeout: int = 60, engine: str | None = None) -> docker.DockerClient:
    """A client that answers, or a fatal typed error that says how to start a daemon. Connecting
    (the version probe and the ping) waits DAEMON_CHECK_S at most, so a frozen daemon fails set-up
    in seconds; `timeout` then bounds each request of the real work. It removes nothing: a caller
    that wants the boxes of gone owners reaped says so (reaper.reap_leftovers_once).
    `engine`: docker or podman (wanted_engine); none named: Docker if its daemon answers, else Podman."""
    from . import podman

    name = wanted_engine(engine)
    if name == "podman":
        return podman.podman_client(timeout, DAEMON_CHECK_S)
    try:
        return _docker_daemon(timeout)
    except OpenAgentsError:
        # DOCKER_HOST names a Docker daemon: no answer there is said, not replaced by Podman
        if name is None and not os.environ.get("DOCKER_HOST") and podman.podman_binary() is not None:
            return podman.podman_client(timeout, DAEMON_CHECK_S)
        raise


@functools.lru_cache(maxsize=None)
def _remover_for(base_url: str) -> Any:
    from .reaper import remove_own

    return functools.partial(remove_own, base_url=base_url)


def exit_sweep(client: Any) -> Any:
    """What removes this process's boxes at exit on `client`'s engine (reaper.remove_own, through a
    connection of its own): one callable per engine, since lifetime.py keeps them as a set."""
    socket = getattr(client, "socket", None)
    if socket is None:
        from .reaper import remove_own

        return remove_own
    return _remover_for(f"unix://{socket}")


def engine_settings(client: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """container_settings as `client`'s engine takes them (podman.PodmanClient.adapt_settings)."""
    adapt = getattr(client, "adapt_settings", None)
    return adapt(settings) if adapt is not None else settings


def box_on_copy(path: str) -> bool | None:
    """Whether a running box of ours has the workspace `path` mounted (a fork's freeze asks before
    renaming a copy: workspace/fork.py); None when no daemon answers. Matched by the directory's
    identity (device and inode), not its spelling: a box's label holds the resolved path, the state
    directory may be reached through a link."""
    try:
        wanted = os.stat(path)
    except OSError:
        return None
    try:
        client = docker_client(timeout=int(DAEMON_CHECK_S))
    except OpenAgentsError:
        return None
    try:
        rows = client.api.containers(filters={"label": f"{LABEL}.workspace"})
    except DOCKER_ERRORS:
        return None
    finally:
        client.close()
    for row in rows:
        label = (row.get("Labels") or {}).get(f"{LABEL}.workspace")
        if not isinstance(label, str):
            continue
        try:
            found = os.stat(label)
        except (OSError, ValueError):
            continue
        if (found.st_dev, found.st_ino) == (wanted.st_dev, wanted.st_ino):
            return True
    return False
