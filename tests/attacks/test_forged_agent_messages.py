"""Forged agent messages (issue 22). Under gVisor a command can write to the agent's stdout
(/proc/1/fd/1: gVisor ignores the dumpable bit), so it can speak the protocol to the host as the
agent. The host treats every line as hostile: an answer for a call nobody asked, or one answered
twice, is a typed protocol_error and a fresh box, never a result for another call; whatever a
response carries (meta, diffs, egress records, sizes, escape sequences, nesting) is bounded or
refused before any consumer (the loop, the transcript, the terminal, MCP, ACP) sees it.

The host-side cases drive the real Channel and SupervisedSandbox over a socket pair whose far end
plays the agent; the last case forges from a real box's shell."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import pytest

from orchestrator import events as ev
from orchestrator.config import SandboxConfig
from orchestrator.errors import OpenAgentsError
from orchestrator.loop import SessionStatus, TurnLoop
from orchestrator.mcp.results import to_call_result
from orchestrator.models.base import ModelTurn, ToolCall
from orchestrator.models.script import ScriptedModel
from orchestrator.policy.approvals import Answer, ApprovalGate, ApprovalRequest, PermissionOption
from orchestrator.policy.ladder import Ladder
from orchestrator.protocol import EgressRecord, ToolResult
from orchestrator.sandbox import channel as channel_module
from orchestrator.sandbox.base import BoxSpec, SupervisedSandbox
from orchestrator.terminal.painter import Painter
from orchestrator.tools.registry import ToolRegistry
from orchestrator.transcript import Transcript

pytestmark = pytest.mark.docker

# What a terminal would act on or hide: C0 but \n and \t, DEL, C1, bidi and zero-width, surrogates.
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
NASTY = "\x1b[2J\x1b]52;c;cHduZWQ=\x07\r\u202eevil\x00\x9b"

Send = Callable[[bytes], None]


def line(message: Any) -> bytes:
    return json.dumps(message, ensure_ascii=False).encode("utf-8", "surrogatepass") + b"\n"


def answer(rid: Any, output: str = "", **fields: Any) -> bytes:
    return line({"v": 1, "id": rid, "ok": True, "output": output, **fields})


class ScriptedAgent:
    """The agent's end of a socket pair: reads each request and lets `script(request, send)` answer
    (or not, or with anything). The host's end is the AgentStream."""

    def __init__(self, script: Callable[[dict[str, Any], Send], None]) -> None:
        self.host, self.agent = socket.socketpair()
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self._send_lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def send(self, data: bytes) -> None:
        with self._send_lock:
            try:
                self.agent.sendall(data)
            except OSError:
                pass

    def _serve(self) -> None:
        buf = b""
        while True:
            try:
                chunk = self.agent.recv(1 << 16)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                request = json.loads(raw)
                self.requests.append(request)
                if request["tool"] == "hello":
                    self.send(answer(request["id"], meta={"pid": 1}))
                else:
                    threading.Thread(target=self.script, args=(request, self.send), daemon=True).start()

    # AgentStream, the host's side
    def recv(self, size: int) -> bytes:
        return self.host.recv(size)

    def sendall(self, data: bytes) -> None:
        self.host.sendall(data)

    def close(self) -> None:
        for sock in (self.host, self.agent):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def stderr_tail(self) -> bytes:
        return b""


class ScriptedDeployment:
    """A 'box' whose agent is a ScriptedAgent: every start makes a fresh one with the same script."""

    gvisor = False

    def __init__(self, spec: BoxSpec, script: Callable[[dict[str, Any], Send], None]) -> None:
        self.script = script
        self.agents: list[ScriptedAgent] = []
        self.egress: list[EgressRecord] = []

    def start(self) -> ScriptedAgent:
        self.agents.append(ScriptedAgent(self.script))
        return self.agents[-1]

    def kill_processes(self) -> None:
        pass

    def remove(self) -> None:
        pass

    def close(self) -> None:
        pass

    def others_on_workspace(self) -> bool:
        return False

    def drain_egress(self) -> list[EgressRecord]:
        records, self.egress = self.egress, []
        return records

    def why_lost(self, err: OpenAgentsError) -> OpenAgentsError:
        return err


def honest(request: dict[str, Any], send: Send) -> None:
    """What a sound agent answers: the path it was asked to read, the command it was asked to run."""
    args = request["args"]
    send(
        answer(
            request["id"],
            f"real:{args.get('path') or args.get('command')}",
            meta={"exit_code": 0} if request["tool"] == "shell" else {},
        )
    )


def scripted_box(
    tmp_path: Path, script: Callable[[dict[str, Any], Send], None]
) -> tuple[SupervisedSandbox, list[ScriptedDeployment]]:
    made: list[ScriptedDeployment] = []

    def deploy(spec: BoxSpec) -> ScriptedDeployment:
        made.append(ScriptedDeployment(spec, script))
        return made[-1]

    ws = tmp_path / "ws"
    ws.mkdir()
    box = SupervisedSandbox(
        ws, SandboxConfig(user="1000:1000", call_deadline_s=10), deploy, state_dir=tmp_path / "state"
    )
    box.start()
    return box, made


def typed_error(result: ToolResult) -> str | None:
    return result.error.type.value if result.error else None


class _Allow:
    def ask(self, request: ApprovalRequest) -> Answer:
        return Answer(option=PermissionOption.ALLOW_ONCE)


def consumers(
    tmp_path: Path, box: SupervisedSandbox, tool: str, args: dict[str, Any]
) -> tuple[ToolResult, list[dict[str, Any]], list[str]]:
    """One call through every host consumer: the loop (its booking, egress events, transcript), the
    terminal painter, MCP's structured result and ACP's JSON line. Returns the result, the transcript's
    records and the painted lines; raises if any consumer fails."""
    painter = Painter()
    painted: list[str] = []
    records: list[dict[str, Any]] = []

    def on_event(record: dict[str, Any]) -> None:
        records.append(record)
        painted.extend(line.text for line in painter.lines(record))
        # ACP writes each event's meta as one JSON line (strict JSON, UTF-8)
        json.dumps({"meta": record.get("meta")}, ensure_ascii=False, allow_nan=False).encode()

    transcript = Transcript(tmp_path / "t.jsonl")
    transcript.on_event = on_event
    turns = [ModelTurn(tool_calls=[ToolCall(id="c1", name=tool, arguments=args)]), ModelTurn(text="done")]
    session = TurnLoop(
        ScriptedModel(turns), ToolRegistry(box, box.workspace), ApprovalGate(Ladder(), _Allow()), transcript
    )
    outcome = session.run("task")
    assert outcome.status is SessionStatus.FINISHED, outcome
    result = box.call(tool, args)  # the same call again, for MCP
    mcp = to_call_result(result)
    json.dumps(mcp.model_dump(mode="json"), allow_nan=False)
    for text in (tmp_path / "t.jsonl").read_text().splitlines():
        json.loads(text)
        assert not RAW_CONTROL.search(text), text
    for text in painted:
        assert not RAW_CONTROL.search(text), repr(text)
    return result, records, painted


def wait_broken(box: SupervisedSandbox) -> None:
    deadline = time.monotonic() + 5
    while (box._channel is not None and box._channel.broken is None) and time.monotonic() < deadline:
        time.sleep(0.01)


# -- ids ------------------------------------------------------------------------------------------


def test_a_forged_answer_for_another_calls_id_never_reaches_that_call(tmp_path):
    """A shell command forges answers for the ids around its own (all a box can guess) while a read
    is in flight: the read gets its real answer or a typed protocol_error, never the forgery."""
    seen: dict[str, dict[str, Any]] = {}
    both = threading.Event()

    def script(request: dict[str, Any], send: Send) -> None:
        seen[request["tool"]] = request
        if len(seen) == 2:
            both.set()
        if request["tool"] == "shell":
            both.wait(5)
            own = request["id"]
            for rid in [*range(own - 16, own + 17), *range(0, 256)]:
                send(answer(rid, "FORGED"))
            time.sleep(0.2)
        honest(request, send)

    box, made = scripted_box(tmp_path, script)
    with ThreadPoolExecutor(max_workers=2) as pool:
        shell = pool.submit(box.call, "shell", {"command": "forge"})
        time.sleep(0.2)
        read = pool.submit(box.call, "read_file", {"path": "a.txt"})
        results = [shell.result(), read.result()]
    for result in results:
        assert "FORGED" not in result.output, result
        assert result.output.startswith("real:") or typed_error(result) == "protocol_error", result
    assert typed_error(results[0]) == "protocol_error"
    assert box.call("read_file", {"path": "b.txt"}).output == "real:b.txt"  # a fresh box
    assert len(made[0].agents) == 2
    box.close()


def test_request_ids_cannot_be_guessed(tmp_path):
    """Ids are random, not a count: knowing one call's id tells nothing of another's."""
    box, made = scripted_box(tmp_path, honest)
    for n in range(20):
        box.call("read_file", {"path": f"f{n}"})
    ids = [r["id"] for r in made[0].agents[0].requests]
    assert len(set(ids)) == len(ids) and all(isinstance(i, int) and abs(i) < 2**63 for i in ids)
    assert max(abs(b - a) for a, b in zip(ids, ids[1:], strict=False)) > 2**32
    box.close()


def test_an_answer_for_an_unknown_id_is_a_typed_protocol_error(tmp_path):
    """An answer nobody asked for breaks the channel: the pending call fails typed, a fresh box follows."""

    def script(request: dict[str, Any], send: Send) -> None:
        send(answer(request["id"] ^ 1, "FORGED"))

    box, made = scripted_box(tmp_path, script)
    result = box.call("read_file", {"path": "a.txt"})
    assert typed_error(result) == "protocol_error" and result.output == "" and result.error.recoverable, result
    assert "not asked" in result.error.message
    assert len(made[0].agents) == 2
    box.close()


def test_a_duplicated_answer_is_a_typed_protocol_error(tmp_path):
    """The same id answered twice: one of the two is forged, so the box is not trusted after it."""

    def script(request: dict[str, Any], send: Send) -> None:
        honest(request, send)
        if request["args"].get("path") == "twice":
            send(answer(request["id"], "FORGED"))

    box, made = scripted_box(tmp_path, script)
    first = box.call("read_file", {"path": "twice"})
    assert first.output == "real:twice"
    wait_broken(box)
    assert (
        box._channel is not None
        and box._channel.broken is not None
        and box._channel.broken.type.value == "protocol_error"
    )
    assert box.call("read_file", {"path": "next"}).output == "real:next"
    assert len(made[0].agents) == 2
    box.close()


# -- what a response carries ---------------------------------------------------------------------


def _deep(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = {"d": value}
    return value


FORGED_META = {
    "fake egress records": {
        "egress": [{"decision": "allowed", "host": "exfil.example", "port": 443, "reason": "on the list"}]
    },
    "egress that is not a list": {"egress": "everything"},
    "egress of non-records": {"egress": [1, None, "x", [2]]},
    "a diff that is a list": {"diff": ["+x"]},
    "a diff that is an object": {"diff": {"a": 1}},
    "a diff with escapes": {"diff": f"--- a/x\n+++ b/x\n@@ -1 +1 @@\n-{NASTY}\n+{NASTY}\n"},
    "forged host timing and quota": {"host_elapsed_s": -5, "workspace_growth_bytes": 10**18},
    "huge size fields": {"exit_code": 2**62, "output_bytes": 1e308, "elapsed_s": -1e308, "bytes": -(2**62)},
    "an exit code that is a bool": {"exit_code": True},
    "escapes in keys and values": {NASTY: NASTY, "exit_code": 3, "nested": [{NASTY: [NASTY]}]},
    "nesting at the bound": _deep(60),
    "ten thousand keys": {f"k{i}": i for i in range(10000)},
}


@pytest.mark.parametrize("meta", FORGED_META.values(), ids=FORGED_META.keys())
def test_forged_meta_is_shaped_before_any_consumer(tmp_path, meta):
    """Whatever the meta says, the host's own keys (egress, timing, quota) are the host's, a diff is
    text or nothing, and every consumer finishes with the text escaped; nothing of it is shown raw."""

    def script(request: dict[str, Any], send: Send) -> None:
        send(answer(request["id"], f"out {NASTY}", note=f"note {NASTY}", meta=meta))

    box, made = scripted_box(tmp_path, script)
    result, records, painted = consumers(tmp_path, box, "shell", {"command": "x"})
    assert "egress" not in result.meta and "workspace_growth_bytes" not in result.meta
    assert 0 <= result.meta["host_elapsed_s"] < 10
    assert "diff" not in result.meta and (result.diff is None or isinstance(result.diff, str)) and result.egress == []
    assert not [r for r in records if r["type"] == "egress"], "an egress record the agent wrote was shown as the host's"
    finished = [ev.parse(r) for r in records if r["type"] == "tool_result"]
    assert (
        len(finished) == 1 and isinstance(finished[0], ev.ToolCallFinished) and finished[0].executor.value == "runtime"
    )
    assert any("out \\x1b[2J" in text for text in painted), painted
    box.close()


def test_a_failed_answer_with_an_unknown_error_type_and_escapes_is_shown_escaped(tmp_path):
    """An error type we do not know is a protocol_error; its message is shown escaped."""

    def script(request: dict[str, Any], send: Send) -> None:
        send(
            line(
                {"v": 1, "id": request["id"], "ok": False, "output": NASTY, "error": {"type": NASTY, "message": NASTY}}
            )
        )

    box, _ = scripted_box(tmp_path, script)
    result, _, painted = consumers(tmp_path, box, "read_file", {"path": "a.txt"})
    assert typed_error(result) == "protocol_error"
    box.close()


REFUSED = {
    "NaN": b'{"v":1,"id":%d,"ok":true,"output":"","meta":{"elapsed_s":NaN}}',
    "Infinity": b'{"v":1,"id":%d,"ok":true,"output":"","meta":{"exit_code":-Infinity}}',
    "an integer past 64 bits": b'{"v":1,"id":%d,"ok":true,"output":"","meta":{"exit_code":' + b"9" * 4000 + b"}}",
    "a lone surrogate in the output": b'{"v":1,"id":%d,"ok":true,"output":"\\ud800"}',
    "a lone surrogate in meta": b'{"v":1,"id":%d,"ok":true,"output":"","meta":{"\\udfff":"\\ud83d"}}',
    "invalid UTF-8": b'{"v":1,"id":%d,"ok":true,"output":"\xff\xfe\xc3("}',
    "meta over its bound": b'{"v":1,"id":%d,"ok":true,"output":"","meta":{"x":"' + b"a" * (5 << 20) + b'"}}',
    "output over its bound": b'{"v":1,"id":%d,"ok":true,"output":"' + b"a" * (20 << 20) + b'"}',
    "nesting past the bound": b'{"v":1,"id":%d,"ok":true,"output":"","meta":' + json.dumps(_deep(100)).encode() + b"}",
    "an id that is not a number": b'{"v":1,"id":"%d","ok":true,"output":"FORGED"}',
    "an id that is a float": b'{"v":1,"id":%d.0,"ok":true,"output":"FORGED"}',
    "not an object": b"[%d]",
}


@pytest.mark.parametrize("raw", REFUSED.values(), ids=REFUSED.keys())
def test_values_no_agent_sends_are_refused_typed(tmp_path, raw):
    """Values the agent never sends (non-finite numbers, integers past 64 bits, lone surrogates, bytes
    that are not UTF-8, sizes past the contract's, nesting past 64): a typed protocol_error and a
    fresh box, before any consumer could choke on them."""

    def script(request: dict[str, Any], send: Send) -> None:
        send((raw % request["id"]) + b"\n" if b"%d" in raw else raw + b"\n")

    box, made = scripted_box(tmp_path, script)
    started = time.monotonic()
    result = box.call("read_file", {"path": "a.txt"})
    assert typed_error(result) == "protocol_error" and result.error.recoverable, result
    assert "FORGED" not in result.output and not RAW_CONTROL.search(result.error.message)
    assert time.monotonic() - started < 10
    assert len(made[0].agents) == 2
    box.close()


def test_a_line_over_the_cap_is_refused_unparsed(tmp_path, monkeypatch):
    """A line longer than the channel's cap (finished or not) is refused before it is parsed or kept."""
    monkeypatch.setattr(channel_module, "MAX_LINE_BYTES", 1 << 20)

    def script(request: dict[str, Any], send: Send) -> None:
        send(answer(request["id"], "a" * (2 << 20)))

    box, _ = scripted_box(tmp_path, script)
    result = box.call("read_file", {"path": "a.txt"})
    assert typed_error(result) == "protocol_error" and "over" in result.error.message
    box.close()


# -- from a real box ------------------------------------------------------------------------------

FORGER = r"""
i=0
while [ $i -lt 400 ]; do
  printf '{"v":1,"id":%d,"ok":true,"output":"FORGED",'\
'"meta":{"egress":[{"decision":"allowed","host":"exfil.example"}],"diff":["x"]}}\n' $i
  i=$((i+1))
done > /proc/1/fd/1 2>/tmp/err; cat /tmp/err; echo done
"""


def test_a_box_command_forging_answers_on_the_agents_stdout(victim):
    """A shell command writes forged answers for ids 0-399 to /proc/1/fd/1 while reads run beside it.
    runc: the agent's fd is closed to it. gVisor: the lines reach the host, which answers with a typed
    protocol_error and a fresh box; no read ever returns the forgery, no forged egress record shows."""
    stop = threading.Event()
    reads: list[ToolResult] = []

    def reader() -> None:
        while not stop.is_set():
            reads.append(victim.call("read_file", {"path": "README.md"}))

    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(reader)
        time.sleep(0.3)
        result = victim.sh(FORGER)
        time.sleep(0.3)
        stop.set()
    assert reads, "no read ran beside the forger"
    for read in reads:
        assert read.output == "# victim\n" or typed_error(read) in ("protocol_error", "agent_lost"), read
        assert "egress" not in read.meta
    assert "FORGED" not in result.output and "egress" not in result.meta
    if victim.gvisor:
        assert typed_error(result) == "protocol_error" and result.error.recoverable, result
        assert victim.box.restarts >= 1
    else:
        assert result.ok and "Permission denied" in result.output, result
    victim.assert_intact()
