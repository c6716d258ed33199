"""The warm pool hands out started sandboxes, never the same one twice, and cleans up."""
import pytest

from orchestrator.sandbox.pool import SandboxPool
from tests.conftest import make_workspace

pytestmark = pytest.mark.docker


def test_pool_claims_distinct_ready_sandboxes_and_removes_them(sandbox_image, docker_client, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    with SandboxPool(ws, size=2, client=docker_client) as pool:
        first, second = pool.claim(), pool.claim()
        assert first.container.id != second.container.id
        assert first.call("read_file", {"path": "a.txt"}).output == "a\n"
        third = pool.claim()  # a replacement was started in the background
        assert third.call("shell", {"command": "echo ok"}).output == "ok\n"
        for box in (first, second, third):
            box.close()
    assert docker_client.containers.list(all=True, filters={"label": f"dev.openagents.sandbox.workspace={ws}"}) == []


def test_a_box_started_while_another_planted_does_not_adopt_the_plant(sandbox_image, docker_client, tmp_path):
    """A pooled box started after a session's box planted a nested repo still sweeps it: the pool's baseline is from before any box ran."""
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    with SandboxPool(ws, size=1, client=docker_client) as pool:
        first = pool.claim()
        first.call("shell", {"command": "mkdir -p sub/.git && echo '[core]' > sub/.git/config"})
        second = pool.claim(timeout=60)  # its replacement starts now, after the plant
        third = pool.claim(timeout=60)
        assert "sub/.git" not in third.baseline.git_entries, "a later box took the plant for the user's own (and mounted it read-only)"
        for box in (first, second, third):
            box.close()
    assert not (ws / "sub" / ".git").exists()
