"""What the sandbox image holds besides the agent: Debian's packages of the debootstrap base, in one
place. An agent works in the box as a developer does (issue 46): `git diff` for a SWE-bench
submission, `ps`, `rg`, a venv and pip for a project's own dependencies, TLS roots for an egress
that is allowed. The base image's tag is derived from this list (debootstrap.py, BASE_TAG), so a
base made from another list is never reused: changing the list rebuilds the base. Standard library
only: scripts/setup builds the base with the system's python3 (debootstrap.py)."""

from __future__ import annotations

import hashlib

# Debian bookworm's names; python3 first: the agent is stdlib-only Python, the one thing every image needs.
BASE_PACKAGES: tuple[str, ...] = (
    "python3",
    "git",
    "procps",
    "ripgrep",
    "python3-venv",
    "python3-pip",
    "ca-certificates",
)


def packages_hash(packages: tuple[str, ...] = BASE_PACKAGES) -> str:
    """A short hash of the list: part of the base image's tag and of the image's agent hash."""
    return hashlib.sha256("\n".join(packages).encode()).hexdigest()[:10]
