"""The Podman engine's own parts, without a box (issue 47): how the engine is chosen, how scripts/setup-podman's
gVisor wrappers are read back as Docker's runtimeArgs, the seccomp profile as a file. The box tier runs
under Podman as a whole with OA_ENGINE=podman (docs/podman.md)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from orchestrator.config import SandboxConfig
from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.sandbox import engine, podman
from orchestrator.sandbox.runtimes import OCI_SECCOMP, choose_runtime_from_info


def _wrapper(directory, name: str, line: str, mode: int = 0o755):
    path = directory / name
    path.write_text(f"#!/bin/sh\n# test\n{line}\n")
    os.chmod(path, mode)
    return str(path)


@pytest.fixture
def wrappers(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("a wrapper is read only when root owns it: the test must run as root to make one")
    monkeypatch.setattr(podman, "WRAPPER_DIR", str(tmp_path))
    return tmp_path


def test_a_setup_wrapper_reads_back_as_docker_runtime_args(wrappers):
    path = _wrapper(wrappers, "runsc", 'exec /usr/bin/runsc --network=none --oci-seccomp "$@"')
    info = podman.runtimes_as_docker({"Runtimes": {"runsc": {"path": path}, "runc": {"path": "/usr/bin/runc"}}})
    assert info["Runtimes"]["runsc"] == {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", OCI_SECCOMP]}
    assert info["Runtimes"]["runc"] == {"path": "/usr/bin/runc"}
    chosen = choose_runtime_from_info(None, False, info, version_of=lambda path: 20240729)
    assert chosen.name == "runsc" and chosen.gvisor


def test_a_wrapper_without_oci_seccomp_is_not_used_and_refused_when_asked_for(wrappers):
    path = _wrapper(wrappers, "runsc", 'exec /usr/bin/runsc --network=none "$@"')
    info = podman.runtimes_as_docker({"Runtimes": {"runsc": {"path": path}}})
    assert choose_runtime_from_info(None, False, info, version_of=lambda path: 20240729).name == "runc"
    with pytest.raises(OpenAgentsError) as err:
        choose_runtime_from_info("runsc", False, info, version_of=lambda path: 20240729)
    assert err.value.type is ErrorType.CONFIG_INVALID and OCI_SECCOMP in err.value.message


def test_a_wrapper_others_can_write_or_outside_the_directory_is_not_read(wrappers, tmp_path_factory):
    writable = _wrapper(wrappers, "runsc", 'exec /usr/bin/runsc --oci-seccomp "$@"', mode=0o777)
    os.chmod(writable, 0o777)
    assert stat.S_IMODE(os.stat(writable).st_mode) & 0o022
    assert podman.wrapper_args(writable) is None
    elsewhere = _wrapper(tmp_path_factory.mktemp("other"), "runsc", 'exec /usr/bin/runsc --oci-seccomp "$@"')
    assert podman.wrapper_args(elsewhere) is None
    assert podman.wrapper_args(str(wrappers / "absent")) is None


def test_the_seccomp_profile_becomes_a_file_named_by_its_content(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    from orchestrator.sandbox.runtimes import seccomp_security_opt

    profile = seccomp_security_opt("runc").split("=", 1)[1]
    first = podman.seccomp_file(profile)
    assert podman.seccomp_file(profile) == first and json.loads(first.read_text()) == json.loads(profile)
    assert not (os.stat(first).st_mode & 0o022)


def test_the_engine_is_a_config_key_and_an_unknown_one_is_refused(monkeypatch):
    assert SandboxConfig(engine="podman").backend.engine == "podman"
    assert SandboxConfig().backend.engine is None
    with pytest.raises(ValueError):
        SandboxConfig(engine="lxc")
    monkeypatch.setenv("OA_ENGINE", "lxc")
    with pytest.raises(OpenAgentsError) as err:
        engine.wanted_engine(None)
    assert err.value.type is ErrorType.CONFIG_INVALID and "docker or podman" in err.value.message
    monkeypatch.setenv("OA_ENGINE", "podman")
    assert engine.wanted_engine(None) == "podman" and engine.wanted_engine("docker") == "docker"


def test_docker_host_named_and_silent_is_said_not_replaced_by_podman(tmp_path, monkeypatch):
    """With DOCKER_HOST set, the user means that daemon: its silence is the error, even with Podman installed."""
    monkeypatch.delenv("OA_ENGINE", raising=False)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")
    with pytest.raises(OpenAgentsError) as err:
        engine.docker_client(timeout=5)
    assert err.value.type is ErrorType.DOCKER_UNAVAILABLE and "Docker daemon" in err.value.message


def test_the_service_limits_are_read_from_the_process_behind_the_socket(tmp_path):
    """SO_PEERCRED names the serving process; its hard limits are what a box may have."""
    import resource
    import socket
    import threading

    path = tmp_path / "s.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    accepted = threading.Thread(target=lambda: server.accept()[0].close(), daemon=True)
    accepted.start()
    try:
        limits = podman.service_limits(path)
    finally:
        accepted.join(5)
        server.close()
    assert limits["nofile"] == resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    names = {u["Name"]: u["Hard"] for u in podman.host_limits(path, processes=77)}
    assert names["nproc"] == 77 and names["nofile"] == min(limits["nofile"], 1048576)


def test_a_gvisor_box_under_podman_runs_gvisors_kernel_and_a_runc_box_the_hosts(tmp_path):
    """Podman's compatible API ignores HostConfig.Runtime: without the runtime's own service every box
    ran under runc while the session said gVisor. The box's kernel says which one it got."""
    import platform

    from orchestrator.sandbox.docker import DockerSandbox
    from orchestrator.sandbox.runtimes import choose_runtime
    from tests.helpers import make_workspace

    if podman.podman_binary() is None:
        pytest.skip("Podman is not installed (scripts/setup-podman)")
    client = engine.docker_client(timeout=120, engine="podman")
    try:
        choose_runtime("runsc", False, client)
    except OpenAgentsError as err:
        pytest.skip(f"no usable gVisor registration for Podman: {err.message}")
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a"})
    os.chown(ws, 1000, 1000)
    kernels = {}
    for runtime in ("runc", "runsc"):
        with DockerSandbox(ws, SandboxConfig(engine="podman", runtime=runtime), client=client) as box:
            kernels[runtime] = box.call("shell", {"command": "uname -r"}).output.strip()
    client.close()
    assert kernels["runc"] == platform.release() and kernels["runsc"] != platform.release(), kernels


def test_a_lost_engine_is_named_in_its_error(tmp_path):
    """A ping that meets nobody says which engine is gone (the typed kind stays docker_unavailable):
    Podman's API service, not a Docker daemon the user may not have."""
    import docker

    from orchestrator.sandbox.daemon import ping

    nobody = f"unix://{tmp_path}/none.sock"
    for client, named in (
        (podman.PodmanClient(base_url=nobody, version="1.41", timeout=2), "the Podman service is gone"),
        (docker.DockerClient(base_url=nobody, version="1.41", timeout=2), "the Docker daemon is gone"),
    ):
        problem = ping(client, timeout=2)
        assert problem is not None and problem.type is ErrorType.DOCKER_UNAVAILABLE, problem
        assert problem.message.startswith(named), problem.message
        client.close()
