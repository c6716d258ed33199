"""The one-commit image build (orchestrator/sandbox/image_commit.py) reads the project's own
Dockerfiles as they are, and leaves to the classic builder any Dockerfile it does not fully
understand: a wrong image is worse than a slow build."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from orchestrator.sandbox import image_commit
from orchestrator.sandbox.image import PROXY_DIR, ROOT


def test_the_sandbox_dockerfile_is_one_copy_one_run_and_its_metadata():
    steps = image_commit.plan((ROOT / "Dockerfile.sandbox").read_text())
    assert steps is not None
    assert steps.copies == [("sandbox_agent", "/opt/openagents/sandbox_agent")]
    (run,) = steps.runs
    assert "compileall" in run and "useradd --uid 1000" in run and "\\" not in run
    assert steps.changes == [
        "ENV HOME=/tmp LANG=C.UTF-8",
        "WORKDIR /workspace",
        "USER 1000:1000",
        'ENTRYPOINT ["python3", "-I", "-S", "/opt/openagents/sandbox_agent/__main__.py"]',
    ]


def test_the_proxy_dockerfile_is_two_copies_and_its_metadata():
    steps = image_commit.plan((PROXY_DIR / "Dockerfile").read_text())
    assert steps is not None and steps.runs == []
    assert steps.copies == [
        ("egress_proxy.py", "/opt/openagents/egress_proxy.py"),
        ("egress_gate/", "/opt/openagents/egress_gate/"),
    ]
    assert steps.changes[:2] == ["USER 65534:65534", "EXPOSE 3128"] and steps.changes[2].startswith("ENTRYPOINT ")


def test_what_it_does_not_understand_goes_to_the_classic_builder():
    base = "ARG BASE_IMAGE=x\nFROM ${BASE_IMAGE}\n"
    entry = 'ENTRYPOINT ["true"]\n'
    assert image_commit.plan(base + "COPY a /a\n" + entry) is not None
    for body in (
        "RUN true\nCOPY a /a\n",  # a COPY after a RUN: the order would change
        "ENV A=1\nRUN true\n",
        "USER 1\nRUN true\n",
        "WORKDIR /w\nRUN true\n",  # they would apply to the RUN
        'CMD ["x"]\n',
        "ADD a /a\n",
        "COPY --chown=1 a /a\n",
        "COPY a b /c/\n",
        'RUN ["true"]\n',
        "FROM other\n",
        "HEALTHCHECK NONE\n",
        "VOLUME /v\n",
    ):
        assert image_commit.plan(base + body + entry) is None, body
    assert image_commit.plan(base + "COPY a /a\n") is None  # no ENTRYPOINT: the build container's would stay
    assert image_commit.plan("COPY a /a\n" + entry) is None  # no FROM


def test_the_copies_are_owned_by_root_under_their_destination(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("x = 1\n")
    (tmp_path / "tool.py").write_text("y = 2\n")
    data = image_commit._context_tar(tmp_path, [("pkg", "/opt/oa/pkg"), ("tool.py", "/opt/oa/tool.py")])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert {"opt", "opt/oa", "opt/oa/pkg", "opt/oa/pkg/m.py", "opt/oa/tool.py"} <= set(members)
    assert all(m.uid == 0 and m.gid == 0 for m in members.values())


def test_a_copy_from_outside_the_context_is_refused(tmp_path):
    from orchestrator.errors import OpenAgentsError

    (tmp_path / "ctx").mkdir()
    (tmp_path / "secret").write_text("s")
    with pytest.raises(OpenAgentsError):
        image_commit._context_tar(tmp_path / "ctx", [("../secret", "/x")])
    assert Path(tmp_path / "secret").exists()
