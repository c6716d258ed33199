"""Whether the Docker daemon is there: the errors that mean it is not, and a ping with a short bound.

docker-py raises its own DockerException for what the daemon answers, but lets the `requests`
errors of a daemon that does not answer through as they are: a refused connection (the daemon
was killed), a reset one (killed mid-request), a read timeout (frozen, or restarting: a daemon
accepts connections before it serves them). Code that catches only DockerException lets those
escape untyped, so every Docker call that can meet a lost daemon catches DOCKER_ERRORS.

The client's own timeout (60 s) is for real work, which queues inside a busy daemon; deciding
whether anybody is there at all takes one ping bounded by DAEMON_CHECK_S, so a lost daemon costs a
call seconds, not minutes, and never a restart loop (base.py asks why_lost before replacing a box).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import docker.errors
import requests.exceptions
from docker.transport import UnixHTTPAdapter

from ..errors import ErrorType, OpenAgentsError

# Every way a Docker call fails: Docker's own errors, and OSError, which covers requests' (a refused,
# reset or timed-out connection) and a socket's. The one tuple the sandbox package catches.
DOCKER_ERRORS: tuple[type[Exception], ...] = (docker.errors.DockerException, OSError)
DAEMON_CHECK_S = 5.0  # a ping answers in milliseconds even while starts queue in the daemon
SILENT_MEMO_S = 10.0  # a daemon that just let a ping time out is taken as still silent this long
IDLE_CONNECTIONS = 32  # kept open to the daemon's socket for the next requests; more at once are opened and closed


class _OnePoolAdapter(UnixHTTPAdapter):
    """docker-py's adapter for the daemon's socket keeps one pool per request URL, and closes the
    least recently used past 25: with a few dozen boxes (each its own URLs) it closes pools under
    requests still using them. urllib3 then raises ClosedPoolError, which reads like a lost daemon,
    or an AttributeError from its pool-full path (100 boxes closing at once did, and their threads
    died). Every URL goes to the same socket: one pool serves them all."""

    def get_connection(self, url: str | bytes, proxies: Any = None) -> Any:
        return super().get_connection("http+docker://localhost", proxies)


def share_one_pool(client: Any) -> None:
    """Swap a unix-socket client's adapter for _OnePoolAdapter (TCP, SSH and pipes keep theirs)."""
    old = client.api.adapters.get("http+docker://")
    if type(old) is not UnixHTTPAdapter:
        return
    new = _OnePoolAdapter(old.socket_path, old.timeout, max_pool_size=IDLE_CONNECTIONS)
    client.api.mount("http+docker://", new)
    client.api._custom_adapter = new  # what docker-py closes with the client
    old.close()


def engine_name(client: Any) -> str:
    """Who answers for the boxes, as messages name it: Docker's daemon, or Podman's API service."""
    return "the Podman service" if getattr(client, "engine", "docker") == "podman" else "the Docker daemon"


class DaemonSilent(OpenAgentsError):
    """The daemon accepted the ping but did not answer it in time (frozen, or restoring)."""


def ping(client: Any, timeout: float = DAEMON_CHECK_S) -> OpenAgentsError | None:
    """None when the daemon answers /_ping within `timeout`, else the typed error (fatal)."""
    try:
        response = client.api.get(f"{client.api.base_url}/_ping", timeout=timeout)
        response.raise_for_status()
        return None
    except requests.exceptions.Timeout:
        return DaemonSilent(
            ErrorType.DOCKER_UNAVAILABLE,
            f"{engine_name(client)} does not answer (no reply to a ping within {timeout:g} s)",
        )
    except DOCKER_ERRORS as err:
        return OpenAgentsError(ErrorType.DOCKER_UNAVAILABLE, f"{engine_name(client)} is gone ({_reason(err)})")


class DaemonWatch:
    """One deployment's view of its daemon: `problem()` pings. A ping that timed out is remembered for
    SILENT_MEMO_S, so the kill, removal, sweep and restart that follow a silent daemon wait once, not
    each in turn; a refused one is not (asking again costs nothing, and the daemon may be back)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._silent: tuple[float, DaemonSilent] | None = None

    def problem(self, client: Any) -> OpenAgentsError | None:
        with self._lock:
            if self._silent is not None and time.monotonic() - self._silent[0] < SILENT_MEMO_S:
                return self._silent[1].detached()  # a fresh one: callers raise it
        problem = ping(client)
        revive = getattr(client, "revive", None)  # Podman's API service is ours to start again (podman.py)
        if problem is not None and revive is not None and revive():
            problem = ping(client)
        with self._lock:
            self._silent = (
                (time.monotonic(), problem.detached()) if isinstance(problem, DaemonSilent) else None
            )  # the caller raises `problem`
        return problem


def _reason(err: BaseException) -> str:
    """The innermost cause requests wraps twice over: `Connection refused`, not `('Connection aborted.', ...)`."""
    for _ in range(5):
        inner = next((arg for arg in err.args if isinstance(arg, BaseException)), None)
        if inner is None:
            break
        err = inner
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    text = str(err) or type(err).__name__
    return text if len(text) <= 300 else text[:300] + "…"
