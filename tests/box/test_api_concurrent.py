"""Commands run at once in one box (issue 46), against real boxes under runc and runsc: two threads'
or two tasks' `shell` calls run together (each waits for the other to have started: were they run
one after the other, the first would wait for ever), each with its own output and exit code; a
timeout or a cancel ends its own command alone; a finished command's leftovers (`&`, nohup, setsid)
end, by the time the box's last running command ends, while the other command and the background
processes stay; at most 8 run at once (RESOURCE_EXHAUSTED beyond). And what a hostile command can
do to the one beside it: kill its processes (it ends killed, typed, the box goes on), fork a lot
(the other still ends right, nothing is left), read the agent's end of its output (refused)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchestrator import AsyncSandbox, ErrorType, Sandbox, ToolError
from tests.helpers import BOTH_RUNTIMES, make_workspace

pytestmark = [
    pytest.mark.usefixtures("sandbox_image"),
    pytest.mark.parametrize("runtime", BOTH_RUNTIMES, indirect=True),
]

PIDS = "for p in /proc/[0-9]*; do echo \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\"; done"


def meet(me: str, other: str, then: str) -> str:
    """A command that says it started, then waits (2 min at most) for `other` to have started too."""
    return (
        f"touch /tmp/{me}; i=0; while [ ! -e /tmp/{other} ]; do sleep 0.05; i=$((i+1)); "
        f"[ $i -gt 2400 ] && {{ echo alone; exit 99; }}; done; {then}"
    )


def wait_for(path: Path, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


def test_two_threads_run_together_each_with_its_own_output_and_exit_code(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {})
    with Sandbox(ws, runtime=runtime) as box, ThreadPoolExecutor(max_workers=2) as pool:
        a = pool.submit(box.shell, meet("a", "b", "sleep 1; echo A; exit 3"), 180)
        b = pool.submit(box.shell, meet("b", "a", "echo B; exit 4"), 180)
        first, second = a.result(), b.result()
        assert (first.output, first.exit_code) == ("A\n", 3)
        assert (second.output, second.exit_code) == ("B\n", 4)
        assert box.shell("echo next").output == "next\n"


def test_two_tasks_run_together(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {})

    async def main() -> list[tuple[str, int | None]]:
        async with AsyncSandbox(ws, runtime=runtime) as box:
            results = await asyncio.gather(
                box.shell(meet("a", "b", "sleep 2; echo A"), timeout=180),
                box.shell(meet("b", "a", "sleep 2; echo B"), timeout=180),
            )
            return [(r.output, r.exit_code) for r in results]

    assert asyncio.run(main()) == [("A\n", 0), ("B\n", 0)]


def test_a_timeout_ends_its_own_command_alone(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {})
    with Sandbox(ws, runtime=runtime) as box, ThreadPoolExecutor(max_workers=2) as pool:
        a = pool.submit(box.shell, meet("a", "b", "sleep 3; echo A"), 180)
        b = pool.submit(box.shell, meet("b", "a", "echo B; sleep 1000"), 4)
        with pytest.raises(ToolError) as err:
            b.result()
        assert err.value.type is ErrorType.TIMEOUT
        first = a.result()
        assert (first.output, first.exit_code) == ("A\n", 0)
        assert "sleep 1000" not in box.shell(PIDS).output


def test_a_cancel_ends_its_own_command_alone(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {})

    async def main() -> tuple[str, int | None, str]:
        async with AsyncSandbox(ws, runtime=runtime) as box:
            kept = await box.start("exec sleep 1008")
            a = asyncio.ensure_future(box.shell(meet("a", "b", "touch /workspace/a-met; sleep 3; echo A"), timeout=180))
            b = asyncio.ensure_future(box.shell(meet("b", "a", "touch /workspace/b-met; sleep 1009"), timeout=180))
            for _ in range(1200):
                if (ws / "a-met").exists() and (ws / "b-met").exists():
                    break
                await asyncio.sleep(0.1)
            b.cancel()
            with pytest.raises(asyncio.CancelledError):
                await b
            first = await a
            left = (await box.shell(PIDS)).output
            assert kept.sync.running and "sleep 1008" in left and "sleep 1009" not in left
            return first.output, first.exit_code, left

    output, code, _ = asyncio.run(main())
    assert (output, code) == ("A\n", 0)


def test_a_finished_commands_leftovers_end_the_others_stay(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {})
    with Sandbox(ws, runtime=runtime) as box, ThreadPoolExecutor(max_workers=2) as pool:
        kept = box.start("exec sleep 1004")
        other = pool.submit(
            box.shell, "touch /workspace/other; while [ ! -e /workspace/go ]; do sleep 0.05; done; echo other", 180
        )
        wait_for(ws / "other")
        left = box.shell(
            "sleep 1001 & nohup sleep 1002 >/dev/null 2>&1 & setsid sleep 1003 >/dev/null 2>&1 & echo left"
        )
        assert (left.output, left.exit_code) == ("left\n", 0)
        during = box.shell(PIDS).output  # `other` still runs: what was in the finished command's group is gone
        assert "sleep 1001" not in during and "sleep 1002" not in during
        assert not other.done()
        box.write_file("go", "")
        assert (other.result().output, other.result().exit_code) == ("other\n", 0)
        after = box.shell(PIDS).output
        assert not any(
            f"sleep {n}" in after for n in (1001, 1002, 1003)
        )  # the last command's sweep took the setsid one
        assert "sleep 1004" in after and kept.running


def test_at_most_eight_commands_at_once(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {})
    with Sandbox(ws, runtime=runtime) as box, ThreadPoolExecutor(max_workers=8) as pool:
        held = [
            pool.submit(
                box.shell, f"touch /workspace/s{i}; while [ ! -e /workspace/go ]; do sleep 0.05; done; echo {i}", 180
            )
            for i in range(8)
        ]
        for i in range(8):
            wait_for(ws / f"s{i}", 120)
        with pytest.raises(ToolError) as err:
            box.shell("echo ninth")
        assert err.value.type is ErrorType.RESOURCE_EXHAUSTED and "at most 8" in err.value.message
        assert box.read_file("s0").text == ""  # files still answer
        box.write_file("go", "")
        assert [(f.result().output, f.result().exit_code) for f in held] == [(f"{i}\n", 0) for i in range(8)]
        assert box.shell("echo ninth").output == "ninth\n"


def test_a_command_that_kills_the_others_processes(tmp_path, runtime):
    """Commands in one box are one user's processes: one may kill the other's (as in the peers' boxes).
    The victim ends killed, with its own output and a typed result; the killer's result is its own."""
    ws = make_workspace(tmp_path / "ws", {})
    with Sandbox(ws, runtime=runtime) as box, ThreadPoolExecutor(max_workers=2) as pool:
        victim = pool.submit(box.shell, "echo victim; touch /workspace/victim; sleep 100; echo never", 180)
        wait_for(ws / "victim")
        killer = box.shell("kill -9 -1; echo killer")
        assert (killer.output, killer.exit_code) == ("killer\n", 0)
        result = victim.result()
        assert result.output == "victim\n" and result.exit_code not in (0, None)
        assert box.shell("echo still fine").output == "still fine\n"


def test_a_command_that_forks_a_lot_beside_another(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {})
    with Sandbox(ws, runtime=runtime) as box, ThreadPoolExecutor(max_workers=2) as pool:
        calm = pool.submit(
            box.shell, "touch /workspace/calm; while [ ! -e /workspace/go ]; do sleep 0.05; done; echo calm", 180
        )
        wait_for(ws / "calm")
        # 20 left in the group, 20 in sessions of their own, 300 short-lived (the box's 256
        # pids are shared by its commands; under gVisor 120 sleeps end the box, on main too)
        forks = box.shell(
            "for i in $(seq 1 20); do setsid sleep 1100 & sleep 1101 & "
            "done; for i in $(seq 1 300); do /bin/true; done; echo forked",
            timeout=120,
        )
        assert (forks.output, forks.exit_code) == ("forked\n", 0)
        box.write_file("go", "")
        assert (calm.result().output, calm.result().exit_code) == ("calm\n", 0)
        after = box.shell(PIDS).output
        assert "sleep 1100" not in after and "sleep 1101" not in after


def test_a_command_cannot_read_the_agents_end_of_anothers_output(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {})
    with Sandbox(ws, runtime=runtime) as box, ThreadPoolExecutor(max_workers=2) as pool:
        talker = pool.submit(
            box.shell,
            "touch /workspace/talker; while [ ! -e /workspace/go ]; do echo MARK; sleep 0.01; done | tail -n 1",
            180,
        )
        wait_for(ws / "talker")
        thief = box.shell(
            "for f in /proc/1/fd/*; do timeout 1 cat $f 2>/dev/null; done; "
            "ls /proc/1/fd >/dev/null 2>&1 && echo LISTED; echo tried",
            timeout=120,
        )
        box.write_file("go", "")
        assert (talker.result().output, talker.result().exit_code) == ("MARK\n", 0)
        assert thief.output.endswith("tried\n")
        if runtime != "runsc":  # gVisor skips the dumpable check on /proc (see test_api_processes.py)
            assert "MARK" not in thief.output and "LISTED" not in thief.output
