"""The tests of tests/unit/test_fork_cow.py that need a real box (issue 48: one tier per folder);
what they are about is said there."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers.fork import oa
from tests.helpers.fork_cow import _parent

pytestmark = pytest.mark.skipif(
    __import__("orchestrator.workspace.overlay", fromlist=["unusable"]).unusable() is not None,
    reason="overlay forks need a host that may mount (root)",
)


@pytest.mark.docker
def test_a_box_left_running_on_the_parents_copy_refuses_the_freeze(tmp_path, monkeypatch, docker_client, sandbox_image):
    """A box whose process did not remove it leaves a process on the copy: a freeze would rename the
    copy into the shared layer under it, and its writes would reach every fork. `fork` asks the daemon
    first (the boxes' workspace labels, matched by the directory's identity: here the state directory
    is reached through a link, so the label, a resolved path, is spelt otherwise): refused while the
    box runs; an overlay fork once it is gone."""
    from orchestrator.config import SandboxConfig
    from orchestrator.sandbox.docker import DockerSandbox
    from orchestrator.workspace.records import open_own_record

    (tmp_path / "real-state").mkdir()
    (tmp_path / "state").symlink_to(tmp_path / "real-state")
    sid = _parent(tmp_path, monkeypatch)
    copy = open_own_record(sid).box_workspace
    assert os.path.realpath(copy) != copy
    box = DockerSandbox(Path(copy), SandboxConfig(), client=docker_client)  # labelled as every box of ours is
    box.start()
    try:
        assert box.call("shell", {"command": "cat a.txt"}).output == "alpha\n"
        refused = oa(tmp_path, "fork", sid, "-n", "2")
        assert refused.returncode != 0 and "still runs on its copy" in refused.stderr and "gc --all" in refused.stderr
        parent = open_own_record(sid)
        assert parent.cow is None and os.path.isdir(copy) and not os.path.ismount(copy)  # nothing renamed or mounted
        assert box.call("shell", {"command": "cat a.txt"}).output == "alpha\n"  # the box's view is the copy still
        listed = json.loads(oa(tmp_path, "sessions", "--json").stdout)
        assert [r["id"] for r in listed] == [sid]  # no fork was made
    finally:
        box.close()
    made = oa(tmp_path, "fork", sid)
    assert made.returncode == 0, made.stderr
    assert open_own_record(made.stdout.split()[0]).cow is not None  # an overlay fork once the box is gone
