"""The attack battery's fixtures: a victim workspace with a canary beside it on the host.

Every scenario makes a real attempt through the real tools against a real container, then
asserts that the attack failed AND that the workspace and the host are intact.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from orchestrator.sandbox.docker import DockerSandbox
from tests.helpers import CANARY, chown_tree, make_workspace, sandbox_config
from tests.helpers.redteam_egress import cas, proxy_module  # noqa: F401 - the gate's fixtures, found by name

FILES = {
    "README.md": "# victim\n",
    "src/app.py": "print('hi')\n",
    ".git/config": "[core]\n\tbare = false\n",
    ".git/HEAD": "ref: refs/heads/main\n",
}


def snapshot(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_symlink():
                out[str(path.relative_to(root))] = "-> " + os.readlink(path)
            else:
                out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@dataclass
class Victim:
    ws: Path
    outside: Path
    box: DockerSandbox
    before: dict[str, str] = field(default_factory=dict)

    def call(self, tool: str, args: dict):
        return self.box.call(tool, args)

    @property
    def gvisor(self) -> bool:
        """The box runs under gVisor: a few kernel-facing details differ (see each use)."""
        return self.box.runtime is not None and self.box.runtime.gvisor

    def sh(self, command: str, timeout: int = 30):
        return self.box.call("shell", {"command": command, "timeout": timeout})

    def seal(self) -> None:
        """Take the 'before' picture after the scenario's own set-up."""
        chown_tree(self.ws)
        self.before = snapshot(self.ws)

    def assert_intact(self, changed: tuple[str, ...] = ()) -> None:
        assert (self.outside / "canary.txt").read_text() == CANARY, "the host canary changed"
        assert sorted(p.name for p in self.outside.iterdir()) == ["canary.txt"], (
            "something appeared outside the workspace"
        )
        after = snapshot(self.ws)
        for key in set(self.before) | set(after):
            if key in changed or any(key.startswith(c.rstrip("/") + "/") for c in changed if c.endswith("/")):
                continue
            assert self.before.get(key) == after.get(key), f"workspace file {key} changed"
        assert self.box.call("shell", {"command": "echo alive"}).output == "alive\n", "the sandbox did not recover"
        mine = self.box.client.containers.list(
            all=True, filters={"label": f"dev.openagents.sandbox.workspace={self.ws}"}
        )
        assert [c.id for c in mine] == [self.box.container.id], "a replaced container was left behind"


@pytest.fixture
def victim_factory(sandbox_image, docker_client, tmp_path, runtime):
    """Victims under the test's runtime (each attack runs under runc and under runsc)."""
    boxes = []

    def make(**config) -> Victim:
        root = tmp_path / f"host{len(boxes)}"
        outside = root / "outside"
        outside.mkdir(parents=True)
        (outside / "canary.txt").write_text(CANARY)
        ws = make_workspace(root / "ws", FILES)
        box = DockerSandbox(ws, sandbox_config(runtime, docker_client, **config), client=docker_client)
        box.start()
        boxes.append(box)
        victim = Victim(ws, outside, box)
        victim.seal()
        return victim

    yield make
    for box in boxes:
        box.close()


@pytest.fixture
def victim(victim_factory) -> Victim:
    return victim_factory()
