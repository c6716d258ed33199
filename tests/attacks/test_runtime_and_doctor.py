"""The optional gVisor runtime, and the installation self-check users run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from orchestrator.cli.selfcheck import CHECKS
from orchestrator.config import DockerBackendConfig, SandboxConfig
from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.sandbox.docker import DockerSandbox

pytestmark = pytest.mark.docker


def test_under_runsc_the_box_talks_to_gvisors_kernel(open_sandbox, workspace, runtime):
    """Under runsc the same tools work and the box's kernel is gVisor's user-space one, not the host's
    (the runc case checks that the test can tell them apart)."""
    box = open_sandbox(workspace)
    host_kernel = subprocess.run(["uname", "-r"], capture_output=True, text=True, check=True).stdout.strip()
    box_kernel = box.call("shell", {"command": "uname -r"}).output.strip()
    assert (box_kernel != host_kernel) == (runtime == "runsc"), (box_kernel, host_kernel)
    assert box.runtime is not None and box.runtime.gvisor == (runtime == "runsc")


def test_an_unknown_runtime_is_a_typed_start_failure(sandbox_image, docker_client, workspace):
    """A runtime the daemon does not have fails before any container, with a typed, fatal error naming
    the runtimes it has, and leaves no container."""
    box = DockerSandbox(
        workspace, SandboxConfig(backend=DockerBackendConfig(runtime="oa-no-such-runtime")), client=docker_client
    )
    with pytest.raises(OpenAgentsError) as info:
        box.start()
    assert info.value.type == ErrorType.CONFIG_INVALID and not info.value.recoverable
    assert "oa-no-such-runtime" in info.value.message and "runc" in info.value.message
    assert box.container is None


def test_doctor_attack_passes_on_this_installation(sandbox_image):
    """`oa-sandbox doctor --attack` runs its quick battery here and every check passes."""
    exe = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
    proc = subprocess.run([exe, "doctor", "--attack"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(CHECKS)} passed, 0 failed" in proc.stdout and "FAIL" not in proc.stdout
