"""Podman as the engine under the Docker backend: the same deployment, spoken to over Podman's
Docker-compatible API (`podman system service`), not a second backend.

Driving Podman through docker-py keeps every line of the deployment, the pool, the reaper and the
egress gate as they are: the container settings, the attach stream, the detached exec that kills,
the label filters all mean the same over Podman's compatible API (4.3.1 answers as Docker API
1.41). Driving the `podman` CLI instead would need a second deployment (a subprocess per create,
attach, exec and inspect, and its own stream demultiplexing) for the same behaviour. What differs
is kept here, behind `PodmanClient`:

- the seccomp profile: Podman takes `seccomp=` as a file's path, never the JSON itself, so the
  profile is written to a file in the caller's own state directory (content-addressed) and named;
- the open-files and processes limits: rootful Podman asks the runtime for 1048576 open files and
  as many processes, which fails where the host's hard limits are lower (20000 open files in this
  machine's container), so every box gets the host's own hard limits, stated (the pids limit still
  bounds the box's processes);
- the read-only views of directories (mounts.py: a volume the engine binds read-only in the host's
  kernel): Podman ignores the driver options of an anonymous volume and mounts an empty writable
  one instead (seen: the box's .git was an empty volume it could write), so each view is a named
  volume made first (`oa-view-...`, with the owner's labels), mounted read-only, and removed with its
  box (reaper.remove_container), or by the reaper once its owner is gone;
- gVisor: Podman has no per-runtime arguments, so scripts/setup registers small wrappers
  (`exec /usr/bin/runsc --network=none --oci-seccomp "$@"`) in containers.conf; `info()` reads each
  wrapper's arguments back into Docker's `runtimeArgs`, so runtimes.py checks them as it checks
  Docker's registrations (a wrapper without --oci-seccomp is not used).

"Daemon loss" under Podman: Podman has no daemon that owns the boxes (each is kept by its own
`conmon`); the API service is a stateless front. When it goes, the boxes' attach streams go with
it: the agent reads EOF and exits, its container stays (exited) until it is removed. The first
ping that fails starts the service again (PodmanClient.revive, asked by daemon.DaemonWatch), so the
lost box is replaced like one whose agent died, the one left behind is removed through the new
service, and the session goes on: a lost service costs a box, not the session.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import resource
import shlex
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import docker

from .. import state
from ..config import LABEL
from ..errors import ErrorType, OpenAgentsError
from ..programs import system
from .daemon import share_one_pool

log = logging.getLogger(__name__)

ROOTFUL_SOCKET = Path("/run/podman/podman.sock")
SERVICE_WAIT_S = 10.0  # `podman system service` answers in about a second
WRAPPER_DIR = "/usr/local/lib/openagents"  # scripts/setup's runsc wrappers (root-owned)
INSTALL_HINT = "on Debian: `sudo apt-get install podman`"


def socket_path() -> Path:
    """Where this user's Podman service listens: root's in /run/podman; a user's in its runtime
    directory (XDG_RUNTIME_DIR, else /run/user/UID, else Podman's own fallback /tmp/podman-run-UID)."""
    if os.geteuid() == 0:
        return ROOTFUL_SOCKET
    uid = os.geteuid()
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR") or next(
        (d for d in (f"/run/user/{uid}",) if os.path.isdir(d)), f"/tmp/podman-run-{uid}"
    )
    return Path(runtime_dir) / "podman" / "podman.sock"


def _private_parent(path: Path) -> None:
    """The socket's directory: made private, or refused, typed, when someone else owns it (in /tmp
    another user could have made it first and would then see, or serve, our API)."""
    os.makedirs(path.parent, mode=0o700, exist_ok=True)  # each directory it makes 0700
    for directory in (path.parent, path.parent.parent):
        st = os.stat(directory, follow_symlinks=False)
        if st.st_uid != os.geteuid():
            raise OpenAgentsError(
                ErrorType.DOCKER_UNAVAILABLE,
                f"{directory} (the Podman service's socket directory) belongs to uid {st.st_uid}, not to you: "
                "set XDG_RUNTIME_DIR to a directory of your own",
            )


def podman_binary() -> str | None:
    try:
        return system.find("podman", "the Podman engine")
    except OpenAgentsError:
        return None


def rootless() -> bool:
    return os.geteuid() != 0


def _listening(path: Path) -> bool:
    """Someone listens on `path` (a service that may be slow to answer, but is there): only a missing
    socket or a refused connection says nobody does; a connection that waits (a full backlog under
    load) is somebody."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(path))
        return True
    except (FileNotFoundError, ConnectionRefusedError):
        return False
    except OSError:
        return True


def _answers(path: Path, within: float) -> bool:
    """A ping answered within `within` seconds, asked again while someone listens."""
    deadline = time.monotonic() + within
    while True:
        try:
            client = docker.DockerClient(base_url=f"unix://{path}", timeout=max(1, int(within)))
            try:
                client.ping()
                return True
            finally:
                client.close()
        except (docker.errors.DockerException, OSError):
            pass
        if time.monotonic() >= deadline or not _listening(path):
            return False
        time.sleep(0.1)


def runtime_socket(runtime: str) -> Path:
    """The socket of the service that creates boxes under `runtime` (see _PodmanAPI.create_container)."""
    return socket_path().with_name(f"podman-{runtime}.sock")


def ensure_service(path: Path | None = None, runtime: str | None = None) -> Path:
    """The socket of a Podman API service that answers, started when nobody listens there (`podman
    system service --time=0`, in its own session: it serves every later command too, as a daemon
    would). One start at a time, under a lock every process takes: a second service would take the
    socket's name from the first (Podman rebinds it), leaving boxes attached through one that no
    later request reaches. A fatal typed error when Podman is not installed or does not come up."""
    path = path or socket_path()
    if _listening(path) and _answers(path, SERVICE_WAIT_S):
        return path
    binary = podman_binary()
    if binary is None:
        raise OpenAgentsError(ErrorType.DOCKER_UNAVAILABLE, f"Podman is not installed ({INSTALL_HINT})")
    _private_parent(path)
    # beside the socket (the state directory can differ between processes: XDG_STATE_HOME)
    with open(path.with_name(f".{path.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _listening(path) and _answers(path, SERVICE_WAIT_S):
            return path  # another process started it while this one waited for the lock
        return _start_service(binary, path, runtime)


def _start_service(binary: str, path: Path, runtime: str | None) -> Path:
    env = system.environment(HOME=os.environ.get("HOME", "/"))
    if "XDG_RUNTIME_DIR" in os.environ:
        env["XDG_RUNTIME_DIR"] = os.environ["XDG_RUNTIME_DIR"]
    home = state.own_subdir("podman")
    log_path = home / f"{path.stem}.log"
    with open(log_path, "ab") as log_file:
        subprocess.Popen(
            [binary, *(["--runtime", runtime] if runtime else []), "system", "service", "--time=0", f"unix://{path}"],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            env=env,
            cwd=home,  # conmon marks a memory kill with a file `oom` in its working directory: not the caller's
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + SERVICE_WAIT_S
    while time.monotonic() < deadline:
        if _listening(path) and _answers(path, SERVICE_WAIT_S):
            return path
        time.sleep(0.1)
    tail = log_path.read_bytes()[-400:].decode(errors="replace") if log_path.exists() else ""
    raise OpenAgentsError(
        ErrorType.DOCKER_UNAVAILABLE,
        f"the Podman API service did not come up on {path} within {SERVICE_WAIT_S:g} s ({tail.strip() or 'no output'})"
        + ("; rootless Podman needs subordinate ids: run scripts/setup-podman --rootless USER" if rootless() else ""),
    )


def wrapper_args(path: str) -> tuple[str, list[str]] | None:
    """(runtime, arguments) of one of scripts/setup's runtime wrappers (`exec RUNTIME ARGS "$@"`), or
    None for anything else. Only a root-owned file in WRAPPER_DIR that nobody else can write is read:
    a host file, never one a box could have written."""
    if os.path.dirname(path) != WRAPPER_DIR:
        return None
    try:
        st = os.stat(path, follow_symlinks=False)
        if st.st_uid != 0 or st.st_mode & 0o022 or st.st_size > 4096:
            return None
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return None
    for line in text.splitlines():
        if line.startswith("exec "):
            words = shlex.split(line)[1:]
            if words and words[-1] == "$@":
                return words[0], words[1:-1]
    return None


def runtimes_as_docker(info: dict[str, Any]) -> dict[str, Any]:
    """Podman's `Runtimes` (name -> {"path"}) with each setup wrapper's arguments as Docker's
    `runtimeArgs` and its runtime as `path` (what runtimes.py checks and asks the version of)."""
    table = {}
    for name, entry in (info.get("Runtimes") or {}).items():
        entry = dict(entry) if isinstance(entry, dict) else {}
        found = wrapper_args(str(entry.get("path") or ""))
        if found is not None:
            entry = {"path": found[0], "runtimeArgs": found[1]}
        table[name] = entry
    return {**info, "Runtimes": table}


def _service_pid(path: Path) -> int:
    """The process serving `path` (the socket's peer credentials); OSError when nobody does."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        sock.connect(str(path))
        return int(struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0])


def service_limits(path: Path) -> dict[str, int]:
    """The hard limits of the process serving `path` (found by the socket's peer credentials), which
    its boxes cannot exceed: {"nofile": ..., "nproc": ...}; the caller's own where it cannot be told."""
    found = {
        "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[1],
        "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[1],
    }
    rows = {"Max open files": "nofile", "Max processes": "nproc"}
    try:
        pid = _service_pid(path)
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            for title, name in rows.items():
                if line.startswith(title):
                    hard = line[len(title) :].split()[1]
                    found[name] = resource.RLIM_INFINITY if hard == "unlimited" else int(hard)
    except (OSError, ValueError, IndexError, struct.error):
        pass
    return found


def host_limits(path: Path, processes: int | None = None) -> list[Any]:
    """The open-files and processes limits a box gets: the Podman service's hard limits (it would ask
    the runtime for more, which fails), at most 1048576 open files and 4194304 processes; `processes`
    lower still where no pids limit can be set (PodmanClient.limits_ignored)."""
    from docker.types import Ulimit

    limits = service_limits(path)
    nofile = min(limits["nofile"], 1048576) if limits["nofile"] >= 0 else 1048576
    nproc = min(limits["nproc"], 4194304) if limits["nproc"] >= 0 else 4194304
    if processes:
        nproc = min(nproc, processes)
    return [Ulimit(name="nofile", soft=nofile, hard=nofile), Ulimit(name="nproc", soft=nproc, hard=nproc)]


def seccomp_file(profile_json: str) -> Path:
    """The profile as a file Podman can name: in the caller's own state directory (never where a box
    writes), named by its content, written once."""
    digest = hashlib.sha256(profile_json.encode()).hexdigest()[:24]
    path = state.own_subdir("seccomp") / f"{digest}.json"
    if not path.exists():
        json.loads(profile_json)  # ours, from runtimes.py: refuse anything that is not JSON
        tmp = path.with_name(f".{digest}.{os.getpid()}.tmp")
        tmp.write_text(profile_json)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    return path


class _PodmanAPI(docker.APIClient):
    def create_container(self, *args: Any, **kwargs: Any) -> Any:
        """A box under its runtime, in the user namespace it needs.

        Podman's compatible API ignores HostConfig.Runtime (4.3.1 made every box a runc box, gVisor
        asked for or not), so a box under another runtime is created through a service of its own
        started with `podman --runtime NAME`, and its runtime is then read back from Podman's own
        inspect: a box not under the runtime asked for is removed and refused, never run. The
        other calls (attach, start, exec, remove) go through the main service: the runtime is the
        container's, kept with it.

        Rootless: the box's user namespace maps the caller's uid to itself (keep-id), so the box's
        user, the workspace's owner, owns its files inside too (else they show as root's and the box
        cannot write them). docker-py refuses any UsernsMode but "host", so it is set here."""
        host_config = dict(kwargs.get("host_config") or {})  # docker-py's containers.create passes it by keyword
        if rootless():
            host_config["UsernsMode"] = "keep-id"
        runtime = host_config.pop("Runtime", None)
        kwargs["host_config"] = host_config
        if not runtime:
            return super().create_container(*args, **kwargs)
        creator = _PodmanAPI(
            base_url=f"unix://{ensure_service(runtime_socket(runtime), runtime)}", timeout=self.timeout
        )
        try:
            created = creator.create_container(*args, **kwargs)
        finally:
            creator.close()
        found = self.get(self.base_url + f"/v4.0.0/libpod/containers/{created['Id']}/json").json().get("OCIRuntime")
        if found != runtime:
            self.remove_container(created["Id"], force=True, v=True)
            raise OpenAgentsError(
                ErrorType.SANDBOX_START_FAILED,
                f"Podman created the box under {found!r}, not {runtime!r} as asked: it was removed, not run",
            )
        return created

    def create_container_from_config(self, config: dict[str, Any], name: Any = None, platform: Any = None) -> Any:
        """Every box's environment is ours alone: Podman adds `container=podman` to every container's
        (its own default, not the image's), so the create asks it to leave that out (UnsetEnv, a
        Podman field of its compatible create, 4.3.1 has it); HOSTNAME it sets as Docker does."""
        create: Callable[..., Any] = super().create_container_from_config  # docker-py's, untyped
        return create({**config, "UnsetEnv": ["container"]}, name, platform)


class PodmanClient(docker.DockerClient):
    """A docker-py client on Podman's API socket; what Podman takes differently is translated here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # DockerClient's, with the API client above
        self.api = _PodmanAPI(*args, **kwargs)

    engine = "podman"
    socket: Path  # set by podman_client
    _cgroups: str | None = None  # "1" or "2", asked once

    def info(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return runtimes_as_docker(super().info(*args, **kwargs))

    def adapt_settings(self, settings: dict[str, Any]) -> dict[str, Any]:
        """container_settings for Podman: the seccomp profile as a file, the host's limits stated, the
        read-only views as named volumes (the module docstring says why each)."""
        options = [
            f"seccomp={seccomp_file(o.split('=', 1)[1])}" if o.startswith("seccomp={") else o
            for o in settings.get("security_opt", [])
        ]
        limits = host_limits(self.socket, settings.get("pids_limit") if self.limits_ignored() else None)
        out = {
            **settings,
            "security_opt": options,
            "ulimits": [*settings.get("ulimits", []), *limits],
            "mounts": named_views(self, settings.get("mounts", [])),
        }
        return out

    def revive(self) -> bool:
        """Start the API service again when it is gone (DaemonWatch asks when a ping fails): the boxes
        attached through the old one are lost with it, the next box starts through the new one."""
        try:
            ensure_service(self.socket)
            return True
        except OpenAgentsError as err:
            log.warning("the Podman API service could not be started again: %s", err.message)
            return False

    def killed_for_memory(self, container_id: str, attrs: dict[str, Any]) -> bool:
        """Whether a lost box was most likely killed for memory, which Podman's inspect does not say
        here: its OOMKilled stayed false for boxes the kernel killed for memory, runc's and runsc's
        alike (4.3.1, conmon 2.1.6, cgroups v1: conmon's mark of the kill, an empty file `oom`, went
        to its working directory, or nowhere when the box's init was the one killed). So a box whose
        init ended by SIGKILL (exit 137) under a memory limit is taken as one: under runc nothing
        inside can SIGKILL the init (the kernel ignores it from inside), under gVisor a command's
        `kill -9 1` ends the box so too (then the message's "most likely" is wrong, its type is the
        same: agent_lost); a box removed from outside is not found at all. Waited for a moment while
        the inspect still shows it running (its exit being recorded)."""
        if self.limits_ignored():
            return False  # no memory limit is set (rootless on cgroups v1)
        state = attrs.get("State") or {}
        if state.get("Running"):
            try:
                self.api.wait(container_id, timeout=5)
                state = self.api.inspect_container(container_id).get("State") or {}
            except (docker.errors.DockerException, OSError):
                return False
        return bool(state.get("OOMKilled")) or state.get("ExitCode") == 137

    def limits_ignored(self) -> bool:
        """Rootless Podman on cgroups v1 cannot set a box's memory, pids or CPU limits, and starts it
        without them (its own warning, not an error): then the processes limit stands in for pids."""
        if self._cgroups is None:
            try:
                self._cgroups = str((super().info().get("CgroupVersion") or "")).lstrip("v") or "2"
            except (docker.errors.DockerException, OSError):
                self._cgroups = "2"
        return rootless() and self._cgroups == "1"


VIEW = "view"  # the LABEL value of a read-only view's volume
VIEW_PREFIX = "oa-view-"


def named_views(client: docker.DockerClient, box_mounts: list[Any]) -> list[Any]:
    """`box_mounts` with each anonymous read-only view (mounts.read_only) made a named volume first,
    mounted read-only (were it ever missing, Podman would make an empty one: read-only still)."""
    from docker.types import Mount

    from .owner import labels_here

    out = []
    for mount in box_mounts:
        options = (mount.get("VolumeOptions") or {}).get("DriverConfig") or {}
        if mount.get("Type") != "volume" or mount.get("Source") or not options.get("Options"):
            out.append(mount)
            continue
        name = VIEW_PREFIX + os.urandom(12).hex()
        # uid and gid given: Podman then does not chown the volume's mount point at its first use (with
        # the directory bound read-only that fails the start: `lchown ..._data: read-only file system`).
        opts = {**options["Options"], "o": options["Options"]["o"] + f",uid={os.getuid()},gid={os.getgid()}"}
        client.volumes.create(name=name, driver="local", driver_opts=opts, labels={LABEL: VIEW, **labels_here()})
        out.append(Mount(target=mount["Target"], source=name, type="volume", read_only=True, no_copy=True))
    return out


def views_of(client: Any, container_id: str) -> list[str]:
    """The named views a Podman box mounts ([] under Docker, without a request): removed after it."""
    if getattr(client, "engine", "docker") != "podman":
        return []
    try:
        found = client.api.inspect_container(container_id).get("Mounts") or []
    except (docker.errors.DockerException, OSError):
        return []
    return [str(m["Name"]) for m in found if str(m.get("Name") or "").startswith(VIEW_PREFIX)]


def remove_views(client: Any, names: list[str]) -> None:
    for name in names:
        try:
            client.api.remove_volume(name)
        except docker.errors.NotFound:
            pass
        except (docker.errors.DockerException, OSError) as err:  # in use: its box is still there; the reaper retries
            log.warning("could not remove the read-only view %s: %s", name, str(err)[:200])


def doomed_views(client: Any, doomed: Callable[[dict[str, Any]], bool]) -> list[str]:
    """The views (Podman's only) whose labels `doomed` judges: the reaper's, by the owner labels."""
    if getattr(client, "engine", "docker") != "podman":
        return []
    rows = (client.api.volumes(filters={"label": f"{LABEL}={VIEW}"}) or {}).get("Volumes") or []
    return [str(row["Name"]) for row in rows if doomed(row.get("Labels") or {})]


def podman_client(timeout: int = 60, connect_timeout: float = 5.0) -> PodmanClient:
    """A client on a Podman service that answers (started when none does), or a fatal typed error."""
    path = ensure_service()
    try:
        # Podman's service answers as API 1.41 (4.3.1): named, so no version probe; its first answers
        # under load are slower than dockerd's (5 s was passed at load ~28), so connecting waits longer
        client = PodmanClient(base_url=f"unix://{path}", version="1.41", timeout=int(max(connect_timeout, 20)))
        client.socket = path
        share_one_pool(client)
        client.ping()
        client.api.timeout = timeout
    except (docker.errors.DockerException, OSError) as err:
        raise OpenAgentsError(
            ErrorType.DOCKER_UNAVAILABLE, f"the Podman service on {path} does not answer ({err})"
        ) from None
    return client
