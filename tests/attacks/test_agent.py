"""Attacks on the agent itself: kill it, replace it, talk over it. The host notices, reports a
typed error, brings up a fresh agent on the same workspace, and the session goes on."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.docker


def test_kill_9_of_pid_1(victim):
    """`kill -9 1` either does nothing (the kernel protects PID 1) or is reported as agent_lost; the next call works."""
    first = victim.box.container.id
    result = victim.sh("kill -9 1; echo after")
    assert (result.ok and result.output == "after\n") or result.error.type.value == "agent_lost"
    assert victim.call("read_file", {"path": "README.md"}).output == "# victim\n"
    assert victim.box.container.id == first or victim.box.restarts == 1
    victim.assert_intact()


def test_kill_of_the_agent_is_agent_lost(victim):
    """Killing the agent (SIGTERM to PID 1) is reported as agent_lost by the host, which restarts it."""
    first = victim.box.container.id
    result = victim.sh("kill -TERM 1; sleep 5")
    assert not result.ok and result.error.type.value == "agent_lost" and result.executor.value == "openagents"
    assert victim.box.container.id != first and victim.box.restarts == 1
    victim.assert_intact()


def test_replacing_the_agent_files(victim):
    """A fake agent planted in /tmp (or over the real one) never runs: the code is read-only, -I ignores
    PYTHONPATH, and a restart starts from a clean /tmp."""
    out = victim.sh(
        "mkdir -p /tmp/sandbox_agent && echo 'import os; os.system(\"touch /workspace/pwned\")' > /tmp/sandbox_agent/__main__.py; "
        "cp /tmp/sandbox_agent/__main__.py /opt/openagents/sandbox_agent/__main__.py 2>&1; echo rc=$?"
    ).output
    assert "rc=1" in out and ("Read-only file system" in out or (victim.gvisor and "Permission denied" in out)), out  # gVisor checks the mode first
    lost = victim.sh("kill 1; sleep 5")
    assert lost.error.type.value == "agent_lost"
    assert victim.sh("ls /tmp").output == ""
    assert not (victim.ws / "pwned").exists()
    victim.assert_intact()


def test_garbage_on_the_agents_stdout(victim):
    """A command cannot write to the agent's stdout under runc (/proc/1/fd is closed to it: the agent is
    not dumpable). gVisor does not apply that check to /proc/1/fd, so there the garbage reaches the host,
    which answers with a typed protocol_error and a fresh box: the channel stays sound either way."""
    result = victim.sh("echo '{\"v\":1,\"id\":999,\"ok\":true}' > /proc/1/fd/1 2>&1; echo garbage > /proc/1/fd/1 2>&1; echo rc=$?")
    if victim.gvisor:
        assert not result.ok and result.error.type.value == "protocol_error" and result.error.recoverable, result
        assert victim.box.restarts == 1
    else:
        assert "Permission denied" in result.output
    assert victim.call("read_file", {"path": "README.md"}).ok
    victim.assert_intact()


def test_a_catastrophic_regex_ends_at_the_host_deadline_and_the_box_stays(victim_factory):
    """A catastrophic regex no longer wedges the agent (it runs in a child of its own): the call ends,
    typed, at the host's deadline, the child is killed, and the same agent answers the next call."""
    victim = victim_factory(call_deadline_s=2)
    (victim.ws / "r.txt").write_text("a" * 40 + "!\n")
    victim.seal()
    result = victim.call("grep_files", {"pattern": "^(a+)+$"})
    assert result.error.type.value == "timeout" and result.executor.value == "openagents"
    assert victim.call("read_file", {"path": "README.md"}).ok
    assert victim.box.restarts == 0
    victim.assert_intact()
