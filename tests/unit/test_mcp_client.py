"""MCP tools in: a real stdio MCP server, written here with the SDK's MCPServer (v1's FastMCP),
started on the host through McpHost; its tool reaches the model under mcp__<server>__<tool>, calls
work, and a crashing or stalling server gives a typed error within the deadline. No process is
left once the host is closed."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from orchestrator.errors import ErrorType
from orchestrator.models.base import ToolCall
from orchestrator.policy.ladder import Decision, Ladder, Level, PolicyRule
from orchestrator.tools.mcp.client import McpHost

pytestmark = pytest.mark.timeout(120)

SERVER = '''
import os, sys, time
from mcp.server.mcpserver import MCPServer

app = MCPServer("notes")

@app.tool()
def add_note(text: str, times: int = 1) -> str:
    """Store a note and say so."""
    with open(os.environ["NOTES_FILE"], "a") as fh:
        fh.write(text * times + "\\n")
    return "stored: " + text * times

@app.tool()
def crash() -> str:
    """Exit the whole server mid-call."""
    os._exit(3)

@app.tool()
def stall(seconds: float) -> str:
    """Sleep longer than anyone waits."""
    if os.environ.get("STALL_MARK"):  # the test's readiness signal: the call runs
        open(os.environ["STALL_MARK"], "w").close()
    time.sleep(seconds)
    return "late"

@app.tool()
def pid() -> str:
    """The server's process id."""
    return str(os.getpid())

if os.environ.get("SLOW_START"):
    if os.environ.get("START_MARK"):  # the test's readiness signal: this server is starting
        open(os.environ["START_MARK"], "w").close()
    time.sleep(float(os.environ["SLOW_START"]))
app.run()
'''


@pytest.fixture
def server_script(tmp_path: Path) -> Path:
    path = tmp_path / "notes_server.py"
    path.write_text(SERVER)
    return path


def spec(script: Path, tmp_path: Path, name: str = "notes", **env: str) -> dict:
    # ACP's McpServerStdio shape: env as a list of {name, value}
    env = {"NOTES_FILE": str(tmp_path / "notes.txt"), **env}
    return {
        "name": name,
        "command": sys.executable,
        "args": [str(script)],
        "env": [{"name": k, "value": v} for k, v in env.items()],
    }


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def when(ready: Path, act, within: float = 90.0) -> None:
    """`act()` from another thread once `ready` exists (a readiness signal, not a guess of how long
    the machine takes): at most `within` seconds from now, else never, and the test's wait fails."""
    import threading

    def watch() -> None:
        deadline = time.monotonic() + within
        while not ready.exists():
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        act()

    threading.Thread(target=watch, daemon=True).start()


def gone(pid_or_script, within: float = 60.0) -> bool:
    """Whether the process (a pid), or every process of a script, is gone within `within` seconds:
    a generous bound, so a loaded machine's slow reaping is not taken for a process left running."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not (alive(pid_or_script) if isinstance(pid_or_script, int) else running(pid_or_script)):
            return True
        time.sleep(0.05)
    return False


def running(script: Path) -> list[int]:
    """Live processes whose command line names the script."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(script).encode() in (entry / "cmdline").read_bytes() and alive(int(entry.name)):
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


def test_tools_listed_called_and_stopped(server_script, tmp_path):
    host = McpHost([spec(server_script, tmp_path)], call_deadline_s=20, log_dir=tmp_path / "logs").start()
    try:
        assert host.problems == []
        assert sorted(host.names()) == [
            "mcp__notes__add_note",
            "mcp__notes__crash",
            "mcp__notes__pid",
            "mcp__notes__stall",
        ]
        openai = {d["function"]["name"]: d["function"] for d in host.declarations("openai")}
        assert openai["mcp__notes__add_note"]["parameters"]["required"] == ["text"]
        gemini = {d["name"]: d for d in host.declarations("gemini")}
        assert gemini["mcp__notes__add_note"]["parameters"]["properties"]["text"]["type"] == "STRING"

        prepared = host.prepare(ToolCall(id="c1", name="mcp__notes__add_note", arguments='{"text": "hi", "times": 2}'))
        assert (prepared.spec.side, prepared.kind, prepared.action) == ("host", "other", "mcp notes")
        # The default ladder asks every time; a policy can switch the server or one tool off.
        assert Ladder().level(prepared.spec.name, prepared.kind, prepared.action)[0] == Level.ASK_EVERY_TIME
        off = Ladder([PolicyRule(action="mcp notes", decision="deny")])
        assert off.level(prepared.spec.name, prepared.kind, prepared.action)[0] == Level.REFUSE
        result = host.invoke(prepared)
        assert result.ok, result
        assert "stored: hihi" in result.output
        assert (tmp_path / "notes.txt").read_text() == "hihi\n"  # it ran on the host

        with pytest.raises(Exception) as bad:
            host.prepare(ToolCall(id="c2", name="mcp__notes__add_note", arguments={"times": 2}))
        assert getattr(bad.value, "type", None) == ErrorType.INVALID_ARGUMENTS
        server_pid = int(host.call("mcp__notes__pid", {}).output)
        assert alive(server_pid)
    finally:
        host.close()
    deadline = time.monotonic() + 5
    while alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(server_pid), "the MCP server outlived the session"


def test_crash_and_stall_are_typed_within_the_deadline(server_script, tmp_path):
    """A stalled call ends at the deadline and its server is killed (not left holding a sleeping
    call) and dropped; a crash is typed at once; a third server goes on."""
    host = McpHost(
        [spec(server_script, tmp_path, "a"), spec(server_script, tmp_path, "b"), spec(server_script, tmp_path, "c")],
        call_deadline_s=3,
    ).start()
    try:
        stalled_pid = int(host.call("mcp__b__pid", {}).output)
        started = time.monotonic()
        stalled = host.call("mcp__b__stall", {"seconds": 60})
        assert not stalled.ok and stalled.error.type == ErrorType.TIMEOUT
        assert "did not answer" in stalled.error.message and "stopped" in stalled.error.message
        assert time.monotonic() - started < 6
        deadline = time.monotonic() + 3
        while alive(stalled_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(stalled_pid), "the stalled server was left running"
        after = host.call("mcp__b__pid", {})
        assert not after.ok and after.error.type == ErrorType.AGENT_LOST

        started = time.monotonic()
        crashed = host.call("mcp__a__crash", {})
        assert not crashed.ok and crashed.error.type in (ErrorType.AGENT_LOST, ErrorType.TIMEOUT)
        assert time.monotonic() - started < 6
        again = host.call("mcp__a__pid", {})
        assert not again.ok and again.error.type == ErrorType.AGENT_LOST  # at once: the server is known gone
        b_pid = int(host.call("mcp__c__pid", {}).output)  # the other server goes on
    finally:
        host.close()
    time.sleep(0.5)
    assert not alive(b_pid)


def test_slow_start_and_bad_command_leave_the_others(server_script, tmp_path):
    servers = [
        spec(server_script, tmp_path, "slow", SLOW_START="30"),
        {"name": "missing", "command": str(tmp_path / "no-such-server")},
        spec(server_script, tmp_path, "ok"),
        {"name": "web", "type": "http", "url": "http://127.0.0.1:9/"},
    ]
    started = time.monotonic()
    host = McpHost(servers, start_deadline_s=4, call_deadline_s=5).start()
    try:
        assert time.monotonic() - started < 15
        assert all(n.startswith("mcp__ok__") for n in host.names()) and host.names()
        assert any("slow" in p and "did not answer" in p for p in host.problems)
        assert any("missing" in p for p in host.problems)
        assert any("web" in p and "stdio" in p for p in host.problems)
        assert host.call("mcp__ok__add_note", {"text": "x"}).ok
        assert 1 <= len(running(server_script)) <= 2  # ok (and slow, if it is not yet killed)
    finally:
        host.close()
    assert running(server_script) == [], "a server (the slow one too) outlived the session"


def test_through_the_registry_and_the_ladder(server_script: Path, tmp_path: Path) -> None:
    """The turn loop sees the MCP tool like a built-in: declared, asked about every time, run, its
    result back to the model; a policy deny on the server refuses without asking."""
    from orchestrator.loop import TurnLoop
    from orchestrator.models.base import ModelTurn
    from orchestrator.models.script import ScriptedModel
    from orchestrator.policy.approvals import Answer, ApprovalGate, PermissionOption
    from orchestrator.tools.registry import RegistryConfig, ToolRegistry
    from orchestrator.transcript import Transcript

    asked = []

    class Approver:
        def ask(self, request):
            asked.append((request.tool, request.level))
            return Answer(option=PermissionOption.ALLOW_ONCE)

    call = lambda i: ToolCall(id=f"c{i}", name="mcp__notes__add_note", arguments={"text": f"n{i}"})  # noqa: E731
    with McpHost([spec(server_script, tmp_path)], call_deadline_s=20) as host:
        registry = ToolRegistry(
            None,  # type: ignore[arg-type]
            tmp_path,
            RegistryConfig(git=False, disabled={"mcp__notes__crash"}),
            host_tools=host,
        )
        names = [d["function"]["name"] for d in registry.declarations("openai")]
        assert "mcp__notes__add_note" in names and "read_file" in names and "mcp__notes__crash" not in names
        model = ScriptedModel(
            [ModelTurn(tool_calls=[call(1)]), ModelTurn(tool_calls=[call(2)]), ModelTurn(text="done")]
        )
        session = TurnLoop(model, registry, ApprovalGate(Ladder(), Approver()), Transcript(tmp_path / "t.jsonl"))
        result = session.run("take notes")
        assert result.final_text == "done"
        assert asked == [("mcp__notes__add_note", Level.ASK_EVERY_TIME)] * 2  # every time, not once
        assert any(m.role == "tool" and "stored: n1" in m.content for m in session.messages)

        denied = TurnLoop(
            ScriptedModel([ModelTurn(tool_calls=[call(3)]), ModelTurn(text="ok")]),
            registry,
            ApprovalGate(Ladder([PolicyRule(action="mcp notes", decision=Decision.DENY)]), Approver()),
            Transcript(None),
        )
        denied.run("again")
        assert len(asked) == 2 and any("refused_by_policy" in (m.content or "") for m in denied.messages)
    assert (tmp_path / "notes.txt").read_text() == "n1\nn2\n"


def test_a_tool_whose_schema_nests_too_deep_is_left_out():
    """A server's schema is used to check the model's arguments and is rewritten per model family,
    both recursively: one nested past MAX_SCHEMA_DEPTH leaves its tool out, as an oversized one does."""
    from mcp.types import Tool

    from orchestrator.tools.mcp.client import MAX_SCHEMA_DEPTH, _tool

    def nested(levels: int) -> dict:
        inner: dict = {"type": "string"}
        for _ in range(levels):
            inner = {"type": "object", "properties": {"x": inner}}
        return inner

    shallow = Tool.model_validate({"name": "ok", "inputSchema": nested(3)})
    deep = Tool.model_validate({"name": "deep", "inputSchema": nested(MAX_SCHEMA_DEPTH)})
    assert _tool("s", shallow) is not None
    assert _tool("s", deep) is None


def test_ctrl_c_and_kill_running_end_a_stalled_call_at_once(server_script, tmp_path):
    """Ctrl-C while a call waits, and kill_running (what --max-wall's timer calls), end the call at
    once and kill its server, not at the call's deadline and not only when the host is closed. Each
    is sent once the server runs the call (it says so in a file); "at once" is well before the
    call's 100 s deadline, with room for a loaded machine."""
    import signal

    marks = {name: tmp_path / f"stalling-{name}" for name in ("a", "b")}
    host = McpHost(
        [spec(server_script, tmp_path, name, STALL_MARK=str(marks[name])) for name in ("a", "b")], call_deadline_s=100
    ).start()
    try:
        assert host.call_deadline_s == 100
        a_pid = int(host.call("mcp__a__pid", {}).output)
        b_pid = int(host.call("mcp__b__pid", {}).output)
        when(marks["a"], lambda: os.kill(os.getpid(), signal.SIGINT))
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            host.call("mcp__a__stall", {"seconds": 600})
        assert marks["a"].exists() and time.monotonic() - started < 60
        assert gone(a_pid), "Ctrl-C left the stalled server running"

        when(marks["b"], host.kill_running)
        started = time.monotonic()
        cut = host.call("mcp__b__stall", {"seconds": 600})
        assert (
            marks["b"].exists()
            and not cut.ok
            and cut.error.type == ErrorType.CANCELLED
            and time.monotonic() - started < 60
        )
        assert gone(b_pid), "kill_running left the stalled server running"
    finally:
        host.close()


def test_the_call_deadline_is_the_shell_limit():
    from sandbox_agent.limits import SHELL_DEFAULT_TIMEOUT_S, SHELL_MAX_TIMEOUT_S

    assert McpHost([]).call_deadline_s == SHELL_DEFAULT_TIMEOUT_S == 60
    assert McpHost([], call_deadline_s=10_000).call_deadline_s == SHELL_MAX_TIMEOUT_S == 240
    assert McpHost([], call_deadline_s=5).call_deadline_s == 5


def test_json_values_are_counted_outside_strings_only():
    from orchestrator.tools.mcp.transport import json_values

    assert json_values(b'{"a": [1, 2, {"b": []}]}', 0) == 6  # { [ , , { [
    text = b'{"t": "' + b"[,{" * 1000 + b'\\" , \\\\", "u": 1}'  # brackets and commas in strings, escaped quotes
    assert json_values(text, 10) == 2
    assert json_values(b"[" + b"[]," * 100_000 + b"[]]", 1000) > 1000


def test_a_call_approved_after_max_wall_does_not_start(server_script: Path, tmp_path: Path) -> None:
    """--max-wall passes while the user is still at the approval prompt: the MCP call is not started
    afterwards (it would otherwise run, up to its own deadline, past the session's)."""
    from orchestrator.budget import Budget
    from orchestrator.loop import TurnLoop
    from orchestrator.models.base import ModelTurn
    from orchestrator.models.script import ScriptedModel
    from orchestrator.policy.approvals import Answer, ApprovalGate, PermissionOption
    from orchestrator.tools.registry import RegistryConfig, ToolRegistry
    from orchestrator.transcript import Transcript

    class SlowApprover:
        def ask(self, request):
            time.sleep(2.5)  # --max-wall (1 s) passes meanwhile
            return Answer(option=PermissionOption.ALLOW_ONCE)

    class NoBox:
        def kill_processes(self) -> None:
            pass

    call = ToolCall(id="c1", name="mcp__notes__add_note", arguments={"text": "late"})
    with McpHost([spec(server_script, tmp_path)], call_deadline_s=20) as host:
        registry = ToolRegistry(NoBox(), tmp_path, RegistryConfig(git=False), host_tools=host)  # type: ignore[arg-type]
        model = ScriptedModel([ModelTurn(tool_calls=[call]), ModelTurn(text="done")])
        session = TurnLoop(
            model,
            registry,
            ApprovalGate(Ladder(), SlowApprover()),
            Transcript(tmp_path / "t.jsonl"),
            budget=Budget(max_wall_s=1),
        )
        result = session.run("note it")
    assert result.error is not None and result.error.type == ErrorType.BUDGET_EXCEEDED
    assert not (tmp_path / "notes.txt").exists(), "the call ran after the time budget was spent"


def test_ctrl_c_while_servers_start_leaves_none_running(server_script, tmp_path):
    """Ctrl-C while a server is still starting: start() raises, and no server is left running (the
    caller never got a host to close). Sent once the slow server is in its start (it says so in a
    file), which it would not leave before the start's deadline."""
    import signal

    mark = tmp_path / "starting"
    host = McpHost(
        [
            spec(server_script, tmp_path, "ok"),
            spec(server_script, tmp_path, "slow", SLOW_START="600", START_MARK=str(mark)),
        ],
        start_deadline_s=100,
    )
    when(mark, lambda: os.kill(os.getpid(), signal.SIGINT))
    with pytest.raises(KeyboardInterrupt):
        host.start()
    assert mark.exists()
    assert gone(server_script), f"left running: {running(server_script)}"
