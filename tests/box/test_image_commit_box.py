"""The tests of tests/unit/test_image_commit.py that need a real box (issue 48: one tier per folder);
what they are about is said there."""

from __future__ import annotations

import pytest

from orchestrator.sandbox import image_commit
from orchestrator.sandbox.image import ROOT


@pytest.mark.docker
def test_built_in_one_commit_the_image_has_the_classic_builds_config_and_files():
    """Dockerfile.sandbox built on the base the image was built on here (the debootstrap base, else
    python:3.12-slim), under a tag of its own; the sandbox image itself (USER 1000) is not a base it takes."""
    import docker

    from orchestrator.config import DEFAULT_IMAGE, LABEL
    from orchestrator.sandbox.debootstrap import BASE_TAG

    client = docker.from_env()
    bases = [b for b in (BASE_TAG, "python:3.12-slim") if client.images.list(name=b)]
    if not bases:
        pytest.skip("neither the debootstrap base nor python:3.12-slim is here")
    tag = "oa-test-image-commit:probe"
    assert not image_commit.build(
        client, ROOT, "Dockerfile.sandbox", tag, DEFAULT_IMAGE, {}
    )  # its RUN would run as root there
    try:
        assert image_commit.build(
            client, ROOT, "Dockerfile.sandbox", tag, bases[0], {LABEL: "image", "dev.openagents.test": "1"}
        )
        config = client.images.get(tag).attrs["Config"]
        assert config["User"] == "1000:1000" and config["WorkingDir"] == "/workspace"
        assert (
            config["Entrypoint"] == ["python3", "-I", "-S", "/opt/openagents/sandbox_agent/__main__.py"]
            and not config["Cmd"]
        )
        assert "HOME=/tmp" in config["Env"] and any(e.startswith("PATH=") for e in config["Env"])
        assert config["Labels"][LABEL] == "image" and config["Labels"]["dev.openagents.test"] == "1"
        out = client.containers.run(
            tag,
            entrypoint=["sh", "-c"],
            remove=True,
            network_disabled=True,
            command=[
                "id -u; stat -c '%u %a' /opt/openagents/sandbox_agent/__main__.py; "
                "ls /opt/openagents/sandbox_agent/__pycache__ | grep -c pyc"
            ],
        )
        uid, owner_mode, pycs = out.decode().split("\n")[:3]
        assert uid == "1000" and owner_mode == "0 644" and int(pycs) > 5
    finally:
        try:
            client.images.remove(tag, force=True)
        except docker.errors.ImageNotFound:
            pass
