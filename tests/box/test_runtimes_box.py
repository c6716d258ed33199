"""The tests of tests/unit/test_runtimes.py that need a real box (issue 48: one tier per folder);
what they are about is said there."""

from __future__ import annotations

import subprocess

from orchestrator.sandbox.runtimes import (
    RUNC,
    RUNSC,
    available_runtimes,
    choose_runtime,
)


def test_the_real_daemons_choice_matches_its_registrations(docker_client):
    """On this machine, after scripts/setup, the default is gVisor; without it, runc with the reason."""
    info = docker_client.info()
    registered = info.get("Runtimes") or {}
    choice = choose_runtime(None, False, docker_client)
    from orchestrator.sandbox.runtimes import MIN_RUNSC_VERSION, runsc_version

    entry = registered.get("runsc") or {}
    usable = (
        "--oci-seccomp" in (entry.get("runtimeArgs") or [])
        and (runsc_version(str(entry.get("path"))) or 0) >= MIN_RUNSC_VERSION
    )
    assert choice.name == (RUNSC if usable else RUNC), choice
    assert available_runtimes(docker_client) >= {"runc"} | ({"runsc"} if "runsc" in registered else set())


def test_a_box_under_the_default_choice_runs_the_tools_and_leaves_nothing(open_sandbox, docker_client, tmp_path):
    """The hardened box under the chosen runtime answers; under gVisor `uname -r` is gVisor's kernel,
    not the host's; closing it leaves no container of ours."""
    from tests.helpers import make_workspace

    choice = choose_runtime(None, False, docker_client)
    ws = make_workspace(tmp_path / "ws", {"a.txt": "hello\n"})
    box = open_sandbox(ws)  # no runtime named: the box's own default choice
    assert box.runtime == choice and box.config.backend.runtime == choice.name
    assert box.call("read_file", {"path": "a.txt"}).output.endswith("hello\n")
    kernel = box.call("shell", {"command": "uname -r"}).output.strip()
    host_kernel = subprocess.run(["uname", "-r"], capture_output=True, text=True, check=True).stdout.strip()
    assert (kernel != host_kernel) == choice.gvisor, (kernel, host_kernel, choice)
    container_id = box.container.id
    box.close()
    left = docker_client.containers.list(
        all=True, filters={"label": f"dev.openagents.sandbox.workspace={ws.resolve()}"}
    )
    assert [c.id for c in left] == [], f"left behind: {[c.id for c in left]} (ours was {container_id})"
