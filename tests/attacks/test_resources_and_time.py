"""Resources and time: bombs, floods and daemons are stopped from outside, and the box goes on."""

from __future__ import annotations

import time

import pytest

from orchestrator.protocol import BoxCall
from tests.helpers import live_processes

pytestmark = pytest.mark.docker


def _rss_kib() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def test_fork_bomb_is_stopped_by_the_pids_limit(victim_factory):
    """A fork bomb hits the pids limit, ends by its timeout at the latest, leaves no process, and the next call works.
    Under gVisor the box's tasks are not host processes: the bomb meets the memory limit instead, the
    whole box dies, and the host says so (agent_lost) and replaces it."""
    victim = victim_factory(pids=64)
    started = time.monotonic()
    result = victim.sh("bomb() { bomb | bomb & }; bomb; sleep 8; echo survived", timeout=5)
    # Either the shell itself cannot fork any more and dies, or the timeout ends it.
    assert (not result.ok and result.error.type.value == "timeout") or "survived" not in result.output, result
    ends = ("timeout", "agent_lost") if victim.gvisor else ("timeout",)
    assert result.ok or result.error.type.value in ends, result
    assert time.monotonic() - started < 30
    assert live_processes(victim.box) == ["1 python3"]
    victim.assert_intact()


def test_memory_bomb_is_killed_and_reported(victim_factory):
    """Allocating far past the memory limit kills the allocator (under gVisor: the whole box, which the
    host replaces), not the host; the result says so."""
    victim = victim_factory(memory="256m")
    result = victim.sh("python3 -c 'a = [bytearray(64 << 20) for _ in range(64)]'; echo rc=$?", timeout=60)
    if victim.gvisor and not result.ok:
        assert result.error.type.value == "agent_lost" and "memory" in result.error.message, result
        assert victim.box.restarts == 1
    else:
        assert result.ok and ("rc=137" in result.output or "MemoryError" in result.output), result
    victim.assert_intact()


def test_filling_tmp_stops_at_its_size(victim_factory):
    """Filling /tmp stops at the tmpfs size; nothing reaches the host's disk."""
    victim = victim_factory(tmp_size="32m")
    out = victim.sh("dd if=/dev/zero of=/tmp/fill bs=1M count=100 2>&1 | tail -1; du -m /tmp/fill | cut -f1").output
    assert "No space left on device" in out or int(out.split()[-1]) <= 32
    assert int(out.split()[-1]) <= 32
    victim.assert_intact()


def test_a_huge_file_in_the_workspace_stops_at_the_file_size_limit(victim_factory):
    """A command cannot write a file past the file-size limit into the workspace (the host's disk)."""
    victim = victim_factory(max_file_size=16 << 20)
    out = victim.sh("dd if=/dev/zero of=big bs=1M count=64 2>&1 | tail -2; ls -l big | awk '{print $5}'").output
    assert int(out.split()[-1]) <= 16 << 20, out
    victim.assert_intact(changed=("big",))


def test_yes_for_the_whole_timeout_is_capped(victim):
    """`yes` until the timeout gives capped output and bounded host memory."""
    before = _rss_kib()
    result = victim.sh("yes", timeout=3)
    grown_mib = (_rss_kib() - before) / 1024
    assert result.error.type.value == "timeout"
    assert len(result.output.encode()) < 64 * 1024 and result.meta["output_bytes"] > 10 * 1024 * 1024
    assert result.meta["output_truncated"] is True
    assert grown_mib < 64
    victim.assert_intact()


def test_a_100_mb_write_is_refused(victim):
    """A 100 MB single-line write_file is refused with a typed error, at the host and at the wire."""
    from orchestrator.errors import OpenAgentsError
    from orchestrator.tools.args import validate_arguments

    content = "x" * (100 * 1024 * 1024)
    with pytest.raises(OpenAgentsError) as info:
        validate_arguments("write_file", {"path": "big.txt", "content": content})
    assert info.value.type.value == "invalid_arguments"
    raw = victim.call("write_file", {"path": "big.txt", "content": content})
    assert not raw.ok and raw.error.type.value == "file_too_large"
    assert not (victim.ws / "big.txt").exists()
    victim.assert_intact()


def test_sleep_past_the_timeout(victim):
    """`sleep` past the timeout ends at the timeout as a typed, recoverable error."""
    started = time.monotonic()
    result = victim.sh("sleep 100", timeout=2)
    assert result.error.type.value == "timeout" and result.error.recoverable and time.monotonic() - started < 6
    victim.assert_intact()


def test_child_ignoring_sigterm(victim):
    """A child that ignores SIGTERM is killed anyway."""
    result = victim.sh("sh -c 'trap \"\" TERM INT HUP; while :; do sleep 1; done' & wait", timeout=2)
    assert result.error.type.value == "timeout"
    assert live_processes(victim.box) == ["1 python3"]
    victim.assert_intact()


@pytest.mark.parametrize(
    "command",
    [
        "setsid sleep 300 &",
        "nohup sleep 300 >/dev/null 2>&1 &",
        "(sh -c 'sleep 300 &' &)",
        "setsid sh -c 'setsid sh -c \"sleep 300\" &' &",
    ],
)
def test_daemons_do_not_survive_the_call(victim, command):
    """setsid, nohup and double-fork daemons do not outlive their call."""
    assert victim.sh(command + " echo started").ok
    assert live_processes(victim.box) == ["1 python3"]
    victim.assert_intact()


def test_a_writer_stops_writing_after_the_timeout(victim):
    """A background process that keeps writing is dead after the timeout: the file stops growing."""
    victim.sh("(while :; do echo x >> out.txt; sleep 0.05; done) & sleep 30", timeout=2)
    size = (victim.ws / "out.txt").stat().st_size
    time.sleep(1)
    assert (victim.ws / "out.txt").stat().st_size == size
    victim.assert_intact(changed=("out.txt",))


@pytest.mark.parametrize("timeout", [241, 1000, 10**6])
def test_the_240_second_ceiling_cannot_be_raised(victim, timeout):
    """No timeout argument raises the 240 s ceiling: the agent clamps and the host's deadline holds."""
    result = victim.sh("true", timeout=timeout)
    assert result.meta["timeout_s"] == 240 and result.meta["clamped"] is True
    assert (
        victim.box.deadline_for(BoxCall.named("shell", {"timeout": timeout})) <= 240 + victim.box.config.shell_grace_s
    )
    victim.assert_intact()
