"""Which OCI runtime a sandbox runs under: gVisor (runsc) when the daemon offers it, runc otherwise.

gVisor puts a second kernel (its user-space Sentry) between the box and the host's: a kernel bug
reachable from the box must then be a bug in both. scripts/setup registers the same runsc binary
twice (docs/gvisor.md says why):

- `runsc` with `--network=none --oci-seccomp`: boxes without network;
- `runsc-net` with `--network=host --oci-seccomp`: egress boxes, which need the interface Docker
  gives them on the proxy's internal network.

`--oci-seccomp` matters: without it runsc ignores the container's seccomp profile, and ours is what
stops a box putting setuid/setgid bits on workspace files. A runsc registration without it is
therefore not used by default, and refused when asked for. directfs (runsc 20240729's default, the
box's kernel opening host files itself: file-heavy work about 2x faster than through the gofer) is
used: with it an open(O_TRUNC) of a file on a read-only *bind* mount of a directory fails with EROFS
but truncates the host file first, so no directory is mounted that way: mounts.py makes read-only
directories daemon-made read-only volumes, which the host's kernel enforces.

Under `--oci-seccomp` runsc answers every SCMP_ACT_ERRNO rule with EPERM, whatever its errnoRet
(google/gvisor#14688). Docker's clone3 rule relies on ENOSYS: glibc >= 2.34 falls back to clone
only on ENOSYS, so with EPERM no thread can start (the agent dies with "can't start new thread").
`gvisor_profile` therefore lets clone3 through to gVisor's kernel, which answers it itself (ENOSYS
in Debian's runsc; a namespace made there would be gVisor's, not the host's). Everything else in
the profile holds as written (measured: the setuid/setgid refusals, io_uring).

runsc older than 2024 (Debian bookworm's 0.0~20221219) answers statx with AT_NO_AUTOMOUNT by EINVAL,
so coreutils' `ls`, `stat`, `cp -a` fail on every path in the box: such a registration is not used by
default either (scripts/setup installs bookworm-backports' 20240729).

Pure functions over `client.info()` and a version probe, so they are tested with plain dicts.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import subprocess
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from ..errors import ErrorType, OpenAgentsError
from ..programs import system
from . import seccomp

RUNC = "runc"
RUNSC = "runsc"
RUNSC_EGRESS = "runsc-net"
OCI_SECCOMP = "--oci-seccomp"
SETUP_HINT = "run scripts/setup (and scripts/setup-podman for Podman), as root or with sudo, to install and register it"
MIN_RUNSC_VERSION = 20240729  # the first Debian runsc whose statx takes AT_NO_AUTOMOUNT (coreutils' ls)
VersionProbe = Callable[[str], "int | None"]


@functools.lru_cache(maxsize=8)
def _version_of(path: str, mtime_ns: int) -> int | None:
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, env=system.environment()
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"runsc version \S*?(\d{8})", out)
    return int(match.group(1)) if match else None


def runsc_version(path: str) -> int | None:
    """The date in `runsc --version` of the daemon's registered binary (a root-owned host file the
    daemon itself runs, not anything from a box), or None when it cannot be told. A registration by
    name (`"path": "runsc"`) is found as dockerd finds it, in the system's directories, never on the
    user's PATH or in the working directory (the box writes the workspace: programs/system.py)."""
    try:
        found = system.find(path, "the gVisor runtime")
        return _version_of(found, os.stat(found).st_mtime_ns)
    except (OSError, OpenAgentsError):
        return None


class InfoClient(Protocol):
    """The part of docker.DockerClient this module needs."""

    def info(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class RuntimeChoice:
    """The runtime name to give Docker, and a sentence for `doctor` and the logs saying why."""

    name: str
    why: str

    @property
    def gvisor(self) -> bool:
        return is_gvisor(self.name)


def runtime_table(info: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """`Runtimes` of a `docker info` answer: name -> {"path": ..., "runtimeArgs": [...]}."""
    table = info.get("Runtimes") or {}
    return {str(name): dict(entry) if isinstance(entry, Mapping) else {} for name, entry in table.items()}


def available_runtimes(client: InfoClient) -> set[str]:
    """The runtime names the daemon accepts (`runc` always is, even when a daemon omits it)."""
    return set(runtime_table(client.info())) | {RUNC}


def runtime_args(info: Mapping[str, Any], name: str) -> list[str]:
    args = runtime_table(info).get(name, {}).get("runtimeArgs") or []
    return [str(a) for a in args]


def _gvisor_problem(info: Mapping[str, Any], name: str, version_of: VersionProbe) -> str | None:
    """Why the registration `name` cannot run our boxes with their guarantees, or None when it can."""
    table = runtime_table(info)
    if name not in table:
        return (
            f"{name} is not registered with the engine (Docker's daemon.json, Podman's containers.conf): {SETUP_HINT}"
        )
    if OCI_SECCOMP not in runtime_args(info, name):
        return (
            f"{name} is registered without {OCI_SECCOMP}: gVisor would ignore the sandbox's seccomp profile "
            f"(a box could set setuid/setgid bits on workspace files); {SETUP_HINT} again"
        )
    path = str(table[name].get("path") or "")
    version = version_of(path)
    if version is None:
        return f"{name} ({path}) does not say its version: {SETUP_HINT} again"
    if version < MIN_RUNSC_VERSION:
        return (
            f"{name} ({path}) is version {version}, older than {MIN_RUNSC_VERSION}: its statx refuses AT_NO_AUTOMOUNT, "
            f"so ls and stat fail on every path in the box; {SETUP_HINT} (bookworm-backports has it)"
        )
    return None


def choose_runtime_from_info(
    requested: str | None, egress: bool, info: Mapping[str, Any], version_of: VersionProbe = runsc_version
) -> RuntimeChoice:
    """The runtime for one box. `requested` is `--runtime` (None: choose). `egress`: the box joins the
    proxy's internal network, so under gVisor it needs the registration that has a network."""
    gvisor_name = RUNSC_EGRESS if egress else RUNSC
    if requested is None:
        problem = _gvisor_problem(info, gvisor_name, version_of)
        if problem is None:
            return RuntimeChoice(
                gvisor_name,
                f"gVisor ({gvisor_name}) registered with the engine: a second kernel between the box and the host",
            )
        return RuntimeChoice(RUNC, f"runc, without gVisor: {problem}")
    if requested == RUNC:
        return RuntimeChoice(
            RUNC, "runc: asked for with --runtime runc (no gVisor kernel between the box and the host)"
        )
    if requested in (RUNSC, RUNSC_EGRESS):
        # --runtime runsc means "gVisor": an egress box gets the registration with a network.
        problem = _gvisor_problem(info, gvisor_name, version_of)
        if problem is not None:
            raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"--runtime {requested}: {problem}; or use --runtime runc")
        note = (
            ""
            if requested == gvisor_name
            else f" ({gvisor_name} is the registration for a box {'with' if egress else 'without'} network)"
        )
        return RuntimeChoice(gvisor_name, f"gVisor ({gvisor_name}): asked for with --runtime {requested}{note}")
    if requested not in runtime_table(info):
        known = ", ".join(sorted(set(runtime_table(info)) | {RUNC}))
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID, f"--runtime {requested}: the engine has no such runtime (it has: {known})"
        )
    return RuntimeChoice(requested, f"{requested}: asked for with --runtime {requested}")


def choose_runtime(
    requested: str | None, egress: bool, client: InfoClient, version_of: VersionProbe = runsc_version
) -> RuntimeChoice:
    """choose_runtime_from_info over the daemon's current answer. runc asked for by name needs none:
    `docker info` costs ~6 ms a box (it counts images and containers and asks the storage driver),
    and runc is always there (issue 26). The answer is not kept between boxes: a registration
    changed meanwhile (daemon.json reloaded) must be checked again before a box runs under it."""
    if requested == RUNC:
        return choose_runtime_from_info(requested, egress, {}, version_of)
    return choose_runtime_from_info(requested, egress, client.info(), version_of)


GVISOR_RUNTIMES = frozenset({RUNSC, RUNSC_EGRESS})


def is_gvisor(runtime: str | None) -> bool:
    """runsc, runsc-net, and any other registration named runsc-* (the candidates bench/platforms.py
    measures, e.g. runsc-ptrace): each gets gVisor's seccomp profile, without which no thread starts."""
    return runtime is not None and (runtime in GVISOR_RUNTIMES or runtime.startswith(RUNSC + "-"))


def gvisor_profile(profile: dict[str, Any]) -> dict[str, Any]:
    """`profile` for runsc --oci-seccomp: clone3 answered by gVisor's kernel instead of a refusal that
    runsc would turn into EPERM (see the module docstring). Validated like the original."""
    out = copy.deepcopy(profile)
    rules = []
    for rule in out["syscalls"]:
        if "clone3" in rule["names"]:
            rule["names"] = [n for n in rule["names"] if n != "clone3"]
            if not rule["names"]:
                continue
        rules.append(rule)
    rules.append(
        {
            "names": ["clone3"],
            "action": "SCMP_ACT_ALLOW",
            "comment": "openagents under gVisor: runsc makes every errno EPERM (gvisor#14688) and "
            "glibc falls back to clone only on ENOSYS; gVisor's own kernel answers clone3",
        }
    )
    out["syscalls"] = rules
    seccomp.validate(out)
    return out


@functools.lru_cache(maxsize=1)
def _gvisor_profile_json() -> str:
    return json.dumps(gvisor_profile(json.loads(seccomp.profile_json())), separators=(",", ":"), sort_keys=True)


def seccomp_security_opt(runtime: str | None) -> str:
    """The `seccomp=...` security option for a box under `runtime` (container_settings' entry)."""
    return "seccomp=" + _gvisor_profile_json() if is_gvisor(runtime) else seccomp.security_opt()


def _flag(args: list[str], name: str) -> str | None:
    """The value of `--name=value` (or a bare `--name`: "true") among runsc's arguments, the last one winning."""
    value = None
    for arg in args:
        if arg == f"--{name}":
            value = "true"
        elif arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
    return value


def gvisor_settings(info: Mapping[str, Any], name: str) -> str:
    """What the registration `name` runs boxes with, and why, for `doctor`: the platform (how gVisor's
    kernel catches the box's system calls), directfs, the root overlay. Read from the daemon's own
    registration, so it is what this machine's boxes get."""
    args = runtime_args(info, name)
    platform = _flag(args, "platform") or "systrap"
    why_platform = {
        "systrap": "gVisor's default; scripts/setup measures it against ptrace on the machine and registers the faster",
        "ptrace": "scripts/setup measured it faster than systrap on this machine",
        "kvm": "KVM: needs /dev/kvm with (nested) virtualisation",
    }.get(platform, "as registered")
    directfs = _flag(args, "directfs")
    directfs_text = (
        (
            "directfs off: every file operation goes through the gofer (file-heavy work about 2x slower than "
            "with directfs)"
        )
        if directfs == "false"
        else (
            "directfs on: the box's kernel opens host files itself; read-only "
            "directories (.git) are read-only volumes the engine mounts in the host's "
            "kernel, so a write through them is refused before anything changes"
        )
    )
    overlay = _flag(args, "overlay2") or "root:self (default)"
    return f"platform {platform} ({why_platform}); {directfs_text}; root overlay {overlay}"
