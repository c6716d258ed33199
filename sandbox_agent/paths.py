"""Workspace confinement, shared by the agent (inside the box) and the host (as a lexical pre-check).

Standard library only: this module is copied into the sandbox image and also imported by the
host, so the lexical rules exist exactly once.
"""

from __future__ import annotations

import os

# Overridable only so the agent's unit tests can run on the host without a container.
WORKSPACE = os.environ.get("OA_AGENT_WORKSPACE", "/workspace")
GIT_DIR = ".git"


class PathRefused(Exception):
    """A path the contract forbids; ``kind`` is the wire error type."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def check_lexical(path: object, *, mutation: bool = False) -> str:
    """Refuse what can be refused without touching the disk; return the normalised relative path.

    Runs on the host before anything reaches the box and again in the agent, so each layer
    holds alone.
    """
    if not isinstance(path, str):
        raise PathRefused("invalid_arguments", "path must be a string")
    if "\x00" in path:
        raise PathRefused("path_invalid", "path contains a NUL byte")
    if path.startswith("/") or path.startswith("~"):
        raise PathRefused(
            "path_outside_workspace", f"absolute paths are refused: {path!r}; use a path relative to the workspace"
        )
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise PathRefused("path_outside_workspace", f"'..' is refused in paths: {path!r}")
    if mutation and any(p.casefold() == GIT_DIR for p in parts):
        raise PathRefused("path_in_git_dir", f"changes under .git are refused: {path!r}")
    return "/".join(parts) or "."


def _inside(real: str, root: str) -> bool:
    return real == root or real.startswith(root.rstrip("/") + "/")


def resolve(path: object, *, mutation: bool = False, root: str = WORKSPACE) -> str:
    """Lexical check, then realpath: a symlink that leads out of the workspace is refused."""
    rel = check_lexical(path, mutation=mutation)
    full = os.path.join(root, rel) if rel != "." else root
    real = os.path.realpath(full)
    if not _inside(real, root):
        raise PathRefused("path_outside_workspace", f"{rel!r} resolves outside the workspace")
    if mutation:
        rel_real = os.path.relpath(real, root)
        if any(p.casefold() == GIT_DIR for p in rel_real.split("/")):
            raise PathRefused("path_in_git_dir", f"{rel!r} resolves under .git; changes there are refused")
    return real


_proc_fd: int | None = None


def _fd_dir() -> int:
    """/proc/self/fd opened once: each later readlink is relative to it, never a walk from '/'."""
    global _proc_fd
    if _proc_fd is None:
        _proc_fd = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    return _proc_fd


def local(real: str, root: str = WORKSPACE) -> str:
    """A resolved path made relative to the agent's working directory (the workspace).

    Lookups that start at '/' cross the container's root filesystem, which under Docker's
    fuse-overlayfs driver costs about 90 µs per call; lookups relative to the cwd do not.
    """
    if os.getcwd() != root:
        return real
    return os.path.relpath(real, root)


def check_fd(fd: int, *, mutation: bool = False, root: str = WORKSPACE) -> None:
    """Re-check an opened file through /proc: defeats a symlink swapped in after ``resolve``."""
    try:
        real = os.readlink(str(fd), dir_fd=_fd_dir())
    except OSError:
        return  # no /proc (host-side unit tests): the realpath check already ran
    if not _inside(real, root):
        raise PathRefused("path_outside_workspace", "the path was swapped to point outside the workspace")
    if mutation and any(p.casefold() == GIT_DIR for p in os.path.relpath(real, root).split("/")):
        raise PathRefused("path_in_git_dir", "the path was swapped to point under .git")
