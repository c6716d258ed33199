"""The Docker daemon goes away mid-call and mid-session, and comes back (issue 16: daemon loss).

Every Docker test here runs against the tests' own second daemon (tests/helpers/docker_daemon.py: its own
socket, data root, exec root, containerd, network and mount namespaces), reached through
DOCKER_HOST exactly as a user's would be; it is killed with SIGKILL as a crash would kill it, or
frozen with SIGSTOP as a wedged or restoring daemon looks. The machine's daemon is only read, once,
for the image (docker save) and its runtime registrations.

What must hold: the call returns a typed, fatal `docker_unavailable` well within its deadline (a
frozen daemon: bounded by the daemon check, never Docker's 60 s request timeout), the box is not
replaced in a loop, the session writes `session_end` and `run` exits 1 (stopped; 2 when the daemon is
already gone at set-up), `exec` exits 2, no host thread or child process is left, and once the daemon
is back the next session works: in the same process for the ACP and MCP servers, whose other
sessions go on.

Boxes run under the machine daemon's registrations copied over (runsc and runsc-net when scripts/setup
registered them; gVisor then runs under the own daemon as it does under the machine's); with none,
the project's default choice is runc, as on the machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import LABEL, SandboxConfig
from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.protocol import BoxCall
from orchestrator.sandbox.base import RETRIED_AFTER_DEADLINE_S, BoxSpec, SupervisedSandbox
from orchestrator.sandbox.daemon import DAEMON_CHECK_S
from orchestrator.sandbox.local import LocalDeployment, PipeStream
from tests.helpers import make_workspace
from tests.helpers.docker_daemon import OwnDockerDaemon, extra_runtimes, save_image
from tests.helpers.fake_model_server import FakeModelServer

OA = str(Path(sys.executable).with_name("oa-sandbox"))
MARK = "OA_DAEMON_LOSS_TEST"  # in every CLI's environment: its descendants inherit it, wherever they go
SLOW_S = 30
SLOW_CALL = f"touch started; echo started; sleep {SLOW_S}"  # its deadline: the default 60 s timeout and the grace


# -- the own daemon ----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def image_tarball(sandbox_image, tmp_path_factory) -> Iterator[Path]:
    tarball = save_image(SandboxConfig().backend.image, tmp_path_factory.mktemp("image") / "sandbox.tar")
    yield tarball
    tarball.unlink()  # a quarter of a gigabyte: not kept with pytest's last three temporary directories


def machine_daemon_state(docker_client) -> tuple[bool, str]:
    """What the own daemon must never change: the machine daemon's bridge, and that it answers."""
    return Path("/sys/class/net/docker0").exists(), docker_client.info()["ID"]


@pytest.fixture(scope="module")
def own_daemon(docker_client, image_tarball):
    machine = machine_daemon_state(docker_client)
    daemon = OwnDockerDaemon(extra_runtimes(docker_client.info()))
    try:
        daemon.start()
        daemon.load(image_tarball)
        assert machine_daemon_state(docker_client) == machine
        own = daemon.client()
        assert own.info()["ID"] != machine[1]  # its own identity (key.json): nothing of /etc/docker was shared
        own.close()
        yield daemon
    finally:
        daemon.close()
    assert daemon.leftovers() == [], "the test's daemon left something behind"
    assert machine_daemon_state(docker_client) == machine, "the machine's daemon or its bridge changed"


@pytest.fixture
def daemon(own_daemon: OwnDockerDaemon, monkeypatch) -> Iterator[OwnDockerDaemon]:
    """The own daemon, up, and DOCKER_HOST naming it for this test (and the CLIs it starts)."""
    own_daemon.ensure_up()
    monkeypatch.setenv("DOCKER_HOST", own_daemon.host)
    yield own_daemon
    own_daemon.ensure_up()
    own_daemon.remove_all_containers()


def containers(daemon: OwnDockerDaemon) -> list[dict[str, Any]]:
    client = daemon.client()
    try:
        return client.api.containers(all=True, filters={"label": LABEL})
    finally:
        client.close()


# -- the CLI's processes -----------------------------------------------------------------------------
def cli_env(tmp_path: Path, daemon: OwnDockerDaemon, mark: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "GEMINI_API_KEY")}
    env.update(
        XDG_STATE_HOME=str(tmp_path / "state"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        DOCKER_HOST=daemon.host,
        **extra,
    )
    env[MARK] = mark
    return env


def marked(mark: str) -> list[str]:
    """Every live process whose environment carries `mark`: a CLI and anything it started, even setsid'd."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ.split(b"\0") and state != "Z":
            found.append(f"{entry} {Path(f'/proc/{entry}/comm').read_text().strip()}")
    return found


def wait_for(path: Path, proc: subprocess.Popen[str] | None = None, within: float = 90.0) -> None:
    deadline = time.monotonic() + within
    while not path.exists():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"the CLI ended before {path.name} appeared: {proc.returncode}\n{proc.communicate()[1][-3000:]}"
            )
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def script(tmp_path: Path, turns: list[dict[str, Any]], name: str = "model.jsonl") -> str:
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(t) for t in turns) + "\n")
    return f"script:{path}"


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def new_threads(before: set[threading.Thread], within: float = 5.0) -> list[str]:
    """Threads started since `before` that are still alive after `within` seconds of grace."""
    deadline = time.monotonic() + within
    while True:
        left = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


# -- the supervisor, without Docker: a lost backend is a typed failure, never a restart loop ----------
class VanishingBackend(LocalDeployment):
    """The local deployment (the agent as a child process) whose "daemon" can go: then the agent
    dies with it, starting fails, and why_lost says so, as DockerDeployment does."""

    gone = False

    def start(self) -> PipeStream:
        if self.gone:
            raise OpenAgentsError(ErrorType.DOCKER_UNAVAILABLE, "the backend is gone")
        return super().start()

    def why_lost(self, err: OpenAgentsError) -> OpenAgentsError:
        return OpenAgentsError(ErrorType.DOCKER_UNAVAILABLE, "lost with the backend") if self.gone else err


def test_a_vanished_backend_fails_each_call_typed_and_the_box_comes_back_with_it(tmp_path: Path) -> None:
    made: list[VanishingBackend] = []

    def deploy(spec: BoxSpec) -> VanishingBackend:
        made.append(VanishingBackend(spec))
        return made[-1]

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    box = SupervisedSandbox(
        ws, SandboxConfig(user=f"{os.getuid() or 1000}:{os.getgid() or 1000}"), deploy, state_dir=tmp_path / "state"
    )
    with box:
        backend = made[0]
        backend.gone = True
        killer = threading.Timer(0.5, lambda: backend.proc.kill())  # type: ignore[union-attr]
        killer.start()
        lost = box.call("shell", {"command": "sleep 30"})
        assert lost.error is not None and lost.error.type is ErrorType.DOCKER_UNAVAILABLE and not lost.error.recoverable
        assert box.restarts == 0 and backend.started == 1  # not replaced: there is nothing to replace it on
        down = [box.call("read_file", {"path": "a.txt"}) for _ in range(3)]  # returned, typed, never raised
        assert [r.error.type for r in down if r.error] == [ErrorType.DOCKER_UNAVAILABLE] * 3
        assert box.restarts == 3 and backend.started == 1  # one attempt per call, no loop
        backend.gone = False
        assert box.call("read_file", {"path": "a.txt"}).output == "a\n"
        assert backend.started == 2


# -- in the host process: the sandbox itself ----------------------------------------------------------
@pytest.mark.docker
def test_a_daemon_killed_mid_call_fails_the_call_typed_at_once_and_the_box_returns_with_the_daemon(daemon, tmp_path):
    from orchestrator.sandbox.docker import DockerSandbox

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    other_ws = make_workspace(tmp_path / "other", {"b.txt": "b\n"})
    before = set(threading.enumerate())
    busy = DockerSandbox(ws, SandboxConfig())  # each makes its own client from DOCKER_HOST, as the CLI does
    idle = DockerSandbox(other_ws, SandboxConfig())
    busy.start()
    idle.start()
    busy_id, idle_id = busy.container.id, idle.container.id
    assert {c["Id"] for c in containers(daemon)} == {busy_id, idle_id}  # on the test's daemon, not the machine's
    running = threading.Event()
    outcome: list[Any] = []
    caller = threading.Thread(
        target=lambda: outcome.append(busy.call("shell", {"command": SLOW_CALL}, on_output=lambda _: running.set()))
    )
    caller.start()
    assert running.wait(60)
    killed = time.monotonic()
    daemon.kill()
    caller.join(timeout=busy.deadline_for(BoxCall.named("shell", {"command": SLOW_CALL})))
    assert not caller.is_alive(), "the call outlived its deadline"
    took = time.monotonic() - killed
    result = outcome[0]
    assert result.error is not None and result.error.type is ErrorType.DOCKER_UNAVAILABLE, result
    assert not result.error.recoverable and "Docker daemon" in result.error.message
    assert took < SLOW_S, f"the loss was waited out: the call took {took:.1f} s"  # noticed, not waited for
    assert busy.restarts == 0  # no box was started on a daemon that is not there

    down = idle.call("read_file", {"path": "b.txt"})  # the other box's agent went with the daemon
    assert down.error is not None and down.error.type is ErrorType.DOCKER_UNAVAILABLE
    busy.close()  # while the daemon is down: returns, and takes its threads with it
    assert busy.deployment.left_behind == [busy_id]

    daemon.ensure_up()  # on the same data root: what the killed daemon left is there, stopped
    assert {c["Id"]: c["State"] for c in containers(daemon)} == {busy_id: "exited", idle_id: "exited"}
    back = idle.call("read_file", {"path": "b.txt"})  # the same sandbox, on a fresh box
    assert back.ok and back.output == "b\n"
    assert idle_id not in {c["Id"] for c in containers(daemon)}  # its lost box was removed once the daemon answered
    idle.close()
    assert [c["Id"] for c in containers(daemon)] == [busy_id]  # only the box closed while the daemon was gone (gc's)
    assert new_threads(before) == []


@pytest.mark.docker
def test_a_frozen_daemon_costs_a_call_its_deadline_and_one_bounded_check_never_dockers_60_s(daemon, tmp_path):
    from orchestrator.sandbox.docker import DockerSandbox

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    before = set(threading.enumerate())
    box = DockerSandbox(ws, SandboxConfig(shell_grace_s=1.0))
    box.start()
    args = {"command": SLOW_CALL, "timeout": 2}
    deadline = box.deadline_for(BoxCall.named("shell", args))
    running = threading.Event()
    outcome: list[Any] = []
    started = time.monotonic()
    caller = threading.Thread(target=lambda: outcome.append(box.call("shell", args, on_output=lambda _: running.set())))
    caller.start()
    assert running.wait(60)
    daemon.freeze()  # connections are accepted, never answered: no EOF tells the host anything
    # the deadline, then the check, the wait for the killed call, the check again: each once; slack for a loaded
    # machine, and still far from Docker's own 60 s request timeout, which a single unbounded call would wait out
    bound = deadline + DAEMON_CHECK_S + RETRIED_AFTER_DEADLINE_S + DAEMON_CHECK_S + 10
    caller.join(timeout=bound + 30)
    assert not caller.is_alive(), "the call hung on the frozen daemon"
    took = time.monotonic() - started
    result = outcome[0]
    assert result.error is not None and result.error.type is ErrorType.DOCKER_UNAVAILABLE, result
    assert "deadline" in result.error.message and "does not answer" in result.error.message
    assert deadline <= took < bound, f"{took:.1f} s for a call with a deadline of {deadline:.0f} s"
    closing = time.monotonic()
    box.close()
    assert time.monotonic() - closing < DAEMON_CHECK_S + 5  # the silent daemon is asked once at most, not per step
    assert new_threads(before) == []
    with pytest.raises(OpenAgentsError) as refused:  # a new sandbox while it is frozen: a set-up error, in seconds
        DockerSandbox(ws, SandboxConfig()).start()
    assert refused.value.type is ErrorType.DOCKER_UNAVAILABLE

    daemon.thaw()
    with DockerSandbox(ws, SandboxConfig()) as again:  # answering again: the next sandbox works
        assert again.call("read_file", {"path": "a.txt"}).output == "a\n"


# -- the CLI: run and exec ----------------------------------------------------------------------------
@pytest.mark.docker
def test_run_killed_mid_call_ends_the_session_typed_and_the_next_run_works(daemon, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    mark = uuid.uuid4().hex
    env = cli_env(tmp_path, daemon, mark)
    model = script(
        tmp_path,
        [{"tool_calls": [{"id": "slow", "name": "shell", "arguments": {"command": SLOW_CALL}}]}, {"text": "never"}],
    )
    transcript = tmp_path / "t.jsonl"
    proc = subprocess.Popen(
        [
            OA,
            "run",
            "--workspace",
            str(ws),
            "--model",
            model,
            "--non-interactive",
            "--auto-approve",
            "--output",
            "json",
            "--transcript",
            str(transcript),
            "go",
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(ws / "started", proc)
        daemon.kill()
        out, err = proc.communicate(timeout=60)  # the call's deadline is 35 s: well before it
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err  # stopped (README: a fatal tool error)
    summary = json.loads(out)
    assert summary["status"] == "stopped" and summary["error"]["type"] == "docker_unavailable", summary
    assert [c["error_type"] for c in summary["failed_calls"]] == ["docker_unavailable"]
    recorded = events(transcript)
    assert recorded[-1]["type"] == "session_end" and recorded[-1]["error"]["type"] == "docker_unavailable"
    finished = [e for e in recorded if e["type"] == "tool_result"]
    assert finished[-1]["call_id"] == "slow" and finished[-1]["error"]["type"] == "docker_unavailable"
    assert marked(mark) == []  # the CLI is gone and left no process of its own behind

    # while the daemon is down: a set-up error (exit 2), typed, at once; exec the same
    down = subprocess.run(
        [OA, "run", "--workspace", str(ws), "--model", model, "--non-interactive", "go"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert down.returncode == 2 and "docker_unavailable" in down.stderr, down.stderr
    down = subprocess.run(
        [OA, "exec", "--workspace", str(ws), "read_file", '{"path": "a.txt"}'],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert down.returncode == 2 and "docker_unavailable" in down.stderr, down.stderr
    assert json.loads(down.stdout)["error"]["type"] == "docker_unavailable"  # its one JSON result on stdout

    daemon.ensure_up()
    again = script(
        tmp_path,
        [{"tool_calls": [{"name": "shell", "arguments": {"command": "cat a.txt"}}]}, {"text": "done"}],
        "again.jsonl",
    )
    proc = subprocess.run(
        [
            OA,
            "run",
            "--workspace",
            str(ws),
            "--model",
            again,
            "--non-interactive",
            "--auto-approve",
            "--output",
            "json",
            "go",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["calls"]["ok"] == 1
    assert marked(mark) == []
    # The lost run's box, stopped by the restarted daemon: its owner is gone, so the next command's
    # reaping removed it (reaper.py); nothing is left for gc.
    assert containers(daemon) == []


@pytest.mark.docker
def test_run_whose_daemon_dies_between_calls_stops_at_the_next_call_typed(daemon, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    mark = uuid.uuid4().hex
    transcript = tmp_path / "t.jsonl"
    with FakeModelServer() as server:
        server.openai_turn(tool_calls=[("shell", {"command": "echo one"})])
        server.openai_turn(tool_calls=[("read_file", {"path": "a.txt"})])
        server.openai_turn("never asked")
        server.before_reply = lambda number: daemon.kill() if number == 2 else None  # while the model thinks
        env = cli_env(tmp_path, daemon, mark, OA_TEST_MODEL_KEY="k")
        proc = subprocess.run(
            [
                OA,
                "run",
                "--workspace",
                str(ws),
                "--model",
                "openai:fake",
                "--base-url",
                server.base_url,
                "--api-key-env",
                "OA_TEST_MODEL_KEY",
                "--non-interactive",
                "--auto-approve",
                "--output",
                "json",
                "--transcript",
                str(transcript),
                "go",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        asked = len(server.requests)
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["error"]["type"] == "docker_unavailable" and summary["calls"]["ok"] == 1, summary
    assert asked == 2  # the session ended at the failed call, typed: the model was not asked again
    recorded = events(transcript)
    assert recorded[-1]["type"] == "session_end" and recorded[-1]["status"] == "stopped"
    failed = [e for e in recorded if e["type"] == "tool_result" and not e["ok"]]
    assert [(e["tool"], e["error"]["type"]) for e in failed] == [("read_file", "docker_unavailable")]
    assert marked(mark) == []


@pytest.mark.docker
def test_exec_killed_mid_call_exits_2_with_the_typed_error(daemon, tmp_path):
    ws = make_workspace(tmp_path / "ws")
    mark = uuid.uuid4().hex
    proc = subprocess.Popen(
        [OA, "exec", "--workspace", str(ws), "shell", json.dumps({"command": SLOW_CALL})],
        env=cli_env(tmp_path, daemon, mark),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(ws / "started", proc)
        daemon.kill()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, err
    result = json.loads(out)
    assert (
        result["ok"] is False
        and result["error"]["type"] == "docker_unavailable"
        and result["error"]["recoverable"] is False
    )
    assert "oa-sandbox: docker_unavailable:" in err
    assert marked(mark) == []


# -- the servers: ACP and MCP -------------------------------------------------------------------------
@pytest.mark.docker
def test_acp_reports_the_loss_on_that_prompt_and_serves_its_other_sessions_when_the_daemon_is_back(daemon, tmp_path):
    from acp import RequestError, text_block

    from tests.helpers.acp_editor import run_editor

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    mark = uuid.uuid4().hex
    with FakeModelServer() as server:
        server.openai_turn(tool_calls=[("shell", {"command": SLOW_CALL})])  # session A
        server.openai_turn(tool_calls=[("read_file", {"path": "a.txt"})])  # session B, after the daemon is back
        server.openai_turn("B done")
        server.openai_turn(tool_calls=[("shell", {"command": "echo from C"})])  # session C, new after the outage
        server.openai_turn("C done")

        async def body(conn, editor):
            a = await conn.new_session(cwd=str(ws), mcp_servers=[])
            b = await conn.new_session(cwd=str(ws), mcp_servers=[])
            assert len(containers(daemon)) == 2
            killed: list[float] = []

            async def kill_once_running(session_id, update):
                content = getattr(update, "content", None) or []
                if (
                    session_id == a.session_id
                    and not killed
                    and any("started" in getattr(c.content, "text", "") for c in content)
                ):
                    killed.append(time.monotonic())
                    await asyncio.to_thread(daemon.kill)

            editor.on_update = kill_once_running
            with pytest.raises(RequestError) as lost:
                await conn.prompt(session_id=a.session_id, prompt=[text_block("run it")])
            took = time.monotonic() - killed[0]
            editor.on_update = None
            await asyncio.to_thread(daemon.ensure_up)
            answer_b = await conn.prompt(session_id=b.session_id, prompt=[text_block("read it")])
            c = await conn.new_session(cwd=str(ws), mcp_servers=[])
            answer_c = await conn.prompt(session_id=c.session_id, prompt=[text_block("echo")])
            return lost.value, took, answer_b.stop_reason, answer_c.stop_reason

        run = run_editor(
            tmp_path,
            [
                "--model",
                "openai:fake",
                "--base-url",
                server.base_url,
                "--api-key-env",
                "OA_TEST_MODEL_KEY",
                "--transcript-dir",
                str(tmp_path / "t"),
            ],
            body,
            env={"OA_TEST_MODEL_KEY": "k", MARK: mark},
        )
    err, took, stop_b, stop_c = run.result
    assert err.code == -32603 and err.data["type"] == "docker_unavailable" and err.data["recoverable"] is False, (
        err.data
    )
    assert took < SLOW_S  # the loss was noticed, not waited out
    assert (stop_b, stop_c) == ("end_turn", "end_turn")
    texts = [
        getattr(u.content, "text", "")
        for u in run.editor.updates
        if getattr(u, "session_update", "") == "agent_message_chunk"
    ]
    assert texts == ["B done", "C done"]
    assert run.returncode == 0
    assert containers(daemon) == []  # A's and B's lost boxes too: removed once the daemon answered
    assert marked(mark) == []
    ends = [e for path in (tmp_path / "t").glob("*.jsonl") for e in events(path) if e["type"] == "session_end"]
    assert sorted((e.get("error") or {}).get("type", "") for e in ends) == ["", "", "docker_unavailable"]


@pytest.mark.docker
def test_mcp_reports_the_loss_on_that_call_and_serves_the_next_once_the_daemon_is_back(daemon, tmp_path):
    import anyio
    from mcp import Client, StdioServerParameters

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    mark = uuid.uuid4().hex
    transcript = tmp_path / "t.jsonl"
    env = cli_env(tmp_path, daemon, mark)
    server = StdioServerParameters(
        command=OA, args=["mcp", "--workspace", str(ws), "--transcript", str(transcript)], env=env
    )
    seen: dict[str, Any] = {}

    async def session() -> None:
        async with Client(server, read_timeout_seconds=120) as client:

            async def kill_when_started() -> None:
                await anyio.to_thread.run_sync(wait_for, ws / "started")
                seen["killed"] = time.monotonic()
                await anyio.to_thread.run_sync(daemon.kill)

            async with anyio.create_task_group() as tg:
                tg.start_soon(kill_when_started)
                seen["lost"] = await client.call_tool("shell", {"command": SLOW_CALL})
            seen["took"] = time.monotonic() - seen["killed"]
            seen["down"] = await client.call_tool("read_file", {"path": "a.txt"})
            await anyio.to_thread.run_sync(daemon.ensure_up)
            seen["back"] = await client.call_tool("shell", {"command": "cat a.txt"})

    anyio.run(session)
    for key in ("lost", "down"):
        assert seen[key].is_error and seen[key].structured_content["error"]["type"] == "docker_unavailable", seen[key]
    assert seen["took"] < SLOW_S  # the loss was noticed, not waited out
    assert not seen["back"].is_error and "a" in seen["back"].content[0].text
    assert containers(daemon) == []  # the lost box was removed once the daemon answered, the last one at exit
    assert marked(mark) == []
    recorded = events(transcript)
    assert recorded[-1]["type"] == "session_end"
    finished = [(e["tool"], (e.get("error") or {}).get("type")) for e in recorded if e["type"] == "tool_result"]
    assert finished == [("shell", "docker_unavailable"), ("read_file", "docker_unavailable"), ("shell", None)]
