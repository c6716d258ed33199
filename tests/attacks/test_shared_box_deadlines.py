"""Calls that share one box (issue 22): the agent runs shell commands one at a time, so a second
shell call sent while the first runs waits in the agent. Its deadline must not start while it waits,
and its expiry must never kill the command of the call in front of it."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.docker


def test_a_queued_shell_calls_deadline_never_kills_the_running_command(victim_factory):
    """Two shell calls at once on one box: the second's short deadline (1 s timeout + 1 s grace) would
    pass while it waits behind the first (`sleep 4`). The first still ends with its output, and the
    second gets its own full time once its turn comes."""
    victim = victim_factory(shell_grace_s=1)
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(victim.sh, "sleep 4; echo A", 60)
        time.sleep(0.5)
        sent = time.monotonic()
        second = pool.submit(victim.sh, "sleep 1.5; echo B", 1)
        a, b = first.result(), second.result()
        waited = time.monotonic() - sent
    assert a.ok and a.output == "A\n" and a.meta["exit_code"] == 0, a
    assert b.error is not None and b.error.type.value == "timeout", b  # its own 1 s, counted from its own start
    assert b.meta.get("timed_out") is True and b.meta.get("timeout_s") == 1, b
    assert waited >= 3.5, waited  # it waited for the first instead of running beside it
    assert victim.box.restarts == 0
    victim.assert_intact()


def test_a_queued_shell_call_gets_its_whole_time(victim_factory):
    """The second call's command needs 1.5 s of its 2 s: it still succeeds though it waited 4 s first."""
    victim = victim_factory(shell_grace_s=1)
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(victim.sh, "sleep 4; echo A", 60)
        time.sleep(0.5)
        second = pool.submit(victim.sh, "sleep 1.5; echo B", 2)
        a, b = first.result(), second.result()
    assert a.ok and a.output == "A\n", a
    assert b.ok and b.output == "B\n" and b.meta["exit_code"] == 0, b
    assert b.meta["host_elapsed_s"] < 3.5, b.meta  # counted from its turn, not from when it was asked for
    victim.assert_intact()


def test_reads_are_not_held_behind_a_running_shell_call(victim_factory):
    """Only shell calls queue: a read answers while a command runs."""
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
