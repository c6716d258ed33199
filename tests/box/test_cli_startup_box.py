"""The tests of tests/unit/test_cli_startup.py that need a real box (issue 48: one tier per folder);
what they are about is said there."""

from __future__ import annotations

import pytest


def _kill_execs(docker_client, box, act) -> list[dict]:
    """The `docker exec`s started in `box`'s container while `act()` ran (the daemon's own event log)."""
    import time

    since = time.time() - 1
    act()
    until = time.time() + 1
    events = docker_client.events(
        since=since,
        until=until,
        decode=True,
        filters={"type": "container", "event": "exec_create", "container": box.container.id},
    )
    return list(events)


@pytest.mark.docker
def test_the_kill_at_close_waits_for_nothing_until_a_call_that_spawns_ran(sandbox, docker_client):
    """exec's close (issue 50): while only calls that start no process of their own ran (list_files), the
    box holds its agent alone and kill_processes starts no `docker exec`; after a shell call it does."""
    assert sandbox.call("list_files", {"path": "."}).ok
    assert _kill_execs(docker_client, sandbox, sandbox.kill_processes) == []
    assert sandbox.call("shell", {"command": "true"}).ok
    assert len(_kill_execs(docker_client, sandbox, sandbox.kill_processes)) == 1
