"""Calls that share one box (issue 22, issue 46): the agent runs shell commands at once, each in a
process group of its own. One call's timeout must never kill the command running beside it, and each
gets its whole time."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.docker


def test_a_second_shell_calls_timeout_never_kills_the_running_command(victim_factory):
    """Two shell calls at once on one box: the second times out (1 s) while the first (`sleep 4`)
    runs beside it. The first still ends with its output; the second ends on its own 1 s."""
    victim = victim_factory(shell_grace_s=1)
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(victim.sh, "sleep 4; echo A", 60)
        time.sleep(0.5)
        second = pool.submit(victim.sh, "sleep 1.5; echo B", 1)
        a, b = first.result(), second.result()
    assert a.ok and a.output == "A\n" and a.meta["exit_code"] == 0, a
    assert b.error is not None and b.error.type.value == "timeout", b  # its own 1 s, counted from its own start
    assert b.meta.get("timed_out") is True and b.meta.get("timeout_s") == 1, b
    assert victim.box.restarts == 0
    victim.assert_intact()


def test_a_second_shell_call_gets_its_whole_time(victim_factory):
    """The second call's command needs 1.5 s of its 2 s: it succeeds beside the first."""
    victim = victim_factory(shell_grace_s=1)
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(victim.sh, "sleep 4; echo A", 60)
        time.sleep(0.5)
        second = pool.submit(victim.sh, "sleep 1.5; echo B", 2)
        a, b = first.result(), second.result()
    assert a.ok and a.output == "A\n", a
    assert b.ok and b.output == "B\n" and b.meta["exit_code"] == 0, b
    assert b.meta["host_elapsed_s"] < 3.5, b.meta  # it ran beside the first, not after it
    victim.assert_intact()


def test_reads_are_not_held_behind_a_running_shell_call(victim_factory):
    """A read answers while a command runs."""
    victim = victim_factory(shell_grace_s=1)
    done = threading.Event()

    def slow() -> object:
        try:
            return victim.sh("sleep 4; echo A", 60)
        finally:
            done.set()

    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(slow)
        time.sleep(0.5)
        started = time.monotonic()
        read = victim.call("read_file", {"path": "README.md"})
        took = time.monotonic() - started
        assert not done.is_set(), "the read came back only after the command"
        assert running.result().output == "A\n"
    assert read.ok and read.output == "# victim\n" and took < 2.0, (read, took)
    victim.assert_intact()
