"""AsyncSandbox against real boxes (issue 46): a cancelled call ends that call alone (its command is
killed, the others running beside it in the box go on; another task's result stays intact,
and nothing is left unretrieved), calls of several sandboxes really run together whatever the
loop's default executor is, and the async class has every public method the sync one has."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchestrator import AsyncSandbox, Sandbox
from tests.helpers import make_workspace

pytestmark = pytest.mark.usefixtures("sandbox_image")


def public_names(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_the_async_sandbox_has_every_public_method_of_the_sync_one():
    assert public_names(Sandbox) - public_names(AsyncSandbox) == set()
    for name in ("report", "fork", "kill_running", "shell", "changes", "rollback"):
        assert name in public_names(AsyncSandbox)


async def wait_for(path: Path, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        await asyncio.sleep(0.05)


def run_watched(coro) -> list[dict]:
    """asyncio.run, with what the loop reports as never retrieved (or any other unhandled error) collected."""
    reported: list[dict] = []

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context))
        await coro
        gc.collect()
        await asyncio.sleep(0.1)

    asyncio.run(main())
    gc.collect()
    return reported


def test_cancelling_one_of_two_running_calls_leaves_the_other_intact(tmp_path):
    ws = make_workspace(tmp_path / "ws")

    async def scenario():
        async with AsyncSandbox(ws, auto_approve=True) as box:
            first = asyncio.create_task(box.shell("touch a-started; sleep 2; echo A"))
            await wait_for(ws / "a-started")
            second = asyncio.create_task(box.shell("touch b-ran; sleep 30; touch b-finished"))
            await wait_for(ws / "b-ran")  # both run at once in the box
            second.cancel()
            with pytest.raises(asyncio.CancelledError):
                await second
            result = await first
            assert (result.exit_code, result.output) == (0, "A\n")  # not killed (exit -9) by the other task's cancel
            assert not (ws / "b-finished").exists()  # the cancelled call's command was killed
            after = await box.shell("echo next")
            assert after.output == "next\n"  # the box goes on
            return box.transcript_path

    reported = run_watched(scenario())
    assert reported == []  # no "Future exception was never retrieved"


def test_cancelling_the_running_call_kills_it_alone(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    paths: list[Path] = []

    async def scenario():
        async with AsyncSandbox(ws, auto_approve=True) as box:
            first = asyncio.create_task(box.shell("touch a-started; sleep 30; touch a-finished"))
            await wait_for(ws / "a-started")
            second = asyncio.create_task(box.shell("sleep 1; echo B"))
            await asyncio.sleep(0.3)
            started = time.monotonic()
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            assert time.monotonic() - started < 15  # killed, not waited for
            result = await second  # the one beside it runs on, untouched
            assert (result.exit_code, result.output) == (0, "B\n")
            paths.append(box.transcript_path)

    assert run_watched(scenario()) == []
    assert not (ws / "a-finished").exists()
    records = [json.loads(line) for line in paths[0].read_text().splitlines()]
    ends = [r for r in records if r["type"] == "tool_result" and r["tool"] == "shell"]
    assert sorted(r["state"] for r in ends) == ["cancelled", "success"]


def test_several_sandboxes_run_together_whatever_the_default_executor(tmp_path):
    """Each AsyncSandbox runs its calls on its own threads: a loop whose default executor has one
    worker still runs three boxes' `sleep 3` at once (a ratio against one call, not a timing)."""
    workspaces = [make_workspace(tmp_path / f"ws{i}") for i in range(3)]

    async def scenario():
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        boxes = [AsyncSandbox(ws, auto_approve=True) for ws in workspaces]
        try:
            for box in boxes:
                await box.open()
            started = time.monotonic()
            await boxes[0].shell("sleep 3")
            single = time.monotonic() - started
            started = time.monotonic()
            results = await asyncio.gather(*(box.shell("sleep 3") for box in boxes))
            together = time.monotonic() - started
        finally:
            for box in boxes:
                await box.close()
        assert all(r.exit_code == 0 for r in results)
        assert together < 2 * single, (together, single)  # serialised, they would take three times as long

    asyncio.run(scenario())
