"""Shared fixtures: a real Docker daemon, the real sandbox image, real workspaces on disk.

No test here mocks Docker or the agent. A missing daemon is an error, never a skip.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

SANDBOX_UID = 1000


def chown_tree(root: Path, uid: int = SANDBOX_UID) -> None:
    """Workspaces belong to an unprivileged user, as on a developer's machine."""
    if os.geteuid() != 0:
        return
    for dirpath, dirnames, filenames in os.walk(root):
        os.lchown(dirpath, uid, uid)
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, uid)


def make_workspace(root: Path, files: dict[str, str | bytes] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in (files or {}).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    chown_tree(root)
    return root


def live_processes(box) -> list[str]:
    """'PID comm' of every process in the box, less the listing's own sh and cat."""
    out = box.call("shell", {"command": "for p in /proc/[0-9]*; do echo \"${p#/proc/} $(cat $p/comm 2>/dev/null)\"; done"}).output
    return [line for line in out.splitlines() if line.split()[-1:] not in (["sh"], ["cat"])]


@pytest.fixture(scope="session")
def docker_client():
    from orchestrator.sandbox.docker import docker_client as connect

    return connect()


@pytest.fixture(scope="session")
def sandbox_image(docker_client):
    from orchestrator.sandbox.image import ensure_image

    return ensure_image(docker_client)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = make_workspace(tmp_path / "ws")
    yield ws
    shutil.rmtree(ws, ignore_errors=True)


@pytest.fixture
def sandbox(sandbox_image, docker_client, workspace):
    from orchestrator.sandbox.docker import DockerSandbox

    with DockerSandbox(workspace, client=docker_client) as box:
        yield box


@pytest.fixture
def open_sandbox(sandbox_image, docker_client):
    """A factory for sandboxes on workspaces the test builds itself; all are removed afterwards."""
    from orchestrator.config import SandboxConfig
    from orchestrator.sandbox.docker import DockerSandbox

    boxes = []

    def _open(ws: Path, **config) -> DockerSandbox:
        box = DockerSandbox(ws, SandboxConfig(**config), client=docker_client)
        box.start()
        boxes.append(box)
        return box

    yield _open
    for box in boxes:
        box.close()
