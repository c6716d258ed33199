"""The warm pool hands out started sandboxes, never the same one twice, and cleans up."""

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from orchestrator.sandbox.pool import SandboxPool
from tests.helpers import make_workspace
from tests.helpers.start_gate import wait_until

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


def test_a_pool_box_is_warm_before_it_is_claimed_and_a_plain_start_is_not(sandbox_image, docker_client, tmp_path):
    """A pool's box has its agent warm up as it is put in line (every tool imported, a shell ready:
    sandbox_agent/server.py), so a claimer's first calls pay no import; a box started on its own
    warms up only after its first tool call, off the cold start's path."""
    from orchestrator.config import SandboxConfig
    from orchestrator.sandbox.docker import DockerSandbox

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    with SandboxPool(ws, size=1, client=docker_client) as pool:
        box = pool.claim()
        try:
            wait_until(lambda: box.call("hello", {}).meta["warm"], "the pool box warmed up")
        finally:
            box.close()
    with DockerSandbox(ws, SandboxConfig(), client=docker_client) as plain:
        assert plain.call("hello", {}).meta["warm"] is False
        assert plain.call("read_file", {"path": "a.txt"}).ok
        wait_until(lambda: plain.call("hello", {}).meta["warm"], "the plain box warmed up after its first tool call")


def test_a_box_started_while_another_planted_does_not_adopt_the_plant(sandbox_image, docker_client, tmp_path):
    """A pooled box started after a session's box planted a nested repo
    still sweeps it: the pool's baseline is from before any box ran."""
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    with SandboxPool(ws, size=1, client=docker_client) as pool:
        first = pool.claim()
        first.call("shell", {"command": "mkdir -p sub/.git && echo '[core]' > sub/.git/config"})
        second = pool.claim(timeout=60)  # its replacement starts now, after the plant
        third = pool.claim(timeout=60)
        assert "sub/.git" not in third.baseline.git_entries, (
            "a later box took the plant for the user's own (and mounted it read-only)"
        )
        for box in (first, second, third):
            box.close()
    assert not (ws / "sub" / ".git").exists()


def test_a_burst_of_claims_larger_than_the_pool_is_served_and_the_pool_refills(sandbox_image, docker_client, tmp_path):
    """Eight claims at once on a pool of two: each gets its own box, started by the pool's two refill
    workers (never more than two starts at once), and the pool is back to two ready boxes after."""
    from orchestrator.sandbox.pool import PoolBoxReady
    from orchestrator.sandbox.starts import START_GATE

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    events = []
    START_GATE.reset_counters()
    with SandboxPool(ws, size=2, client=docker_client, refill_concurrency=2, on_event=events.append) as pool:
        together = threading.Barrier(8)

        def claim():
            together.wait()
            return pool.claim(timeout=120)

        with ThreadPoolExecutor(max_workers=8) as threads:
            boxes = list(threads.map(lambda _: claim(), range(8)))
        try:
            assert len({box.container.id for box in boxes}) == 8, "a box was handed out twice"
            for box in boxes:
                assert box.call("shell", {"command": "cat a.txt"}).output == "a\n"
            wait_until(lambda: pool.counters().ready == 2, "the pool refilled to its size")
            counters = pool.counters()
            assert (counters.claimed, counters.failed, counters.waiting_claims) == (8, 0, 0)
            assert counters.started == 10, f"{counters.started} boxes started for 8 claims and a refill of 2"
            assert START_GATE.counters().peak_in_flight <= 2, "the pool ran more starts at once than its refill workers"
            assert sum(isinstance(e, PoolBoxReady) for e in events) == 10
        finally:
            for box in boxes:
                box.close()
    assert docker_client.containers.list(all=True, filters={"label": f"dev.openagents.sandbox.workspace={ws}"}) == []


def test_a_pool_whose_starts_fail_backs_off_and_says_why(sandbox_image, docker_client, tmp_path):
    """A missing image: the claim gets image_missing at once, not a wait for a box that never comes;
    the workers try again one at a time after a growing wait, never in a loop."""
    from orchestrator.config import DockerBackendConfig, SandboxConfig
    from orchestrator.errors import ErrorType, OpenAgentsError
    from orchestrator.sandbox.pool import PoolStartFailed

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    events = []
    config = SandboxConfig(backend=DockerBackendConfig(image=f"openagents-sandbox:missing-{uuid.uuid4().hex[:12]}"))
    with SandboxPool(ws, config, size=2, client=docker_client, on_event=events.append) as pool:
        with pytest.raises(OpenAgentsError) as raised:
            pool.claim(timeout=60)
        assert raised.value.type is ErrorType.IMAGE_MISSING and "oa-sandbox image build" in raised.value.message
        time.sleep(4.0)  # the first attempts (one per worker), then 2 s of back-off, one probe, then 4 s
        failures = [e for e in events if isinstance(e, PoolStartFailed)]
    assert 2 <= len(failures) <= 4, f"{len(failures)} failed starts in about 4 s: not backing off"
    assert all(f.error.type is ErrorType.IMAGE_MISSING for f in failures)
    delays = [f.retry_in_s for f in failures]
    assert delays == sorted(delays) and delays[-1] > delays[0] >= 1.0
    assert pool.counters().started == 0
