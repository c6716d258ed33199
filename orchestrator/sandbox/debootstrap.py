"""The image's base made from Debian's packages (mmdebstrap, else debootstrap; then `docker import`), for machines
where no registry is reachable. Standard library only (and errors, programs/system.py): scripts/setup
runs it with the system's python3 (`python3 -m orchestrator.sandbox.debootstrap`) while pip fills the
venv, so the two slow steps of a fresh machine's set-up run side by side; image.py uses the same
function with the Docker SDK.

What goes into the base is packages.py's list; what goes into the image on top of it is
Dockerfile.sandbox's."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Callable

from ..errors import ErrorType, OpenAgentsError
from ..programs import system
from .packages import BASE_PACKAGES, packages_hash

SUITE = "bookworm"
BASE_TAG = f"oa-sandbox-base:{SUITE}-{packages_hash()}"  # a base of another package list is another tag
PACKAGES = BASE_PACKAGES  # debootstrap --include (packages.py: what an agent works with in the box)
MMDEBSTRAP = "mmdebstrap"  # used when the system has it; debootstrap otherwise

Progress = Callable[[str], None]
Importer = Callable[[IO[bytes], str], None]  # (the root file system as a tar stream, the tag) -> imported


def debian_mirror() -> str:
    """The mirror apt already uses on this machine, so debootstrap needs no other network."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for source in sources:
        try:
            text = source.read_text()
        except OSError:
            continue
        for match in re.finditer(r"(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s+)?)(\S+/debian)/?\s", text):
            return match.group(1)
    return "http://deb.debian.org/debian"


def build_base(importer: Importer, progress: Progress, tag: str = BASE_TAG) -> str:
    """The root file system of packages.py's list, which `importer` takes as a tar stream under `tag`:
    mmdebstrap when the host has it (apt's parallel downloads, the tar written straight into the import,
    no temporary tree: about 30 s where debootstrap takes 2-3 minutes), else debootstrap."""
    # Both the system's (programs/system.py): this runs as root, often from a project whose venv is
    # active, and both (a shell script, a Perl one) run what their PATH finds.
    try:
        mmdebstrap = system.find(MMDEBSTRAP, "the debootstrap base")
    except OpenAgentsError:
        return _build_with_debootstrap(importer, progress, tag)
    return _build_with_mmdebstrap(mmdebstrap, importer, progress, tag)


def _build_with_mmdebstrap(mmdebstrap: str, importer: Importer, progress: Progress, tag: str) -> str:
    """`mmdebstrap --format=tar SUITE - MIRROR | import`: the same variant, packages and mirror as debootstrap's.
    The packages installed are debootstrap's but for apt's choice of `usrmerge` (and three small Perl
    libraries) where debootstrap takes `usr-is-merged`: the same merged /usr. It leaves out the downloaded
    .debs and apt's lists, which debootstrap keeps: 296 MB against 415 MB (measured 2026-12-07)."""
    mirror = debian_mirror()
    include = ",".join(PACKAGES)
    progress(f"mmdebstrap --variant=minbase --include={include} {SUITE} from {mirror}, imported as {tag}")
    started = time.monotonic()
    with tempfile.TemporaryFile() as log:  # its messages; a pipe could fill while the import reads stdout
        proc = subprocess.Popen(
            [mmdebstrap, "--variant=minbase", f"--include={include}", "--format=tar", SUITE, "-", mirror],
            stdout=subprocess.PIPE,
            stderr=log,
            env={**os.environ, "PATH": system.SYSTEM_DIRS},
        )
        assert proc.stdout is not None  # stdout=PIPE
        # mmdebstrap writes the tar only once every package is installed: until its first byte (or its
        # end) nothing is imported, so a failed run never leaves an empty image under the base's tag.
        select.select([proc.stdout], [], [])
        try:
            code = proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None
        if code is not None and code != 0:
            proc.stdout.close()
            raise _mmdebstrap_failed(log)
        try:
            importer(proc.stdout, tag)
        except BaseException:
            proc.kill()
            raise
        finally:
            proc.stdout.close()
            code = proc.wait()
        if code != 0:
            raise _mmdebstrap_failed(log)
    progress(f"mmdebstrap and the import done in {time.monotonic() - started:.0f}s")
    return tag


def _mmdebstrap_failed(log: IO[bytes]) -> OpenAgentsError:
    log.seek(0)
    tail = log.read().decode(errors="replace").splitlines()[-20:]
    return OpenAgentsError(ErrorType.SANDBOX_START_FAILED, "mmdebstrap failed:\n" + "\n".join(tail))


def _build_with_debootstrap(importer: Importer, progress: Progress, tag: str) -> str:
    """debootstrap into a temporary directory, then `importer` takes it as a tar stream under `tag`."""
    try:
        debootstrap, tar_program = (
            system.find("debootstrap", "the debootstrap base"),
            system.find("tar", "the debootstrap base"),
        )
    except OpenAgentsError as err:
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID,
            f"{err.message}: `sudo apt-get install mmdebstrap` (or debootstrap; Debian's packages)",
        ) from None
    mirror = debian_mirror()
    include = ",".join(PACKAGES)
    with tempfile.TemporaryDirectory(prefix="oa-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        progress(f"debootstrap --variant=minbase --include={include} {SUITE} from {mirror} (a few minutes)")
        started = time.monotonic()
        proc = subprocess.Popen(
            [debootstrap, "--variant=minbase", f"--include={include}", SUITE, str(rootfs), mirror],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PATH": system.SYSTEM_DIRS},
        )
        tail: list[str] = []
        assert proc.stdout is not None  # stdout=PIPE
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-20:]
            if line.startswith(
                (
                    "I: Retrieving",
                    "I: Base system",
                    "I: Installing core",
                    "I: Unpacking the base",
                    "I: Configuring the base",
                )
            ):
                progress("  " + line.strip())
        if proc.wait() != 0:
            raise OpenAgentsError(ErrorType.SANDBOX_START_FAILED, "debootstrap failed:\n" + "\n".join(tail))
        progress(f"debootstrap done in {time.monotonic() - started:.0f}s; importing as {tag}")
        tar = subprocess.Popen(
            [tar_program, "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE, env=system.environment()
        )
        assert tar.stdout is not None  # stdout=PIPE
        try:
            importer(tar.stdout, tag)
        finally:
            tar.stdout.close()
            tar.wait()
    return tag


def _docker_import(stream: IO[bytes], tag: str) -> None:
    """`docker import - TAG`: the command-line client, for the system's python3 that has no Docker SDK."""
    docker = system.find("docker", "importing the debootstrap base")
    done = subprocess.run(
        [docker, "import", "-", tag],
        stdin=stream,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=system.environment(HOME=os.environ.get("HOME", "/root")),
    )
    if done.returncode != 0:
        raise OpenAgentsError(
            ErrorType.SANDBOX_START_FAILED, f"docker import {tag} failed: {done.stderr.strip()[-500:]}"
        )


def _has_image(tag: str) -> bool:
    docker = system.find("docker", "looking for the debootstrap base")
    return (
        subprocess.run(
            [docker, "image", "inspect", tag],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=system.environment(HOME=os.environ.get("HOME", "/root")),
        ).returncode
        == 0
    )


def main(argv: list[str]) -> int:
    """`python3 -m orchestrator.sandbox.debootstrap [--rebuild]`: the base, unless it exists already."""

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        if "--rebuild" not in argv and _has_image(BASE_TAG):
            progress(f"reusing the debootstrap base {BASE_TAG}")
            return 0
        build_base(_docker_import, progress)
    except OpenAgentsError as err:
        progress(f"debootstrap base: {err.message}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
