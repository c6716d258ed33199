"""The image's base (orchestrator/sandbox/debootstrap.py): mmdebstrap when the system has it, its
tar streamed straight into the import; debootstrap when it has not. The builders here are real
programs (shell scripts at absolute paths, which system.find keeps as they are) and the importer
is a real function that reads the stream; no Docker is needed."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path
from typing import IO

import pytest

from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.sandbox import debootstrap
from orchestrator.sandbox.packages import BASE_PACKAGES


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def small_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"bookworm\n"
        info = tarfile.TarInfo("etc/debian_version")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class Importer:
    def __init__(self) -> None:
        self.calls: list[tuple[bytes, str]] = []

    def __call__(self, stream: IO[bytes], tag: str) -> None:
        self.calls.append((stream.read(), tag))


def test_mmdebstrap_streams_its_tar_into_the_import_with_debootstraps_arguments(tmp_path, monkeypatch):
    """The same variant, package list, suite and mirror as debootstrap's; the tar on its stdout is what is imported."""
    (tmp_path / "rootfs.tar").write_bytes(small_tar())
    builder = script(
        tmp_path / "mmdebstrap", f'echo "$@" > {tmp_path}/argv\necho working >&2\ncat {tmp_path}/rootfs.tar\n'
    )
    monkeypatch.setattr(debootstrap, "MMDEBSTRAP", str(builder))
    importer = Importer()
    assert debootstrap.build_base(importer, lambda line: None, tag="oa-test-base:x") == "oa-test-base:x"
    ((data, tag),) = importer.calls
    assert tag == "oa-test-base:x" and data == small_tar()
    argv = (tmp_path / "argv").read_text().split()
    assert argv[:2] == ["--variant=minbase", f"--include={','.join(BASE_PACKAGES)}"]
    assert argv[2:5] == ["--format=tar", debootstrap.SUITE, "-"] and argv[5] == debootstrap.debian_mirror()


def test_a_failed_mmdebstrap_imports_nothing_and_says_why(tmp_path, monkeypatch):
    """No empty image under the base's tag (the next set-up would
    reuse it): a typed error with mmdebstrap's last words."""
    builder = script(tmp_path / "mmdebstrap", "echo 'E: cannot reach the mirror' >&2\nexit 1\n")
    monkeypatch.setattr(debootstrap, "MMDEBSTRAP", str(builder))
    importer = Importer()
    with pytest.raises(OpenAgentsError) as err:
        debootstrap.build_base(importer, lambda line: None, tag="oa-test-base:x")
    assert err.value.type is ErrorType.SANDBOX_START_FAILED and "cannot reach the mirror" in err.value.message
    assert importer.calls == []


def test_a_missing_mmdebstrap_falls_back_to_debootstrap(tmp_path, monkeypatch):
    """A host without mmdebstrap builds with debootstrap (the system's), into a directory, then tar into the import."""
    if shutil.which("debootstrap", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin") is None:
        pytest.skip("no debootstrap on this host")
    monkeypatch.setattr(debootstrap, "MMDEBSTRAP", str(tmp_path / "no-such-mmdebstrap"))
    started: list[list[str]] = []

    class Stop(Exception):
        pass

    def popen(argv: list[str], **kwargs: object) -> None:
        started.append(list(argv))
        raise Stop  # the real debootstrap would download a system; its arguments are what this test checks

    monkeypatch.setattr(debootstrap.subprocess, "Popen", popen)
    lines: list[str] = []
    with pytest.raises(Stop):
        debootstrap.build_base(Importer(), lines.append, tag="oa-test-base:x")
    (argv,) = started
    assert os.path.basename(argv[0]) == "debootstrap" and argv[1:3] == [
        "--variant=minbase",
        f"--include={','.join(BASE_PACKAGES)}",
    ]
    assert any(line.startswith("debootstrap ") for line in lines)
