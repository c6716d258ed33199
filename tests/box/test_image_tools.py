"""The image an agent can work in (issue 46): git (a SWE-bench submission's `git diff`), ps, rg, a
venv with pip, TLS roots, under runc and runsc; the base image's tag follows its package list, so a
base of another list is rebuilt, never reused; an image without python3 is IMAGE_MISSING, typed."""

from __future__ import annotations

import os
import subprocess

import pytest

from orchestrator import ErrorType, OpenAgentsError, Sandbox
from orchestrator.sandbox import image, packages
from tests.helpers import BOTH_RUNTIMES, make_workspace

pytestmark = pytest.mark.usefixtures("sandbox_image")


@pytest.mark.parametrize("runtime", BOTH_RUNTIMES, indirect=True)
def test_the_image_has_what_an_agent_works_with(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {"app.py": "print(1)\n"})
    with Sandbox(ws, runtime=runtime) as box:
        tools = box.shell(
            "git --version && ps -o pid= -p $$ && rg --version | head -1 && pip3 --version && "
            "test -s /etc/ssl/certs/ca-certificates.crt && echo certs",
            timeout=120,
        )
        assert (
            tools.exit_code == 0
            and "git version" in tools.output
            and "ripgrep" in tools.output
            and "certs" in tools.output
        )
        diff = box.shell(
            "git init -q . && git -c user.email=a@b -c user.name=a add -A && git -c user.email=a@b -c user.name=a "
            "commit -qm base && echo 'print(2)' > app.py && git diff",
            timeout=120,
        )
        assert diff.exit_code == 0 and "-print(1)" in diff.output and "+print(2)" in diff.output
        venv = box.shell("python3 -m venv /tmp/venv && /tmp/venv/bin/python -m pip --version", timeout=200)
        assert venv.exit_code == 0 and "/tmp/venv" in venv.output


def test_the_base_tag_and_the_image_hash_follow_the_package_list(monkeypatch):
    assert image.DEBOOTSTRAP_BASE.endswith(packages.packages_hash())
    assert packages.BASE_PACKAGES[0] == "python3"
    assert packages.packages_hash(packages.BASE_PACKAGES + ("curl",)) != packages.packages_hash()
    before = image.agent_hash()
    monkeypatch.setattr(image, "BASE_PACKAGES", packages.BASE_PACKAGES + ("curl",))
    assert image.agent_hash() != before


@pytest.mark.parametrize("runtime", BOTH_RUNTIMES, indirect=True)
def test_an_image_without_python3_is_image_missing(tmp_path, runtime, sandbox_image, docker_client):
    tag = f"oa-test-nopython:{os.getpid()}"
    (tmp_path / "Dockerfile").write_text(
        f"FROM {sandbox_image}\nUSER root\nRUN rm -f /usr/bin/python3* /usr/local/bin/python3*\nUSER 1000:1000\n"
    )
    subprocess.run(
        ["docker", "build", "--network", "none", "-q", "-t", tag, str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    try:
        with pytest.raises(OpenAgentsError) as err:
            Sandbox(make_workspace(tmp_path / "ws", {}), runtime=runtime, image=tag).open()
        assert err.value.type is ErrorType.IMAGE_MISSING and "python3" in err.value.message
    finally:
        docker_client.images.remove(tag, force=True)
