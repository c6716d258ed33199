"""No leaked container: verified removal, and the reaping of boxes whose owner is gone (Docker).

Removal is confirmed, never assumed: `remove(force=True)`, then an inspect that must answer
NotFound. A conflict ("removal already in progress", a box still dying) is waited out until the
deadline; a daemon that is gone is said at warning level as docker_unavailable, with the id.

Every box and egress network/proxy carries its owner's labels (owner.py). Three scopes read them:
- LEFTOVERS, before a command's first box, `doctor`, an image build and a pending sweep (each calls
  reap_leftovers_once; getting a client reaps nothing): what belongs to an owner that is certainly
  gone (reaped, and said at warning level: a leftover is a leak someone should hear about);
- GC, `oa-sandbox gc`: those, and boxes of older versions (no owner labels) by their host-pid as
  before: removed unless that pid runs and the box does too;
- ALL, `oa-sandbox gc --all`: everything labelled as ours, live owners included.
Boxes of another pid namespace or machine, and boxes whose owner labels are garbled, are left
alone by all but ALL: from here nobody can tell whether their owner still runs.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import docker
import docker.errors

from ..config import LABEL
from ..errors import ErrorType
from . import podman
from .daemon import DOCKER_ERRORS, engine_name
from .owner import BOOT_LABEL, MAX_PID, PID_LABEL, START_LABEL, Owner, Verdict, current, pid_exists, verdict

log = logging.getLogger(__name__)

REMOVE_DEADLINE_S = 30.0  # a box that is still being removed (or killed) after this is reported, not waited for
NETWORK_DEADLINE_S = 10.0  # a network's endpoints go a moment after its last container
MAX_NAMED = 10  # ids a warning names at most


class Removal(enum.Enum):
    REMOVED = "removed"  # our removal took it, confirmed
    GONE = "gone"  # not there (any more): someone else's removal, or never created
    FAILED = "failed"  # still there at the deadline, or the daemon did not answer (said at warning level)


def remove_container(client: docker.DockerClient, container_id: str, deadline_s: float = REMOVE_DEADLINE_S) -> Removal:
    """Remove one container, with its anonymous volumes (the read-only views of mounts.py), and confirm
    it is gone (inspect -> NotFound); under Podman then its named read-only views (podman.py)."""
    views = podman.views_of(client, container_id)
    outcome = _remove_verified(
        client,
        "container",
        container_id,
        lambda: client.api.remove_container(container_id, force=True, v=True),
        lambda: client.api.inspect_container(container_id),
        deadline_s,
    )
    if outcome is not Removal.FAILED:
        podman.remove_views(client, views)
    return outcome


def remove_network(client: docker.DockerClient, network_id: str, deadline_s: float = NETWORK_DEADLINE_S) -> Removal:
    return _remove_verified(
        client,
        "network",
        network_id,
        lambda: client.api.remove_network(network_id),
        lambda: client.api.inspect_network(network_id),
        deadline_s,
    )


def _remove_verified(
    client: Any, kind: str, ident: str, remove: Callable[[], Any], inspect: Callable[[], Any], deadline_s: float
) -> Removal:
    deadline = time.monotonic() + deadline_s
    delay = 0.05
    ours = False
    last = "no answer"
    while True:
        try:
            remove()
            ours = True
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as err:  # 409 "removal already in progress", a box still dying: wait it out
            last = f"{err.status_code}: {_explanation(err)}"
        except DOCKER_ERRORS as err:  # after APIError: no answer at all
            return _unreachable(engine_name(client), kind, ident, err)
        try:
            inspect()
        except docker.errors.NotFound:
            return Removal.REMOVED if ours else Removal.GONE
        except docker.errors.APIError as err:
            last = f"{err.status_code}: {_explanation(err)}"
        except DOCKER_ERRORS as err:  # after APIError: no answer at all
            return _unreachable(engine_name(client), kind, ident, err)
        if time.monotonic() >= deadline:
            log.warning(
                "could not remove sandbox %s %s within %.0fs (last answer %s); `oa-sandbox gc` removes it later",
                kind,
                ident[:12],
                deadline_s,
                last,
            )
            return Removal.FAILED
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def _explanation(err: docker.errors.APIError) -> str:
    return str(err.explanation or err)[:300]


def _unreachable(engine: str, kind: str, ident: str, err: BaseException) -> Removal:
    log.warning(
        "%s: could not remove sandbox %s %s: %s did not answer (%s); the next oa-sandbox command removes it",
        ErrorType.DOCKER_UNAVAILABLE.value,
        kind,
        ident[:12],
        engine,
        str(err)[:300],
    )
    return Removal.FAILED


class Scope(enum.Enum):
    LEFTOVERS = "leftovers"
    GC = "gc"
    ALL = "all"


@dataclass
class Reaped:
    containers: list[tuple[str, int | None]] = field(default_factory=list)  # (id, owner pid) removed by us
    networks: list[str] = field(default_factory=list)
    failed: int = 0

    def summary(self) -> str:
        named = ", ".join(f"{cid[:12]} (pid {pid})" if pid else cid[:12] for cid, pid in self.containers[:MAX_NAMED])
        more = f" and {len(self.containers) - MAX_NAMED} more" if len(self.containers) > MAX_NAMED else ""
        return (
            f"removed {len(self.containers)} sandbox container(s) left by host processes that are gone: {named}{more}"
        )


def reap(client: docker.DockerClient, scope: Scope = Scope.LEFTOVERS) -> Reaped:
    """Remove what `scope` says is left over: containers first, then the egress networks they were on.
    LEFTOVERS lists only what carries owner labels (one label-filtered list each for containers and
    networks); GC and ALL list everything labelled as ours."""
    here = _named_here()
    if here is None and scope is Scope.LEFTOVERS:
        return Reaped()  # this process cannot be named (no /proc): it judges no owner
    key = BOOT_LABEL if scope is Scope.LEFTOVERS else LABEL
    reaped = Reaped()
    for row in client.api.containers(all=True, filters={"label": key}):
        labels = row.get("Labels") or {}
        if not _doomed(labels, here, scope, running=row.get("State") == "running"):
            continue
        if scope is Scope.LEFTOVERS and row.get("State") == "removing":
            continue  # the daemon removes it already (a one-shot command's box: handoff.py); one that fails is "dead"
        outcome = remove_container(client, str(row.get("Id", "")))
        if outcome is Removal.REMOVED:
            owner = Owner.from_labels(labels)
            reaped.containers.append((str(row["Id"]), owner.pid if owner else _legacy_pid(labels)))
        reaped.failed += outcome is Removal.FAILED
    only_owned = [BOOT_LABEL] if scope is Scope.LEFTOVERS else []
    for row in client.api.networks(filters={"label": [f"{LABEL}=egress", *only_owned]}):
        if not _network_doomed(client, row, here, scope):
            continue
        outcome = remove_network(client, str(row.get("Id", "")))
        if outcome is Removal.REMOVED:
            reaped.networks.append(str(row.get("Name", row["Id"])))
        reaped.failed += outcome is Removal.FAILED
    # Podman's named read-only views, judged by their owner labels as a box is (an unused one only: in use, it stays)
    podman.remove_views(
        client, podman.doomed_views(client, lambda labels: _doomed({**labels, LABEL: "1"}, here, scope, False))
    )
    return reaped


def _named_here() -> Owner | None:
    try:
        return current()
    except RuntimeError:
        return None


# LABEL's values on what we run: a box, an egress proxy. The images carry LABEL=image, and every
# container made from an image inherits its labels: a user's own `docker run` of the sandbox image
# is not ours to remove, not even by `gc --all`.
OUR_CONTAINERS = frozenset({"1", "egress"})


def _doomed(labels: Mapping[str, Any], here: Owner | None, scope: Scope, running: bool) -> bool:
    if labels.get(LABEL) not in OUR_CONTAINERS:
        return False
    if scope is Scope.ALL:
        return True
    owner = Owner.from_labels(labels)
    if owner is not None:
        return here is not None and verdict(owner, here) is Verdict.GONE
    if scope is Scope.LEFTOVERS or BOOT_LABEL in labels:
        return False  # garbled owner labels: only --all
    pid = _legacy_pid(labels)  # an older version's box: its host-pid, as `gc` always did
    return not (pid is not None and running and pid_exists(pid))


def _network_doomed(client: docker.DockerClient, row: Mapping[str, Any], here: Owner | None, scope: Scope) -> bool:
    """An egress network goes with its owner; an older version's, when no container is on it (GC);
    every one with ALL, after what is still on it."""
    labels = row.get("Labels") or {}
    owner = Owner.from_labels(labels)
    if scope is not Scope.ALL and owner is not None:
        return here is not None and verdict(owner, here) is Verdict.GONE
    if scope is not Scope.ALL and BOOT_LABEL in labels:
        return False
    try:
        attached = list((client.api.inspect_network(row["Id"]).get("Containers") or {}))
    except docker.errors.NotFound:
        return False
    if scope is not Scope.ALL:
        return not attached
    for cid in attached:
        remove_container(client, cid)
    return True


def _legacy_pid(labels: Mapping[str, Any]) -> int | None:
    value = labels.get(PID_LABEL)
    if not (isinstance(value, str) and value.isdigit() and len(value) <= 10):
        return None
    return int(value) if 0 < int(value) <= MAX_PID else None


_reaped_in: int | None = None  # the pid that reaped already: once per process
_reap_lock = threading.Lock()


def reap_leftovers_once(client: docker.DockerClient) -> None:
    """The boxes of owners that are gone, for a caller about to use Docker for real work (a sandbox's
    first client, doctor, an image build). Never fatal, never twice per process, and never a live
    process's box (owner.verdict)."""
    global _reaped_in
    with _reap_lock:
        if _reaped_in == os.getpid():
            return
        _reaped_in = os.getpid()
        try:
            reaped = reap(client, Scope.LEFTOVERS)
        except DOCKER_ERRORS as err:
            log.warning("could not look for leftover sandboxes: %s", str(err)[:300])
            return
    if reaped.containers:
        log.warning("%s", reaped.summary())


def owned_by_this_process() -> dict[str, list[str]]:
    """The label filter that finds every box and network this process made, whatever became of its handle."""
    here = current()
    return {"label": [f"{PID_LABEL}={here.pid}", f"{START_LABEL}={here.start}", f"{BOOT_LABEL}={here.boot}"]}


def remove_own(timeout: int = 10, base_url: str | None = None) -> None:
    """Remove every container and egress network of this process, through a connection of its own
    (the process's clients may be mid-request when a signal calls this). For exit and signals.
    `base_url`: the engine's socket (Podman's: engine.exit_sweep), else Docker's from the environment."""
    try:
        filters = owned_by_this_process()
    except RuntimeError:
        return  # not named (no /proc): its boxes carry the pid alone, left to `oa-sandbox gc`
    try:
        client = (
            docker.DockerClient(base_url=base_url, timeout=timeout) if base_url else docker.from_env(timeout=timeout)
        )
    except docker.errors.DockerException as err:
        log.warning(
            "%s: could not remove this process's sandboxes: %s", ErrorType.DOCKER_UNAVAILABLE.value, str(err)[:300]
        )
        return
    try:
        _remove_all(
            client, (str(row["Id"]) for row in client.api.containers(all=True, filters=filters)), remove_container
        )
        _remove_all(client, (str(row["Id"]) for row in client.api.networks(filters=filters)), remove_network)
        if base_url is not None:  # Podman's (engine.exit_sweep): its named read-only views too
            rows = (client.api.volumes(filters=filters) or {}).get("Volumes") or []
            podman.remove_views(client, [str(row["Name"]) for row in rows])
    except DOCKER_ERRORS as err:
        log.warning(
            "%s: could not remove this process's sandboxes: %s", ErrorType.DOCKER_UNAVAILABLE.value, str(err)[:300]
        )
    finally:
        client.close()


def _remove_all(
    client: docker.DockerClient, ids: Iterable[str], remove: Callable[[docker.DockerClient, str], Removal]
) -> None:
    for ident in list(ids):
        remove(client, ident)
