"""The public API (orchestrator.Sandbox, AsyncSandbox) against real containers: typed results and
errors, the one pipeline (a policy's deny refuses an API call as it refuses a model's), copy mode's
review, checkpoints, an agent run's typed events, the record `oa-sandbox sessions` reads, and that
nothing is left running however the program leaves the block."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import AsyncSandbox, ErrorType, OpenAgentsError, Sandbox, SandboxOptions, ToolError
from orchestrator.config import LABEL
from orchestrator.events import SessionEnded, ToolCallFinished
from orchestrator.workspace.records import open_own_record as load
from tests.helpers import make_workspace

pytestmark = pytest.mark.usefixtures("sandbox_image")
OA = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")


def boxes_on(docker_client, ws: Path) -> list[str]:
    """The containers of any state (running or not) started for this workspace."""
    return [
        c["Id"] for c in docker_client.api.containers(all=True, filters={"label": f"{LABEL}.workspace={ws.resolve()}"})
    ]


def deny_shell(tmp_path: Path) -> Path:
    policy = tmp_path / "deny.toml"
    policy.write_text('[[rules]]\ntool = "shell"\ndecision = "deny"\n')
    return policy


def transcript_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_six_tools_as_typed_methods_in_bind_mode(tmp_path, docker_client):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "one\ntwo\n", "src/m.py": "x = 1\n"})
    with Sandbox(ws, auto_approve=True) as box:
        assert box.mode == "bind" and boxes_on(docker_client, ws)
        read = box.read_file("a.txt")
        assert read.text == "one\ntwo\n" and read.total_lines == 2 and len(read.sha256 or "") == 64
        assert sorted(box.list_files().entries) == ["a.txt", "src/", "src/m.py"]  # before blob.bin
        assert [(m.path, m.line) for m in box.grep_files(r"x = \d").matches] == [("src/m.py", 1)]
        box.shell("printf 'PK\\003\\004\\000\\377' > blob.bin")
        blob = box.read_file("blob.bin")
        assert blob.binary and blob.text == "" and "binary file" in blob.output and blob.sha256
        assert box.write_file("b.txt", "new\n").created
        edit = box.edit_file("a.txt", "two", "three", expected_sha256=read.sha256)
        assert edit.replacements == 1 and "+three" in (edit.diff or "")
        seen: list[str] = []
        shell = box.shell("cat a.txt b.txt; exit 4", on_output=seen.append)
        assert shell.exit_code == 4 and shell.output == "one\nthree\nnew\n" and "".join(seen) == shell.output
        with pytest.raises(ToolError) as missing:
            box.read_file("nope.txt")
        assert missing.value.type is ErrorType.FILE_NOT_FOUND and isinstance(missing.value, OpenAgentsError)
        with pytest.raises(ToolError) as stale:
            box.edit_file("a.txt", "one", "uno", expected_sha256=read.sha256)
        assert stale.value.type is ErrorType.STALE_CONTENT
        with pytest.raises(ToolError) as slow:
            box.shell("echo started; sleep 30", timeout=1)
        assert slow.value.type is ErrorType.TIMEOUT and "started" in slow.value.output
        for bad in (
            lambda: box.read_file(5),
            lambda: box.read_file("a.txt", offset="1"),
            lambda: box.shell("ls", timeout=True),
            lambda: box.write_file("c.txt", b"bytes"),
        ):
            with pytest.raises(ToolError) as wrong:
                bad()
            assert wrong.value.type is ErrorType.INVALID_ARGUMENTS
        with pytest.raises(ToolError) as outside:
            box.write_file("../escape.txt", "x")
        assert outside.value.type in (ErrorType.PATH_OUTSIDE_WORKSPACE, ErrorType.PATH_INVALID)
        session_id, transcript = box.id, box.transcript_path
        turns = [c.turn for c in box.checkpoints() if c.ok]
        assert turns[0] == 0 and len(turns) >= 3  # the start, the write, the edit (and the commands)
    assert (ws / "a.txt").read_text() == "one\nthree\n" and not boxes_on(docker_client, ws)
    record = load(session_id)
    assert (
        record.kind == "api"
        and record.status == "closed"
        and "b.txt" in record.files_changed
        and record.turns
        and record.turns >= 10
    )
    finished = [r for r in transcript_records(transcript) if r["type"] == "tool_result"]
    assert len(finished) >= 10 and transcript_records(transcript)[-1]["type"] == "session_end"
    listed = subprocess.run([OA, "sessions", "--json"], capture_output=True, text=True, check=True).stdout
    assert session_id in listed
    with pytest.raises(OpenAgentsError) as closed:
        box.shell("ls")
    assert closed.value.type is ErrorType.SANDBOX_CLOSED


def test_a_deny_rule_refuses_an_api_call_through_the_ladder(tmp_path, docker_client):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    with Sandbox(ws, auto_approve=True, policy_files=[deny_shell(tmp_path)]) as box:
        with pytest.raises(ToolError) as refused:
            box.shell("touch pwned")
        assert refused.value.type is ErrorType.REFUSED_BY_POLICY
        assert box.read_file("a.txt").text == "a\n"  # the rest still runs
        transcript = box.transcript_path
    assert not (ws / "pwned").exists()
    decided = [r for r in transcript_records(transcript) if r["type"] == "approval" and r.get("tool") == "shell"]
    assert decided and decided[0]["decision"] == "refused"


def test_without_auto_approve_an_edit_asks_the_programs_approver(tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    asked = []

    def approver(request):
        asked.append((request.tool, request.action))
        return request.tool == "write_file"

    with Sandbox(ws, approver=approver) as box:
        box.write_file("b.txt", "b")
        with pytest.raises(ToolError) as rejected:
            box.shell("true")
        assert rejected.value.type is ErrorType.REJECTED_BY_USER
    with Sandbox(ws, approve="ask") as box:  # asking, with no approver: as --non-interactive, what would ask is refused
        with pytest.raises(ToolError) as refused:
            box.write_file("c.txt", "c")
        assert refused.value.type in (ErrorType.REFUSED_BY_POLICY, ErrorType.REJECTED_BY_USER)
    assert [tool for tool, _ in asked] == ["write_file", "shell"] and not (ws / "c.txt").exists()


def test_copy_mode_review_apply_and_discard(tmp_path, docker_client):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    with Sandbox(ws, mode="copy", auto_approve=True) as box:
        assert box.mode == "copy"
        box.write_file("a.txt", "changed\n")
        box.shell("echo made > new.txt")
        assert (ws / "a.txt").read_text() == "a\n"  # the real workspace is untouched until apply
        changes = box.changes()
        assert {(f.path, f.status) for f in changes.files} == {("a.txt", "modified"), ("new.txt", "added")}
        assert "+changed" in changes.diff and "a.txt" in changes.stat
        applied = box.apply()
        assert applied.ok and sorted(applied.applied) == ["a.txt", "new.txt"]
        assert (ws / "a.txt").read_text() == "changed\n" and load(box.id).applied
        box.write_file("a.txt", "again\n")
        (ws / "a.txt").write_text("the user's\n")  # a conflict: nothing lands
        conflicted = box.apply()
        assert not conflicted.ok and [c["path"] for c in conflicted.conflicts] == ["a.txt"]
        assert (ws / "a.txt").read_text() == "the user's\n"
        first = box.id
    second = Sandbox(ws, mode="copy", auto_approve=True).open()
    second.write_file("z.txt", "z")
    freed = second.discard()
    assert freed > 0 and second.closed and load(second.id).discarded
    assert not (ws / "z.txt").exists() and not boxes_on(docker_client, ws)
    assert load(first).status == "closed"


def test_rollback_to_a_turn(tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "start\n"})
    with Sandbox(ws, auto_approve=True) as box:
        box.write_file("a.txt", "first\n")
        turn = max(c.turn for c in box.checkpoints())
        box.write_file("a.txt", "second\n")
        box.write_file("b.txt", "later\n")
        report = box.rollback(turn)
        assert not report.conflicts
        assert (ws / "a.txt").read_text() == "first\n" and not (ws / "b.txt").exists()
        box.rollback(0)
        assert (ws / "a.txt").read_text() == "start\n"
        with pytest.raises(OpenAgentsError) as none:
            box.rollback(999)
        assert none.value.type is ErrorType.INVALID_ARGUMENTS


def test_an_agent_run_yields_the_typed_events(tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    script = tmp_path / "s.jsonl"
    script.write_text(
        json.dumps({"tool_calls": [{"name": "shell", "arguments": {"command": "echo hi > hi.txt"}}]})
        + "\n"
        + json.dumps({"text": "done"})
        + "\n"
    )
    with Sandbox(ws, auto_approve=True) as box:
        run = box.run("make hi.txt", model=f"script:{script}")
        events = list(run)
        assert run.result is not None and run.result.status.value == "finished" and run.result.final_text == "done"
        assert any(isinstance(e, ToolCallFinished) and e.tool == "shell" and e.ok for e in events)
        assert isinstance(events[-1], SessionEnded)
        assert box.read_file("hi.txt").text == "hi\n"  # the same box after the run
        session_id = box.id
    assert load(session_id).model_spec == f"script:{script}"


def test_leaving_by_an_exception_leaves_nothing_running(tmp_path, docker_client):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    with pytest.raises(RuntimeError):
        with Sandbox(ws, auto_approve=True) as box:
            assert boxes_on(docker_client, ws)
            raise RuntimeError("the program failed")
    assert not boxes_on(docker_client, ws)
    assert load(box.id).status == "stopped"


def test_ctrl_c_during_a_command_removes_the_box(tmp_path, docker_client):
    """Ctrl-C while the box runs a command: the program ends (KeyboardInterrupt), its box removed, its
    record cancelled. On a loaded machine: Ctrl-C is sent once the command itself has started (it
    says so in the workspace), and the program is given minutes to end; if it does not, its threads'
    stacks (faulthandler) say where it hung."""
    import signal
    import time

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    program = tmp_path / "p.py"
    program.write_text(
        "import sys\nfrom orchestrator import Sandbox\n"
        "with Sandbox(sys.argv[1], auto_approve=True) as box:\n"
        "    print(box.id, flush=True)\n"
        "    box.shell('touch started; sleep 100', timeout=200)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", str(program), str(ws)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    session_id = proc.stdout.readline().strip()
    assert session_id, proc.communicate()
    deadline = time.monotonic() + 120
    while not (ws / "started").exists():  # the command runs in the box
        assert time.monotonic() < deadline and proc.poll() is None, "the command did not start"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
        _, err = proc.communicate(timeout=60)
        pytest.fail(f"the program did not end within 180 s of Ctrl-C; its threads:\n{err[-8000:]}")
    assert "KeyboardInterrupt" in err
    assert not boxes_on(docker_client, ws)
    assert load(session_id).status == "cancelled"


def test_a_missing_docker_daemon_is_a_typed_error_and_leaves_nothing(tmp_path, monkeypatch):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    monkeypatch.setenv("OA_ENGINE", "docker")  # the Docker daemon named, and silent (under OA_ENGINE=podman too)
    box = Sandbox(ws, auto_approve=True)
    with pytest.raises(OpenAgentsError) as gone:
        box.open()
    assert gone.value.type is ErrorType.DOCKER_UNAVAILABLE and "daemon" in gone.value.message.lower()
    assert (ws / "a.txt").read_text() == "a\n"  # the workspace is as it was
    with pytest.raises(OpenAgentsError) as closed:
        box.shell("ls")
    assert closed.value.type is ErrorType.SANDBOX_CLOSED


def test_a_failing_callback_never_breaks_the_call(tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})

    def broken(_: object) -> None:
        raise RuntimeError("the program's bug")

    with Sandbox(ws, auto_approve=True, on_event=broken) as box:
        assert box.shell("echo one; echo two", on_output=broken).output == "one\ntwo\n"
        assert box.read_file("a.txt").text == "a\n"


def test_bad_options_and_workspaces_are_typed_errors(tmp_path):
    with pytest.raises(OpenAgentsError) as bad_mode:
        Sandbox(tmp_path, mode="sideways")
    assert bad_mode.value.type is ErrorType.INVALID_ARGUMENTS and "mode" in bad_mode.value.message
    with pytest.raises(OpenAgentsError) as unknown:
        Sandbox(tmp_path, no_such_option=1)
    assert unknown.value.type is ErrorType.INVALID_ARGUMENTS
    with pytest.raises(OpenAgentsError) as not_options:
        Sandbox(tmp_path, {"mode": "copy"})
    assert not_options.value.type is ErrorType.INVALID_ARGUMENTS
    with pytest.raises(OpenAgentsError) as missing:
        Sandbox(tmp_path / "absent").open()
    assert missing.value.type is ErrorType.INVALID_ARGUMENTS
    assert SandboxOptions(mode="copy", memory="2g").sandbox_config().memory == "2g"
    for bad in ({"egress": ["bad host"]}, {"env": {"1BAD": "x"}}, {"pids": 1}):
        with pytest.raises(OpenAgentsError) as refused:
            Sandbox(tmp_path, **bad).open()
        assert refused.value.type is ErrorType.INVALID_ARGUMENTS and "validation error" not in refused.value.message


def test_a_missing_image_is_a_typed_error(tmp_path, docker_client):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    with pytest.raises(OpenAgentsError) as missing:
        Sandbox(ws, image="oa-no-such-image:latest").open()
    assert missing.value.type is ErrorType.IMAGE_MISSING and "oa-sandbox image build" in missing.value.message
    assert not boxes_on(docker_client, ws)


def test_async_sandbox_tools_stream_and_cancel(tmp_path, docker_client):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})

    async def main() -> str:
        async with AsyncSandbox(ws, auto_approve=True) as box:
            assert (await box.read_file("a.txt")).text == "a\n"
            await box.write_file("b.txt", "b\n")
            stream = box.shell_stream("for i in 1 2 3; do echo $i; sleep 0.2; done")
            chunks = [chunk async for chunk in stream]
            assert "".join(chunks) == "1\n2\n3\n" and stream.result is not None and stream.result.exit_code == 0
            slow = asyncio.create_task(box.shell("sleep 60; touch late.txt", timeout=120))
            await asyncio.sleep(1.5)
            slow.cancel()
            with pytest.raises(asyncio.CancelledError):
                await slow
            endless = box.shell_stream("echo first; sleep 60; touch late2.txt", timeout=120)
            async for chunk in endless:
                assert chunk == "first\n"
                break  # the program stops listening: the command is killed
            assert endless.result is None
            started = asyncio.get_running_loop().time()
            assert (await box.shell("echo next", timeout=30)).output == "next\n"  # not queued behind a 60 s command
            assert asyncio.get_running_loop().time() - started < 20
            reads = await asyncio.gather(box.read_file("a.txt"), box.read_file("b.txt"))
            assert [r.text for r in reads] == ["a\n", "b\n"]
            with pytest.raises(ToolError):
                await box.read_file("nope")
            return box.id

    session_id = asyncio.run(main())
    assert not boxes_on(docker_client, ws) and not (ws / "late.txt").exists() and not (ws / "late2.txt").exists()
    assert load(session_id).status == "closed"


def run_exec(ws: Path, *args: str) -> tuple[int, dict]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run(
        [OA, "exec", "--workspace", str(ws), *args], capture_output=True, text=True, env=env, timeout=180
    )
    return proc.returncode, json.loads(proc.stdout)


def test_a_deny_rule_refuses_exec_with_the_same_typed_error_as_run(tmp_path, docker_client):
    """exec goes through the ladder (it used to call the box directly): the workspace's own policy
    and --policy refuse it, REFUSED_BY_POLICY and exit 3, and nothing runs; what no rule denies runs."""
    ws = make_workspace(
        tmp_path / "ws", {"a.txt": "a\n", ".openagents/policy.toml": '[[rules]]\ntool = "shell"\ndecision = "deny"\n'}
    )
    code, said = run_exec(ws, "shell", '{"command": "touch pwned"}')
    assert (code, said["ok"], said["error"]["type"]) == (3, False, "refused_by_policy") and not (ws / "pwned").exists()
    policy = tmp_path / "no-writes.toml"
    policy.write_text('[[rules]]\ntool = "write_file"\ndecision = "deny"\n')
    code, said = run_exec(ws, "--policy", str(policy), "write_file", '{"path": "b.txt", "content": "b"}')
    assert (code, said["error"]["type"]) == (3, "refused_by_policy") and not (ws / "b.txt").exists()
    code, said = run_exec(ws, "write_file", '{"path": "b.txt", "content": "b"}')
    assert (code, said["ok"]) == (0, True) and (ws / "b.txt").read_text() == "b"
    assert not boxes_on(docker_client, ws)


def test_a_box_killed_behind_the_sandbox_is_replaced_and_none_is_left(tmp_path, docker_client):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    with Sandbox(ws, auto_approve=True) as box:
        first = boxes_on(docker_client, ws)
        docker_client.api.remove_container(first[0], force=True)
        assert box.shell("cat a.txt").output == "a\n"  # a fresh box on the same workspace
        assert boxes_on(docker_client, ws) and boxes_on(docker_client, ws) != first
    assert not boxes_on(docker_client, ws)


def test_an_egress_gate_goes_with_the_sandbox_on_an_exception(tmp_path, docker_client):
    from orchestrator.sandbox.owner import PID_LABEL

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    mine = {"label": [f"{LABEL}=egress", f"{PID_LABEL}={os.getpid()}"]}
    before = (
        {c["Id"] for c in docker_client.api.containers(all=True, filters=mine)},
        {n["Id"] for n in docker_client.api.networks(filters=mine)},
    )
    with pytest.raises(ZeroDivisionError):
        with Sandbox(ws, auto_approve=True, egress=["example.com"]) as box:
            assert box.shell("echo $HTTPS_PROXY").output.startswith("http://")
            assert {c["Id"] for c in docker_client.api.containers(all=True, filters=mine)} - before[0]  # the gate is up
            raise ZeroDivisionError("the program failed")
    after = (
        {c["Id"] for c in docker_client.api.containers(all=True, filters=mine)},
        {n["Id"] for n in docker_client.api.networks(filters=mine)},
    )
    assert after == before and not boxes_on(docker_client, ws)


def test_a_run_left_early_is_cancelled_and_the_sandbox_goes_on(tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    script = tmp_path / "s.jsonl"
    script.write_text(
        json.dumps(
            {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 60; touch late.txt", "timeout": 120}}]}
        )
        + "\n"
        + json.dumps({"text": "never"})
        + "\n"
    )
    seen = []
    with Sandbox(ws, auto_approve=True, on_event=seen.append) as box:
        run = box.run("wait", model=f"script:{script}")
        for event in run:
            if getattr(event, "state", None) == "executing":
                with pytest.raises(OpenAgentsError) as busy:
                    box.run("another", model=f"script:{script}")
                assert busy.value.type is ErrorType.INVALID_ARGUMENTS
                break  # the program stops listening mid-command
        assert run.result is not None and run.result.status.value == "cancelled"
        assert box.shell("echo still here").output == "still here\n"  # not cancelled itself
    assert not (ws / "late.txt").exists()
    assert any(isinstance(e, SessionEnded) for e in seen)  # on_event got the typed events too


def test_async_run_yields_events_and_a_second_run_continues_the_conversation(tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    script = tmp_path / "s.jsonl"
    script.write_text(
        "\n".join(
            json.dumps(t)
            for t in [
                {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]},
                {"text": "first done"},
                {"text": "second done"},
            ]
        )
        + "\n"
    )

    async def main() -> tuple[list[str], str, str, int]:
        async with AsyncSandbox(ws, auto_approve=True) as box:
            run = box.run("read a.txt", model=f"script:{script}")
            kinds: list[str] = [event.type async for event in run]
            assert run.result is not None
            again = box.run("and now?", model=f"script:{script}")
            second = await again.wait_async()
            return kinds, run.result.final_text, second.final_text, len(again._session.messages)

    kinds, first, second, messages = asyncio.run(main())
    assert "tool_result" in kinds and kinds[-1] == "session_end"
    assert (first, second) == (
        "first done",
        "second done",
    ) and messages >= 6  # system, task, call, result, answer, task 2, answer 2


@pytest.mark.parametrize("ending", ["never closed", "SIGTERM mid-command"])
def test_a_program_that_ends_without_closing_leaves_no_box(tmp_path, docker_client, ending):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    program = tmp_path / "p.py"
    body = "box.shell('sleep 100', timeout=200)" if ending.startswith("SIGTERM") else "box.write_file('b.txt', 'b')"
    program.write_text(
        f"import sys\nfrom orchestrator import Sandbox\nbox = Sandbox(sys.argv[1], auto_approve=True).open()\n"
        f"print(box.id, flush=True)\n{body}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, str(program), str(ws)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    session_id = proc.stdout.readline().strip()
    assert session_id, proc.communicate()
    if ending.startswith("SIGTERM"):
        import time

        deadline = time.monotonic() + 60
        while '"executing"' not in Path(load(session_id).transcript or "").read_text():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        proc.terminate()
    proc.communicate(timeout=60)
    assert not boxes_on(docker_client, ws)
    assert not load(session_id).running()
    if ending == "never closed":
        assert (ws / "b.txt").read_text() == "b" and load(session_id).status == "closed"


def test_the_cli_reviews_and_applies_an_api_made_copy_session(tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    with Sandbox(ws, mode="copy", auto_approve=True) as box:
        box.write_file("a.txt", "from the api\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    listed = json.loads(
        subprocess.run([OA, "sessions", "--json"], capture_output=True, text=True, check=True, env=env).stdout
    )
    mine = [s for s in (listed if isinstance(listed, list) else listed.get("sessions", [])) if s.get("id") == box.id]
    assert mine and mine[0]["mode"] == "copy" and mine[0]["applied"] is False
    shown = subprocess.run([OA, "changes", box.id], capture_output=True, text=True, check=True, env=env).stdout
    assert "+from the api" in shown and (ws / "a.txt").read_text() == "a\n"
    subprocess.run([OA, "apply", box.id], capture_output=True, text=True, check=True, env=env)
    assert (ws / "a.txt").read_text() == "from the api\n" and load(box.id).applied


def test_a_call_racing_close_from_another_thread_never_starts_a_new_box(tmp_path, docker_client):
    """A closed box's next call used to restart it (the supervisor took the missing channel for a
    lost agent): a call from another thread that lost the race with close() left a new box behind."""
    import threading

    from orchestrator.config import SandboxConfig
    from orchestrator.sandbox.docker import DockerSandbox

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    raw = DockerSandbox(ws, SandboxConfig(), client=docker_client)
    raw.start()
    raw.close()
    late = raw.call("read_file", {"path": "a.txt"})
    assert not late.ok and late.error is not None and late.error.type is ErrorType.SANDBOX_CLOSED
    assert not boxes_on(docker_client, ws)
    outcomes: list[object] = []
    box = Sandbox(ws, auto_approve=True).open()

    def busy() -> None:
        try:
            outcomes.append(box.shell("sleep 30", timeout=60))
        except OpenAgentsError as err:
            outcomes.append(err.type)

    worker = threading.Thread(target=busy)
    worker.start()
    deadline = __import__("time").monotonic() + 30
    while '"executing"' not in box.transcript_path.read_text():
        assert __import__("time").monotonic() < deadline
        __import__("time").sleep(0.05)
    box.close()
    worker.join(30)
    assert outcomes == [ErrorType.SANDBOX_CLOSED] and not boxes_on(docker_client, ws)
