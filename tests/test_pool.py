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
