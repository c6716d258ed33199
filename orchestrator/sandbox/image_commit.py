"""A Dockerfile of the simple kind ours are, built as one container and one commit (issue 50's set-up).

The classic builder (the daemon here has no BuildKit) makes a container and a commit for every step,
metadata steps included: about 3 s a step on fuse-overlayfs, 25 s for Dockerfile.sandbox's ten. Here
the same Dockerfile is read, not rewritten: its COPYs go into one container made from the base, its
RUNs run there as root with no network (`sh -c`, in order), and the commit takes ENV, WORKDIR,
USER, ENTRYPOINT, EXPOSE and the labels as changes: about 4 s. A Dockerfile with anything else (a
COPY after a RUN, a RUN after ENV, CMD, ADD, a second FROM, ...) returns None and is built by the classic builder.
"""

from __future__ import annotations

import io
import shlex
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import docker
import docker.errors

from ..errors import ErrorType, OpenAgentsError
from .engine import engine_settings

CHANGES = ("ENV", "WORKDIR", "USER", "ENTRYPOINT", "EXPOSE")
DEFAULT_PATH = (
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # what the classic builder gives a base without PATH
)


@dataclass
class Plan:
    copies: list[tuple[str, str]] = field(default_factory=list)  # (source in the context, destination in the image)
    runs: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments) of a Dockerfile, continuation lines joined, comments left out."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = (pending + stripped).strip()
        pending = ""
        word, _, rest = whole.partition(" ")
        out.append((word.upper(), rest.strip()))
    if pending:
        word, _, rest = pending.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def plan(text: str) -> Plan | None:
    """What one container and one commit must do, or None when the Dockerfile needs the classic builder."""
    result, seen_from, has_entrypoint = Plan(), False, False
    for word, args in instructions(text):
        if word == "ARG" and not seen_from:
            continue  # the base's name: the caller gives the base
        if word == "FROM" and not seen_from:
            seen_from = True
            continue
        if not seen_from:
            return None
        if word == "COPY" and not result.runs and not args.startswith(("--", "[")):
            parts = args.split()
            if len(parts) != 2:
                return None
            result.copies.append((parts[0], parts[1]))
        elif (
            word == "RUN" and not args.startswith("[") and not result.changes
        ):  # ENV, USER, WORKDIR before a RUN would apply to it
            result.runs.append(args)
        elif word in CHANGES:
            has_entrypoint = has_entrypoint or word == "ENTRYPOINT"
            result.changes.append(f"{word} {args}")
        else:
            return None
    # ENTRYPOINT resets the base's CMD in the classic builder; without one the commit would keep ours (sh -c).
    return result if seen_from and has_entrypoint else None


def _context_tar(context: Path, copies: list[tuple[str, str]]) -> bytes:
    """The COPYs as one tar rooted at /: owned by root as COPY makes them, modes kept."""

    def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        made: set[str] = set()
        for source, destination in copies:
            target = PurePosixPath(destination.rstrip("/") or "/")
            for parent in reversed(target.parents):
                if str(parent) not in ("/", ".") and str(parent) not in made:
                    made.add(str(parent))
                    info = owned_by_root(tarfile.TarInfo(str(parent).lstrip("/")))
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
                    tar.addfile(info)
            path = (context / source).resolve()
            if not path.is_relative_to(context.resolve()) or not path.exists():
                raise OpenAgentsError(ErrorType.SANDBOX_START_FAILED, f"image build: COPY {source}: not in {context}")
            tar.add(str(path), arcname=str(target).lstrip("/"), filter=owned_by_root)
    return buf.getvalue()


def build(
    client: docker.DockerClient, context: Path, dockerfile: str, tag: str, base: str, labels: dict[str, str]
) -> bool:
    """Build `dockerfile` on `base` as `tag` in one commit; False when it needs the classic builder."""
    steps = plan((context / dockerfile).read_text())
    if steps is None:
        return False
    base_config = client.images.get(base).attrs.get("Config") or {}
    if base_config.get("User") not in (None, "", "0", "root", "0:0"):
        return False  # the classic builder runs the RUNs as the base's user; here they run as root
    base_env = base_config.get("Env") or []
    if not any(entry.startswith("PATH=") for entry in base_env):
        steps.changes.insert(0, f"ENV PATH={DEFAULT_PATH}")
    script = " && ".join(f"( {run} )" for run in steps.runs) or "true"
    # as the engine takes a container (engine_settings: under Podman the service's own rlimits, else it fails)
    settings = {"entrypoint": ["/bin/sh", "-c"], "user": "0", "network_disabled": True, "network_mode": "none"}
    container = client.containers.create(base, command=[script], **engine_settings(client, settings))
    try:
        if steps.copies:
            container.put_archive("/", _context_tar(context, steps.copies))
        if steps.runs:
            container.start()
            code = container.wait().get("StatusCode", 1)
            if code != 0:
                tail = container.logs().decode(errors="replace")[-800:]
                raise OpenAgentsError(ErrorType.SANDBOX_START_FAILED, f"image build failed: RUN exited {code}: {tail}")
        # one LABEL a pair: Podman's commit reads `LABEL a=1 b=2` as one label a, valued "1 b=2"
        label_changes = [f"LABEL {shlex.quote(k)}={shlex.quote(v)}" for k, v in labels.items()]
        repository, _, version = tag.rpartition(":") if ":" in tag.rsplit("/", 1)[-1] else (tag, "", "latest")
        container.commit(repository=repository, tag=version, changes=[*steps.changes, "CMD []", *label_changes])
    finally:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass
    return True
