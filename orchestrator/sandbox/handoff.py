"""A box's removal left to the daemon, off the critical path of a one-shot command (issue 50).

`oa-sandbox exec` of a tool that cannot change the workspace starts its box with the workspace mounted
read-only (cli/run.py). Nothing in such a box can write the workspace, so the sweep after it does not
need the box gone, and waiting for the daemon to delete it (60-140 ms, a third of `docker run`) is
waiting for nothing the answer depends on. The removal is asked for (DELETE with force, over the
daemon's Unix socket) and not waited for: the daemon finishes it after the command hung up (Docker
20.10 measured: tests/box/test_exec_fast.py holds the box gone within seconds of exec's return).

Not even until the daemon shows the box as "removing": it says so only once the box stopped, which is
most of the removal's time. The request is on the daemon's socket before the command exits; the next command's
reaper leaves a box in "removing" to the daemon, and one it still sees running is being removed already
(its own removal meets "removal in progress" and waits it out, reporting nothing as its own).

The no-leak guarantee stays: the box carries its owner's labels (owner.py); if the removal does not
happen (the daemon went away, a daemon that drops a request whose client hung up), the owner is gone
by then, and the next oa-sandbox command reaps the box before anything else (reaper.reap_leftovers_once),
as for a host that was killed. A box is never reused: it is only removed. Only boxes with a read-only
workspace and no egress gate are ever handed off, and only in a process that asked (enable()): a
session whose box may write the workspace waits for the removal, then sweeps, as before.
"""

from __future__ import annotations

import os
import re
import socket

_ENABLED = False
_ID = re.compile(r"[0-9a-f]{64}")


def enable() -> None:
    """This process is a one-shot command: its read-only boxes' removal is asked for, not waited for."""
    global _ENABLED
    _ENABLED = True


def enabled() -> bool:
    return _ENABLED


def docker_socket() -> str | None:
    """The daemon's Unix socket (DOCKER_HOST unix://..., or the default); None for any other transport."""
    host = os.environ.get("DOCKER_HOST", "")
    if not host:
        return "/var/run/docker.sock"
    if host.startswith("unix://"):
        return host[len("unix://") :]
    return None


def remove_detached(container_id: str) -> bool:
    """Ask the daemon to remove `container_id` (force, with its anonymous volumes) without waiting for
    the answer; False (the caller removes it itself, waiting) when it cannot be handed off: an id that
    is not a full one, a daemon not on a Unix socket, a socket that does not take the request."""
    path = docker_socket()
    if path is None or not _ID.fullmatch(container_id):
        return False
    request = f"DELETE /containers/{container_id}?force=1&v=1 HTTP/1.1\r\nHost: docker\r\nContent-Length: 0\r\n\r\n"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(path)
            sock.sendall(request.encode("ascii"))
            sock.shutdown(socket.SHUT_WR)
    except OSError:
        return False
    return True
