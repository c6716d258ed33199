"""Issue 49's "every other host program the product starts", for the system's own programs: the
session CA's `openssl`, `runsc --version` on a runtime the daemon registered by name, the base
image's `debootstrap` and `tar`. Each is found in the system's directories, never on the user's
PATH (the workspace's .venv/bin first, as an activated venv makes it), and runs with an
environment of its own: a variable of the user's pointing into the workspace (OPENSSL_CONF, as a
direnv `.envrc` may export it) is not passed. The box's writes are made here; a real openssl,
a real shared object built with gcc."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def planted(ws: Path, name: str, canary: Path) -> Path:
    """What the box writes into the workspace's venv: `name`, which says so in `canary` if it ever runs."""
    folder = ws / ".venv" / "bin"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\necho {name} ran >> {canary}\nexit 1\n")
    path.chmod(0o755)
    return folder


@pytest.mark.skipif(
    shutil.which("gcc") is None or shutil.which("openssl", path=SYSTEM_PATH) is None, reason="needs gcc and openssl"
)
def test_the_session_cas_openssl_never_loads_a_config_the_box_wrote(tmp_path, monkeypatch):
    """OPENSSL_CONF names a file in the workspace (a direnv .envrc exports it): the
    box rewrites it to load a provider module it built there. Making the session CA
    never loads it (the module's constructor would write the canary on the host)."""
    from orchestrator.sandbox.egress_tls import SessionCA

    ws = tmp_path / "ws"
    ws.mkdir()
    canary = tmp_path / "canary"
    source = ws / "evil.c"
    source.write_text(
        f'#include <stdio.h>\n__attribute__((constructor)) static void ran(void) {{ FILE *f = fopen("{canary}", "a"); '
        'if (f) { fputs("provider ran\\n", f); fclose(f); } }\n'
    )
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(ws / "evil.so"), str(source)], check=True, capture_output=True, timeout=60
    )
    (ws / "openssl.cnf").write_text(
        f"openssl_conf = init\n[init]\nproviders = prov\n[prov]\nevil = evil_sect\ndefault = default_sect\n"
        f"[evil_sect]\nmodule = {ws / 'evil.so'}\nactivate = 1\n[default_sect]\nactivate = 1\n"
    )
    monkeypatch.setenv("OPENSSL_CONF", str(ws / "openssl.cnf"))
    monkeypatch.setenv("PATH", f"{planted(ws, 'openssl', canary)}:{SYSTEM_PATH}")
    ca = SessionCA(["api.example.com"])
    try:
        assert "api.example.com" in ca.leaves
    finally:
        ca.close()
    assert not canary.exists(), canary.read_text()


def test_a_runtime_registered_by_name_is_never_looked_up_on_the_users_path(tmp_path, monkeypatch):
    """The daemon registers runsc as `runsc` (a name, found on dockerd's PATH), oa-sandbox runs in the
    workspace: asking its version never runs the `runsc` the box planted there and first on the user's PATH."""
    from orchestrator.sandbox import runtimes

    canary = tmp_path / "canary"
    ws = tmp_path / "ws"
    monkeypatch.setenv("PATH", f"{planted(ws, 'runsc', canary)}:{SYSTEM_PATH}")
    (ws / "runsc").write_text(f"#!/bin/sh\necho runsc ran >> {canary}\n")
    (ws / "runsc").chmod(0o755)
    monkeypatch.chdir(ws)
    runtimes._version_of.cache_clear()
    version = runtimes.runsc_version("runsc")
    assert not canary.exists(), canary.read_text()
    system = shutil.which("runsc", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    assert (version is None) == (system is None)  # the system's runsc answers, when there is one


@pytest.mark.parametrize("builder", ["mmdebstrap", "debootstrap"])
def test_the_base_images_debootstrap_and_tar_come_from_the_system(tmp_path, monkeypatch, builder):
    """`oa-sandbox image build --base debootstrap` (run as root, often from a project with its venv
    active): mmdebstrap (or debootstrap, its fallback) and tar are the system's, by absolute path,
    and the builder (a Perl or shell script that runs many programs) gets the system's PATH."""
    from orchestrator.sandbox import debootstrap, image

    canary = tmp_path / "canary"
    folder = planted(tmp_path / "ws", builder, canary)
    planted(tmp_path / "ws", "tar", canary)
    monkeypatch.setenv("PATH", f"{folder}:{SYSTEM_PATH}:/usr/sbin:/sbin")
    if shutil.which(builder, path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin") is None:
        pytest.skip(f"no {builder} on this host")
    if builder == "debootstrap":
        monkeypatch.setattr(debootstrap, "MMDEBSTRAP", "mmdebstrap-absent-here")
    started: list[tuple[list[str], dict[str, str] | None]] = []

    class Stop(Exception):
        pass

    def popen(argv: list[str], **kwargs: object) -> None:
        started.append((list(argv), kwargs.get("env")))  # type: ignore[arg-type]
        raise Stop

    monkeypatch.setattr(debootstrap.subprocess, "Popen", popen)
    with pytest.raises(Stop):
        image.build_debootstrap_base(None, lambda line: None)
    ((argv, env),) = started
    assert os.path.isabs(argv[0]) and str(folder) not in argv[0] and os.path.basename(argv[0]) == builder
    assert env is not None and str(folder) not in env["PATH"]
    assert not canary.exists()
