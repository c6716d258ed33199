"""Background processes (issue 46), against real boxes under runc and runsc: a server started in
one call answers the next; output is kept bounded (its last MiB) however much a process prints;
stdin, cwd and env; at most 16 at once; a command's own leftovers still end with its call while
the background ones stay; a box that kills the keeper gets its processes reported lost (and a new
keeper at the next start); each call goes through the one pipeline (a deny refuses a start)."""

from __future__ import annotations

import asyncio
import json

import pytest

from orchestrator import AsyncSandbox, ErrorType, Sandbox, ToolError
from tests.helpers import BOTH_RUNTIMES, make_workspace

pytestmark = [
    pytest.mark.usefixtures("sandbox_image"),
    pytest.mark.parametrize("runtime", BOTH_RUNTIMES, indirect=True),
]

FETCH = (
    'for i in $(seq 1 100); do python3 -c "import urllib.request as u; '
    "print(u.urlopen('http://127.0.0.1:8765/hello.txt').read().decode())\" "
    "2>/dev/null && exit 0; sleep 0.2; done; exit 1"
)
PIDS = "for p in /proc/[0-9]*; do echo \"$(cat $p/comm 2>/dev/null) $(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\"; done"


def test_a_server_started_in_one_call_answers_the_next(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {"hello.txt": "hi from the box\n"})
    with Sandbox(ws, runtime=runtime) as box:
        server = box.start("exec python3 -m http.server 8765 --bind 127.0.0.1")
        assert server.running and server.pid
        answer = box.shell(FETCH, timeout=60)
        assert answer.exit_code == 0 and answer.output == "hi from the box\n\n"
        assert box.shell(FETCH, timeout=60).exit_code == 0  # still there after another command's sweep
        assert "GET /hello.txt" in server.read()
        assert server.kill() is not None and not server.running
        assert box.shell(FETCH.replace("seq 1 100", "seq 1 2"), timeout=30).exit_code == 1  # gone
        transcript = box.transcript_path.read_text()
    tools = [json.loads(line).get("tool") for line in transcript.splitlines() if '"tool_call"' in line]
    assert {"process_start", "process_read", "process_kill"} <= set(tools)


def test_a_commands_own_leftovers_end_with_it_the_background_ones_stay(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {})
    with Sandbox(ws, runtime=runtime) as box:
        kept = box.start("exec sleep 1001")
        box.shell("nohup sleep 1002 >/dev/null 2>&1 & setsid sleep 1003 >/dev/null 2>&1 &")
        running = box.shell(PIDS).output
        assert "sleep 1001" in running and "sleep 1002" not in running and "sleep 1003" not in running
        # what a background process starts (a double fork, a new session) stays under the keeper
        child = box.start("setsid sh -c 'sleep 1004 & sleep 1005' ; sleep 1006")
        assert box.shell("sleep 0.5; " + PIDS).output.count("sleep 100") >= 3
        assert kept.running and child.running
        child.kill()
        running = box.shell(PIDS).output
        assert "sleep 1006" not in running and "sleep 1001" in running


def test_output_stdin_cwd_env_and_the_limits(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {"sub/keep.txt": "x"})
    with Sandbox(ws, runtime=runtime) as box:
        cat = box.start('echo "$GREETING from $(pwd)"; cat', cwd="sub", env={"GREETING": "hello", "MAX_TOKENS": "7"})
        cat.write("line one\n")
        cat.write(b"\xc3\xa9t\xc3\xa9\n", close=True)
        assert cat.wait(60) == 0
        assert cat.read() == "hello from /workspace/sub\nline one\n\u00e9t\u00e9\n"
        flood = box.start("head -c 5000000 /dev/zero | tr '\\0' x; echo; echo END")
        assert flood.wait(120) == 0
        kept = flood.read_bytes()
        assert len(kept) <= 1 << 20 and kept.endswith(b"x\nEND\n") and flood.dropped == 5000005 - len(kept)
        sleepers = [box.start("exec sleep 1000") for _ in range(16 - len([p for p in box.processes() if p["running"]]))]
        with pytest.raises(ToolError) as err:
            box.start("true")
        assert err.value.type is ErrorType.RESOURCE_EXHAUSTED
        sleepers[0].kill()
        box.start("true").wait(30)
        streamed = "".join(box.start("for i in 1 2 3; do echo $i; sleep 0.2; done").stream(timeout=60))
        assert streamed == "1\n2\n3\n"
        assert box.start("exit 3").wait(30) == 3


def test_a_box_that_kills_the_keeper_loses_its_processes_typed(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {})
    with Sandbox(ws, runtime=runtime) as box:
        victim = box.start("exec sleep 1007")
        # not dumpable: a command of the same uid cannot read the keeper's memory or environment (under runc)
        peek = box.shell(
            "for p in /proc/[0-9]*; do grep -q 'keeper[.]py' $p/cmdline 2>/dev/null && { cat $p/environ "
            ">/dev/null 2>&1 && echo READ; head -c1 $p/mem >/dev/null 2>&1 && echo READ; echo seen; }; done; true"
        )
        assert "seen" in peek.output and (
            "READ" not in peek.output or runtime == "runsc"
        )  # gVisor skips the dumpable check on /proc
        box.shell(
            "for p in /proc/[0-9]*; do grep -q 'keeper[.]py' $p/cmdline 2>/dev/null && kill -9 ${p#/proc/}; done; true"
        )
        with pytest.raises(ToolError) as err:
            victim.wait(30)
        assert err.value.type is ErrorType.AGENT_LOST
        assert "sleep 1007" not in box.shell(PIDS).output
        again = box.start("echo back")  # a new keeper
        assert again.wait(30) == 0 and again.read() == "back\n"
        assert box.shell("echo still fine").output == "still fine\n"


def test_a_deny_refuses_a_start(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {})
    policy = tmp_path / "deny.toml"
    policy.write_text('[[rules]]\ntool = "process_start"\ndecision = "deny"\n')
    with Sandbox(ws, runtime=runtime, policy_files=[policy]) as box:
        with pytest.raises(ToolError) as err:
            box.start("touch started")
        assert err.value.type is ErrorType.REFUSED_BY_POLICY
        assert not (ws / "started").exists() and box.processes() == []


def test_async_processes(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {})

    async def main() -> tuple[str, int | None]:
        async with AsyncSandbox(ws, runtime=runtime) as box:
            proc = await box.start("echo one; sleep 0.3; echo two")
            text = "".join([chunk async for chunk in proc.stream(timeout=60)])
            return text, await proc.wait(30)

    assert asyncio.run(main()) == ("one\ntwo\n", 0)


def test_a_cancelled_command_ends_and_the_background_processes_stay(tmp_path, runtime):
    ws = make_workspace(tmp_path / "ws", {})

    async def main() -> tuple[bool, str, str]:
        async with AsyncSandbox(ws, runtime=runtime) as box:
            kept = await box.start("exec sleep 1008")
            call = asyncio.ensure_future(box.shell("touch started; sleep 1009", timeout=200))
            for _ in range(600):  # the command runs (its file is there), then it is cancelled
                if (ws / "started").exists():
                    break
                await asyncio.sleep(0.1)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            left = (await box.shell(PIDS)).output
            return kept.sync.running and (await kept.wait(0)) is None, left, (await box.shell("echo after")).output

    alive, left, after = asyncio.run(main())
    assert alive and "sleep 1008" in left and "sleep 1009" not in left and after == "after\n"
