"""Choosing the OCI runtime: gVisor when the daemon offers a registration that keeps our guarantees.

The choice is a pure function of `docker info`, tested with plain dicts shaped like the daemon's
answer; the last tests ask the real daemon and run a real box under what it chose.
"""

from __future__ import annotations

import subprocess

import pytest

from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.sandbox.runtimes import (
    RUNC,
    RUNSC,
    RUNSC_EGRESS,
    available_runtimes,
    choose_runtime,
    choose_runtime_from_info,
)

SETUP_RUNTIMES = {  # what scripts/setup registers, as `docker info` reports it
    "runc": {"path": "runc"},
    "runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--oci-seccomp"]},
    "runsc-net": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=host", "--oci-seccomp"]},
}
WITH_GVISOR = {"Runtimes": SETUP_RUNTIMES}
PLAIN = {"Runtimes": {"runc": {"path": "runc"}, "io.containerd.runc.v2": {"path": "runc"}}}
# gVisor's own `runsc install` registers it with no arguments: our seccomp profile would be ignored.
RUNSC_WITHOUT_OCI_SECCOMP = {
    "Runtimes": {"runc": {"path": "runc"}, "runsc": {"path": "/usr/bin/runsc"}, "runsc-net": {"path": "/usr/bin/runsc"}}
}


class FakeClient:
    def __init__(self, info: dict) -> None:
        self._info = info

    def info(self) -> dict:
        return self._info


def good_version(path: str) -> int:
    return 20240729


def choose(requested, egress, client, version_of=good_version):
    """choose_runtime over a fake daemon, with a runsc that says a version (no binary is run)."""
    return choose_runtime(requested, egress, client, version_of)


def test_default_is_gvisor_when_the_daemon_has_it():
    choice = choose(None, False, FakeClient(WITH_GVISOR))
    assert choice.name == RUNSC and choice.gvisor
    assert "gVisor (runsc) registered with the engine: a second kernel between the box and the host" in choice.why


def test_an_egress_box_gets_the_registration_with_a_network():
    assert choose(None, True, FakeClient(WITH_GVISOR)).name == RUNSC_EGRESS
    assert choose("runsc", True, FakeClient(WITH_GVISOR)).name == RUNSC_EGRESS
    assert choose("runsc-net", False, FakeClient(WITH_GVISOR)).name == RUNSC


def test_default_is_runc_without_runsc_and_says_how_to_get_it():
    choice = choose(None, False, FakeClient(PLAIN))
    assert choice.name == RUNC and not choice.gvisor
    assert "runsc is not registered" in choice.why and "scripts/setup" in choice.why


def test_egress_default_falls_back_to_runc_when_only_the_plain_registration_exists():
    only_runsc = {"Runtimes": {k: v for k, v in SETUP_RUNTIMES.items() if k != "runsc-net"}}
    assert choose(None, False, FakeClient(only_runsc)).name == RUNSC
    choice = choose(None, True, FakeClient(only_runsc))
    assert choice.name == RUNC and "runsc-net is not registered" in choice.why
    with pytest.raises(OpenAgentsError) as err:
        choose("runsc", True, FakeClient(only_runsc))
    assert err.value.type is ErrorType.CONFIG_INVALID and "runsc-net" in str(err.value)


def test_runc_opts_out_even_when_gvisor_is_there():
    choice = choose("runc", False, FakeClient(WITH_GVISOR))
    assert choice.name == RUNC and "--runtime runc" in choice.why
    assert choose("runc", True, FakeClient(WITH_GVISOR)).name == RUNC


def test_runc_by_name_does_not_ask_the_daemon_and_gvisor_asks_it_each_time():
    """`docker info` costs a box's start ~6 ms: runc asked for by name needs none; a gVisor choice asks
    every time, so a registration changed meanwhile (here: --oci-seccomp removed) is refused at once."""

    class Counting(FakeClient):
        asked = 0

        def info(self) -> dict:
            self.asked += 1
            return super().info()

    client = Counting(WITH_GVISOR)
    assert choose("runc", False, client).name == RUNC and client.asked == 0
    assert choose("runsc", False, client).name == RUNSC and client.asked == 1
    client._info = {
        "Runtimes": {**SETUP_RUNTIMES, "runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none"]}}
    }
    with pytest.raises(OpenAgentsError) as err:
        choose("runsc", False, client)
    assert client.asked == 2 and "--oci-seccomp" in str(err.value)


@pytest.mark.parametrize("info", [PLAIN, {}, {"Runtimes": None}])
def test_asking_for_runsc_the_daemon_lacks_is_a_typed_fatal_error(info):
    with pytest.raises(OpenAgentsError) as err:
        choose("runsc", False, FakeClient(info))
    assert err.value.type is ErrorType.CONFIG_INVALID and not err.value.type.recoverable
    assert "scripts/setup" in str(err.value) and "--runtime runc" in str(err.value)


def test_an_unknown_runtime_is_a_typed_error_naming_what_the_daemon_has():
    with pytest.raises(OpenAgentsError) as err:
        choose("kata", False, FakeClient(WITH_GVISOR))
    assert err.value.type is ErrorType.CONFIG_INVALID
    assert "kata" in str(err.value) and "runsc-net" in str(err.value)


def test_another_registered_runtime_is_passed_through():
    info = {"Runtimes": {**SETUP_RUNTIMES, "kata": {"path": "/usr/bin/kata-runtime"}}}
    assert choose_runtime_from_info("kata", False, info, good_version).name == "kata"


def test_runsc_registered_without_oci_seccomp_is_not_used_since_our_profile_would_not_hold():
    choice = choose(None, False, FakeClient(RUNSC_WITHOUT_OCI_SECCOMP))
    assert choice.name == RUNC and "--oci-seccomp" in choice.why and "setuid" in choice.why
    with pytest.raises(OpenAgentsError) as err:
        choose("runsc", False, FakeClient(RUNSC_WITHOUT_OCI_SECCOMP))
    assert err.value.type is ErrorType.CONFIG_INVALID and "--oci-seccomp" in str(err.value)


@pytest.mark.parametrize("version", [20221219, None])
def test_an_old_or_silent_runsc_is_not_used_by_default_and_refused_when_asked_for(version):
    """bookworm's runsc 20221219 refuses statx(AT_NO_AUTOMOUNT): ls and stat fail on every path."""
    choice = choose(None, False, FakeClient(WITH_GVISOR), version_of=lambda path: version)
    assert choice.name == RUNC and ("20240729" in choice.why if version else "version" in choice.why)
    with pytest.raises(OpenAgentsError) as err:
        choose("runsc", False, FakeClient(WITH_GVISOR), version_of=lambda path: version)
    assert err.value.type is ErrorType.CONFIG_INVALID


def test_the_version_probe_reads_the_registered_binary(tmp_path):
    from orchestrator.sandbox.runtimes import runsc_version

    fake = tmp_path / "runsc"
    fake.write_text("#!/bin/sh\necho 'runsc version 0.0~20240729.0'\necho 'spec: 1.0.2-dev'\n")
    fake.chmod(0o755)
    assert runsc_version(str(fake)) == 20240729
    assert runsc_version(str(tmp_path / "missing")) is None


def test_runsc_is_used_with_directfs_on_or_off():
    """directfs is safe with the sandbox's mounts (no read-only bind mount of a directory: mounts.py), so a
    registration is usable either way; tests/attacks/test_workspace_integrity.py shows the .git files keep
    their bytes under the registration this machine has."""
    for extra in ([], ["--directfs=false"], ["--directfs=true"]):
        info = {
            "Runtimes": {
                "runc": {"path": "runc"},
                "runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--oci-seccomp", *extra]},
            }
        }
        assert choose(None, False, FakeClient(info)).name == RUNSC, extra


def test_available_runtimes_lists_the_daemons_and_always_runc():
    assert available_runtimes(FakeClient(WITH_GVISOR)) == {"runc", "runsc", "runsc-net"}
    assert available_runtimes(FakeClient({})) == {"runc"}


# --- the real daemon -------------------------------------------------------------------------


def test_a_gvisor_box_gets_the_profile_with_clone3_left_to_gvisor_and_a_runc_box_the_plain_one(tmp_path):
    """Under runsc --oci-seccomp every refusal is EPERM, and glibc starts threads only after clone3's
    ENOSYS: the gVisor box's profile lets clone3 through; everything else in it is the same."""
    import json

    from orchestrator.config import DockerBackendConfig, SandboxConfig
    from orchestrator.sandbox.docker import container_settings
    from orchestrator.sandbox.runtimes import seccomp_security_opt
    from orchestrator.sandbox.seccomp import security_opt

    def profile(runtime):
        opts = container_settings(SandboxConfig(backend=DockerBackendConfig(runtime=runtime)), tmp_path, "1000:1000")[
            "security_opt"
        ]
        assert "no-new-privileges" in opts
        return json.loads(next(o for o in opts if o.startswith("seccomp="))[len("seccomp=") :])

    plain, gvisor = profile("runc"), profile("runsc")
    assert security_opt() == seccomp_security_opt("runc") and seccomp_security_opt("runsc-net") == seccomp_security_opt(
        "runsc"
    )
    allowed = lambda p: {n for r in p["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" for n in r["names"]}  # noqa: E731
    refused = lambda p: {n for r in p["syscalls"] if r["action"] != "SCMP_ACT_ALLOW" for n in r["names"]}  # noqa: E731
    assert "clone3" in refused(plain) and "clone3" not in refused(gvisor) and "clone3" in allowed(gvisor)
    assert refused(plain) - {"clone3"} == refused(gvisor), (
        "the gVisor profile must refuse everything else the plain one refuses"
    )


def test_setup_probes_a_missing_runsc_without_ending_the_set_up(tmp_path):
    """scripts/setup runs under `set -euo pipefail`: its runsc version probe must print nothing and
    succeed on a fresh machine without runsc, so that the set-up goes on to install it (a failing
    probe once ended the set-up silently, before gVisor was installed)."""
    import shutil
    from pathlib import Path

    setup = Path(__file__).resolve().parents[2] / "scripts" / "setup"
    probe = next(line for line in setup.read_text().splitlines() if line.startswith("runsc_version()"))
    for tool in ("sed", "head"):  # what the probe needs besides runsc, which this PATH lacks
        (tmp_path / tool).symlink_to(shutil.which(tool))
    script = f'set -euo pipefail\n{probe}\nhave="$(runsc_version)"\necho "probe:[$have]"\n'
    done = subprocess.run(
        ["/bin/bash", "-c", script], env={"PATH": str(tmp_path)}, capture_output=True, text=True, timeout=10
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "probe:[]\n"


def test_a_candidate_registration_named_runsc_dash_something_is_gvisor_and_gets_its_seccomp_profile():
    # bench/platforms.py measures candidates such as runsc-ptrace: without gVisor's profile no thread starts there
    from orchestrator.sandbox.runtimes import is_gvisor, seccomp_security_opt

    assert is_gvisor("runsc-ptrace") and is_gvisor("runsc") and is_gvisor("runsc-net")
    assert not is_gvisor("runc") and not is_gvisor(None) and not is_gvisor("runscx")
    assert seccomp_security_opt("runsc-ptrace") == seccomp_security_opt("runsc") != seccomp_security_opt("runc")
    info = {
        "Runtimes": {**SETUP_RUNTIMES, "runsc-ptrace": {"path": "/usr/bin/runsc", "runtimeArgs": ["--platform=ptrace"]}}
    }
    assert choose_runtime_from_info("runsc-ptrace", False, info).gvisor


def test_doctor_names_the_platform_directfs_and_overlay_of_the_registration():
    from orchestrator.sandbox.runtimes import gvisor_settings

    text = gvisor_settings(WITH_GVISOR, RUNSC)
    assert (
        "platform systrap" in text
        and "directfs on" in text
        and "read-only volumes" in text
        and "root overlay root:self" in text
    )
    off = {"Runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--oci-seccomp", "--directfs=false"]}}}
    assert "directfs off" in gvisor_settings(off, RUNSC) and "gofer" in gvisor_settings(off, RUNSC)
    ptrace = {
        "Runtimes": {
            "runsc": {
                "path": "/usr/bin/runsc",
                "runtimeArgs": ["--platform=ptrace", "--oci-seccomp", "--overlay2=none"],
            }
        }
    }
    text = gvisor_settings(ptrace, RUNSC)
    assert "platform ptrace" in text and "measured" in text and "directfs on" in text and "root overlay none" in text
