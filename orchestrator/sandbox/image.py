"""Building the sandbox image, with or without a registry.

With a registry, Dockerfile.sandbox builds on an ordinary base (python:3.12-slim). With none
(our own machines), a base is made from Debian's packages with mmdebstrap (else debootstrap) and `docker import`,
then the same Dockerfile builds on it.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Callable

import docker
import docker.errors

from ..config import DEFAULT_IMAGE, LABEL
from ..config import EGRESS_PROXY_IMAGE as PROXY_IMAGE
from ..errors import ErrorType, OpenAgentsError
from . import image_commit
from .debootstrap import BASE_TAG, SUITE, build_base
from .packages import BASE_PACKAGES

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile.sandbox"
AGENT_DIR = ROOT / "sandbox_agent"
PROXY_DIR = ROOT / "compose" / "proxy"
DEFAULT_BASE = "python:3.12-slim"
DEBOOTSTRAP_BASE, DEBOOTSTRAP_SUITE = BASE_TAG, SUITE  # the base from Debian's packages: debootstrap.py
HASH_LABEL = f"{LABEL}.agent-hash"

Progress = Callable[[str], None]


def _agent_files() -> list[Path]:
    if not DOCKERFILE.is_file():
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID,
            f"{DOCKERFILE} is missing: build the image from a source checkout (pip install -e .)",
        )
    return (
        [DOCKERFILE]
        + sorted(p for p in AGENT_DIR.rglob("*.py"))
        + [PROXY_DIR / "Dockerfile", *sorted(PROXY_DIR.rglob("*.py"))]
    )


def agent_hash() -> str:
    """Content hash of what goes into the image: a changed agent means a stale image."""
    digest = hashlib.sha256(("packages\0" + "\n".join(BASE_PACKAGES) + "\0").encode())
    for path in _agent_files():
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _has_image(client: docker.DockerClient, name: str) -> bool:
    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def image_status(client: docker.DockerClient, image: str = DEFAULT_IMAGE) -> str:
    """'missing', 'stale' (built from other agent or proxy code) or 'current'; the egress proxy's image counts too."""
    wanted = agent_hash()
    statuses = []
    for name in (image, PROXY_IMAGE):
        try:
            found = client.images.get(name)
        except docker.errors.ImageNotFound:
            return "missing"
        statuses.append((found.labels or {}).get(HASH_LABEL) == wanted)
    return "current" if all(statuses) else "stale"


def _context_tar(root: Path) -> io.BytesIO:
    """Only the files the Dockerfile needs, not the whole checkout (.venv, .git)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in _agent_files():
            if path.is_relative_to(root):
                tar.add(str(path), arcname=str(path.relative_to(root)))
    buf.seek(0)
    return buf


def build_debootstrap_base(client: docker.DockerClient, progress: Progress, tag: str = DEBOOTSTRAP_BASE) -> str:
    """The base from Debian's packages (debootstrap.py), imported through the SDK."""

    def importer(stream: IO[bytes], name: str) -> None:
        repository, _, version = name.partition(":")
        client.api.import_image_from_stream(stream, repository=repository, tag=version or "latest")

    return build_base(importer, progress, tag)


def _base_available(client: docker.DockerClient, base: str, progress: Progress) -> bool:
    if _has_image(client, base):
        return True
    progress(f"pulling {base}")
    try:
        client.images.pull(base)
        return True
    except docker.errors.DockerException as err:
        progress(f"cannot pull {base} ({str(err).splitlines()[0][:160]}); falling back to a debootstrap base")
        return False


def build_image(
    client: docker.DockerClient,
    base: str = DEFAULT_BASE,
    tag: str = DEFAULT_IMAGE,
    progress: Progress = print,
    rebuild_base: bool = False,
) -> str:
    """Build Dockerfile.sandbox on ``base``; ``base='debootstrap'``
    (or an unreachable base) makes one from Debian's packages."""
    if base == "debootstrap" or not _base_available(client, base, progress):
        if _has_image(client, DEBOOTSTRAP_BASE) and not rebuild_base:
            progress(f"reusing the debootstrap base {DEBOOTSTRAP_BASE}")
        else:
            build_debootstrap_base(client, progress)
        base = DEBOOTSTRAP_BASE
    started = time.monotonic()
    # Side by side: most of a build is the daemon committing and mounting layers (slow on fuse-overlayfs), little CPU.
    with ThreadPoolExecutor(max_workers=2) as pool:
        builds = [
            pool.submit(_build, client, ROOT, "Dockerfile.sandbox", tag, base, progress),
            pool.submit(_build, client, PROXY_DIR, "Dockerfile", PROXY_IMAGE, base, progress),
        ]
        for build in builds:
            build.result()
    progress(f"built {tag} and {PROXY_IMAGE} in {time.monotonic() - started:.1f}s")
    return tag


def _build(
    client: docker.DockerClient, context: Path, dockerfile: str, tag: str, base: str, progress: Progress
) -> None:
    progress(f"building {tag} from {(context / dockerfile).relative_to(ROOT)} on {base}")
    try:
        if image_commit.build(client, context, dockerfile, tag, base, {LABEL: "image", HASH_LABEL: agent_hash()}):
            return  # one container and one commit (image_commit.py); else the classic builder, a commit a step
    except docker.errors.DockerException as err:
        raise OpenAgentsError(ErrorType.SANDBOX_START_FAILED, f"image build failed: {err}") from None
    stream = client.api.build(
        fileobj=_context_tar(context),
        custom_context=True,
        dockerfile=dockerfile,
        tag=tag,
        buildargs={"BASE_IMAGE": base},
        labels={LABEL: "image", HASH_LABEL: agent_hash()},
        rm=True,
        forcerm=True,
        decode=True,
        # No step fetches anything: without a network the build does not depend on the daemon's bridge.
        network_mode="none",
    )
    for chunk in stream:
        if "error" in chunk:
            raise OpenAgentsError(ErrorType.SANDBOX_START_FAILED, f"image build failed: {chunk['error'].strip()}")
        text = chunk.get("stream", "").strip()
        if text.startswith("Step "):
            progress("  " + text)


def ensure_image(
    client: docker.DockerClient,
    tag: str = DEFAULT_IMAGE,
    progress: Progress = print,
    base: str | None = None,
    rebuild_base: bool = False,
) -> str:
    """Build the image if it is missing or was built from other agent code; with no `base` given,
    whichever base is already here (the ordinary one, else a debootstrap one)."""
    status = image_status(client, tag)
    if status == "current":
        progress(f"image {tag} is current")
        return tag
    progress(f"image {tag} is {status}; building it")
    if base is None:
        base = (
            DEFAULT_BASE
            if _has_image(client, DEFAULT_BASE) or not _has_image(client, DEBOOTSTRAP_BASE)
            else "debootstrap"
        )
    build_image(client, base=base, tag=tag, progress=progress, rebuild_base=rebuild_base)
    return tag
