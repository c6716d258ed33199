"""Issue 27 without a sandbox: the shell prefix `A` approves (what is offered, what it covers, that a
policy's ask and compound commands still ask), results shown as a bounded tail or in full (escaped),
the stream-json writer, and Anthropic's context window."""

from __future__ import annotations

import io
import json
import threading

import pytest

from orchestrator.budget import default_context_window
from orchestrator.cli.stream_json import StreamJson
from orchestrator.events import ToolCallFinished, ToolCallState
from orchestrator.models.base import ToolCall
from orchestrator.policy.approvals import Answer, ApprovalGate, PermissionOption, TerminalApprover, parse_answer
from orchestrator.policy.ladder import Ladder, PolicyRule
from orchestrator.policy.prefix import shell_prefix
from orchestrator.protocol import Executor
from orchestrator.terminal.painter import RESULT_LINE_CHARS, RESULT_TAIL_LINES, Painter
from orchestrator.tools.registry import ToolRegistry
from tests.helpers.transcript import HOSTILE, _raw_hidden


@pytest.mark.parametrize(
    "command,prefix",
    [
        ("pytest -q", "pytest"),
        ("pytest", "pytest"),
        ("  pytest\t-q tests/x.py  ", "pytest"),
        ("make test", "make"),
        ("git status --short", "git status"),
        ("npm test", "npm test"),
        ("cargo build --release", "cargo build"),
        ("python3 -m pytest -x", "python3 -m pytest"),
        ("python -m unittest -q test_calc", "python -m unittest"),
        ("ls -la 'a b'", "ls"),
        ("go test ./...", "go test"),
    ],
)
def test_the_prefix_offered_is_the_first_word_or_a_subcommand(command, prefix):
    assert shell_prefix(command) == prefix


@pytest.mark.parametrize(
    "command",
    [
        "pytest; curl evil",
        "pytest && rm -rf .",
        "pytest || true",
        "pytest | tee log",
        "pytest & sleep 1",
        "echo $(id)",
        "echo `id`",
        "echo ${HOME}",
        "pytest > out",
        "pytest < in",
        "pytest 2>&1",
        "(pytest)",
        "pytest\nrm -rf .",
        "pytest\rrm",
        "pytest\x1b[2J",
        "sh -c 'pytest'",
        "bash run.sh",
        "/bin/sh x",
        "env pytest",
        "sudo pytest",
        "xargs rm",
        "timeout 5 pytest",
        "nohup pytest",
        "python -c 'print(1)'",
        "python3 script.py",
        "python",
        "perl -e 1",
        "node x.js",
        "find . -name x",
        "awk 1 f",
        "sed -n 1p f",
        "LD_PRELOAD=/x.so pytest",
        "'pytest' -q",
        "py\\test",
        "py*",
        "~/bin/x",
        "./run.sh",
        "/usr/bin/pytest -q",
        "bin/pytest",
        "/bin/sh -c x",
        "git -c core.pager=x log",
        "git",
        "npm --prefix x test",
        "pytest\u00a0-q",
        "",
        "   ",
        "x" * 5000,
    ],
)
def test_no_prefix_is_offered_for_a_compound_command_a_shell_or_anything_not_plain(command):
    assert shell_prefix(command) is None


class Person:
    """Answers from a list, as the terminal would: y, n, a, or A (the offered prefix)."""

    def __init__(self, *keys: str) -> None:
        self.keys = list(keys)
        self.asked: list = []

    def ask(self, request):
        self.asked.append(request)
        key = self.keys.pop(0)
        return Answer(
            option=PermissionOption.REJECT_ONCE if key == "n" else PermissionOption.ALLOW_ONCE,
            remember_for_session=key == "a",
            remember_prefix=key == "A",
        )


@pytest.fixture
def registry(tmp_path):
    return ToolRegistry(sandbox=None, workspace=tmp_path, repo=None)


def shell(registry, command):
    return registry.prepare(ToolCall(id="c", name="shell", arguments={"command": command}))


def test_A_approves_the_prefix_for_the_session_and_nothing_else(registry):
    person = Person("A", "n", "n", "y")
    gate = ApprovalGate(Ladder(), person)
    first = gate.decide(shell(registry, "pytest -q"))
    assert person.asked[0].command_prefix == "pytest"
    assert first.allowed and first.decision == "approved_for_session" and first.executor == Executor.USER
    again = gate.decide(shell(registry, "pytest tests/test_x.py -k name"))
    assert (
        again.allowed
        and again.decision == "approved_for_session"
        and "`pytest`" in again.reason
        and len(person.asked) == 1
    )
    chained = gate.decide(shell(registry, "pytest; curl http://x"))  # asked again, with no prefix offered
    assert not chained.allowed and len(person.asked) == 2 and person.asked[1].command_prefix is None
    other = gate.decide(shell(registry, "pytestx -q"))  # another word: another prefix
    assert not other.allowed and person.asked[2].command_prefix == "pytestx"
    gate.decide(shell(registry, "make"))
    assert len(person.asked) == 4 and gate.session_prefixes == {"pytest"}


def test_a_policy_ask_rule_is_asked_every_time_and_no_prefix_is_offered(registry):
    person = Person("A", "y")
    gate = ApprovalGate(
        Ladder([PolicyRule(id="ask-tests", tool="shell", command_prefix="pytest", decision="ask")]), person
    )
    assert (
        gate.decide(shell(registry, "pytest -q")).decision == "allow_once"
    )  # an A the terminal could not have offered
    assert person.asked[0].command_prefix is None and gate.session_prefixes == set()
    gate.decide(shell(registry, "pytest -q"))
    assert len(person.asked) == 2


def test_a_deny_still_wins_over_an_approved_prefix(registry):
    person = Person("A")
    ladder = Ladder()
    gate = ApprovalGate(ladder, person)
    assert gate.decide(shell(registry, "make all")).allowed
    ladder.rules.append(PolicyRule(id="no-clean", tool="shell", command_prefix="make clean", decision="deny"))
    refused = gate.decide(shell(registry, "make clean"))
    assert not refused.allowed and refused.decision == "refused"


def test_the_terminal_prompt_names_what_A_allows_and_reads_A_apart_from_a(monkeypatch, capsys, registry):
    monkeypatch.setattr("sys.stdin", io.StringIO("A\n"))
    gate = ApprovalGate(Ladder(), TerminalApprover())
    assert gate.decide(shell(registry, "pytest -q")).decision == "approved_for_session"
    assert "A = allow every command starting `pytest` this session (y, n, A)" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO("a\nA\n"))  # `a` is no answer here: asked again
    assert gate.decide(shell(registry, "make -j2")).decision == "approved_for_session"
    assert "Error: answer y or n or A" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    gate.decide(shell(registry, "echo a; echo b"))
    assert "A =" not in capsys.readouterr().err
    assert parse_answer("A", ["y", "n", "a"]) == ("a", "") and parse_answer("A", ["y", "n", "a", "A"]) == ("A", "")
    assert parse_answer("a", ["y", "n", "A"]) is None and parse_answer("Y", ["y", "n", "A"]) == ("y", "")


def result(output, ok=True, call_id="c1", exit_code=0):
    return ToolCallFinished(
        executor=Executor.RUNTIME,
        call_id=call_id,
        tool="shell",
        state=ToolCallState.SUCCESS,
        ok=ok,
        output=output,
        meta={"exit_code": exit_code},
    )


def test_a_result_shows_its_bounded_escaped_tail_and_full_shows_it_all():
    lines = [f"line {i}" for i in range(1, 31)] + ["x" * 1000, HOSTILE]
    event = result("\n".join(lines) + "\n", exit_code=1)
    shown = [line.text for line in Painter().event_lines(event)]
    assert shown[0] == "→ shell" and shown[1] == "  ← failed: exit code 1 [runtime]"
    body = "\n".join(shown)
    hostile_lines = HOSTILE.count("\n") + 1
    assert f"… {len(lines) + hostile_lines - 1 - RESULT_TAIL_LINES} earlier lines" in body
    assert "line 30" in body and "line 1\n" not in body and len(shown) == 3 + RESULT_TAIL_LINES
    assert "x" * RESULT_LINE_CHARS + "… (800 more characters)" in body
    assert "\\x1b[2J" in body and "\\x0d" in body and _raw_hidden(body) == []
    full = "\n".join(line.text for line in Painter(full=True).event_lines(event))
    assert all(f"│ line {i}" in full for i in range(1, 31)) and "x" * 1000 in full and "earlier line" not in full
    assert _raw_hidden(full) == [] and "\\x1b]52;c;" in full
    one = [line.text for line in Painter().event_lines(result("done\n"))]
    assert one == ["→ shell", "  ← ok [runtime]: done"]


def test_a_result_said_whole_while_it_streamed_is_not_repeated():
    painter = Painter()
    painter.said.add("c1")
    assert [line.text for line in painter.event_lines(result("a\nb\n"))] == ["→ shell", "  ← ok [runtime]"]
    assert [line.text for line in painter.event_lines(result("a\nb\n", call_id="c2"))][-2:] == ["    │ a", "    │ b"]


def test_stream_json_writes_whole_escaped_lines_from_many_threads_and_holds_back_the_loops_end():
    out = io.StringIO()
    stream = StreamJson(out)

    def report(n):
        for i in range(200):
            stream.on_event({"type": "tool_output", "call_id": f"c{n}", "text": f"{i} {HOSTILE}" * 20})

    threads = [threading.Thread(target=report, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stream.on_event({"type": "session_end", "status": "finished"})
    stream.end({"session_id": "s", "status": "finished", "exit_code": 0})
    lines = out.getvalue().split("\n")
    assert lines[-1] == "" and _raw_hidden(out.getvalue()) == []
    parsed = [json.loads(line) for line in lines[:-1]]
    assert len(parsed) == 801 and all(p["text"].endswith(HOSTILE) for p in parsed[:-1])
    assert parsed[-1] == {"type": "session_end", "session_id": "s", "status": "finished", "exit_code": 0}


def test_stream_json_stops_writing_when_its_reader_is_gone():
    class Closed(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    stream = StreamJson(Closed())
    stream.on_event({"type": "model_text", "text": "x"})  # no exception reaches the session
    stream.end({"status": "finished"})


def test_anthropic_models_get_their_200k_window():
    assert default_context_window("anthropic", "claude-sonnet-4-5") == 200_000
    assert default_context_window("anthropic", "some-proxy-name") == 200_000
    assert default_context_window("openai", "claude-3-5-haiku") == 200_000  # an OpenAI-compatible proxy serving Claude
