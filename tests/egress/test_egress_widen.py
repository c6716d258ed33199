"""Issue 29 item 4: a request the gate refused by default may be allowed by the person, once or
for the session, and the gate's rules change live; an explicit deny is never offered, and a
non-interactive run never widens. Through `oa-sandbox acp` with the official ACP SDK as the editor,
against the compose project's test servers (internal networks only)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import pytest
from acp import text_block
from acp.schema import AllowedOutcome, RequestPermissionResponse

from tests.helpers import make_workspace
from tests.helpers.acp_editor import Editor, run_editor
from tests.helpers.egress import FETCH, OUTER_CIDR, ROOT

pytestmark = [pytest.mark.docker, pytest.mark.timeout(400)]


@dataclass
class EgressEditor(Editor):
    """Answers each egress question with the next of `answers`, and keeps the options it was offered."""

    answers: list[str] = field(default_factory=list)
    offered: list[list[tuple[str, str]]] = field(default_factory=list)

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list, **kwargs: Any
    ) -> RequestPermissionResponse:
        self.offered.append([(o.option_id, o.kind) for o in options])
        self.permissions.append(tool_call)
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=self.answers.pop(0)))


def test_the_editor_widens_a_refused_host_once_then_for_the_session(egress_project, sandbox_image, tmp_path):
    """denied.test is refused (no rule) -> the editor allows it once -> the retry passes, the next
    is refused again -> allowed for the session -> every later request passes; the explicitly denied
    path is never offered. Rules change in the running gate, for this session only."""
    ws = make_workspace(tmp_path / "ws", {"fetch.py": FETCH})
    admin = tmp_path / "admin.toml"
    admin.write_text(
        f'[egress]\nallow_cidrs = ["{OUTER_CIDR}"]\n[[rules]]\ntool = "shell"\ndecision = "allow"\n'
        '[[egress.rules]]\naction = "deny"\nhost = "denied.test"\nport = 8000\npath = "/private*"\n'
    )

    # (a try number as a second argument: five identical calls in a row would end the session)
    def fetch(path: str, n: int) -> dict:
        command = f"python3 fetch.py http://denied.test:8000{path} {n}"
        return {"tool_calls": [{"name": "shell", "arguments": {"command": command}}]}

    model = tmp_path / "model.jsonl"
    model.write_text(
        "\n".join(
            json.dumps(t)
            for t in [
                fetch("/a", 1),
                fetch("/a", 2),
                fetch("/a", 3),
                fetch("/a", 4),
                fetch("/a", 5),
                fetch("/private", 6),
                {"text": "done"},
            ]
        )
        + "\n"
    )
    editor = EgressEditor(answers=["allow_once", "allow_session"])

    async def body(conn, editor):
        session = await conn.new_session(cwd=str(ws), mcp_servers=[])
        answer = await conn.prompt(session_id=session.session_id, prompt=[text_block("fetch")])
        return answer.stop_reason

    env = {"OA_ADMIN_POLICY": str(admin), "OA_EGRESS_OUTER_NETWORK": egress_project["outer"], "PYTHONPATH": str(ROOT)}
    run = run_editor(
        tmp_path,
        ["--model", f"script:{model}", "--egress", "allow:allowed.test:8000", "--transcript-dir", str(tmp_path / "t")],
        body,
        editor=editor,
        env=env,
    )
    assert run.result == "end_turn"
    assert editor.answers == [] and len(editor.offered) == 2
    assert editor.offered[0] == [
        ("allow_once", "allow_once"),
        ("allow_session", "allow_always"),
        ("reject_once", "reject_once"),
    ]
    (transcript,) = (tmp_path / "t").iterdir()
    events = [json.loads(line) for line in transcript.read_text().splitlines()]
    egress = [(e["decision"], e["rule"]) for e in events if e["type"] == "egress"]
    assert [d for d, _ in egress] == ["deny", "allow", "deny", "allow", "allow", "deny"], egress
    assert (
        egress[1][1].startswith("widened[0]")
        and egress[3][1].startswith("widened[1]")
        and egress[4][1].startswith("widened[1]")
    )
    assert "rules[0]" in egress[5][1]  # the explicit deny decided, and nothing was offered for it
    asked = [(e["action"], e["decision"]) for e in events if e["type"] == "approval" and e["tool"] == "egress"]
    assert asked == [
        ("egress GET denied.test:8000/a", "allow_once"),
        ("egress GET denied.test:8000/a", "approved_for_session"),
    ]
    finished = [e for e in events if e["type"] == "tool_result"]
    assert "may be tried again" in finished[0]["note"] and "hello from denied" in finished[1]["output"]


def test_a_non_interactive_run_never_widens(egress_project, sandbox_image, tmp_path):
    """The same refusal in `oa-sandbox run --non-interactive`: nobody is asked, nothing widens."""
    import subprocess
    import sys

    ws = make_workspace(tmp_path / "ws", {"fetch.py": FETCH})
    admin = tmp_path / "admin.toml"
    admin.write_text(f'[egress]\nallow_cidrs = ["{OUTER_CIDR}"]\n[[rules]]\ntool = "shell"\ndecision = "allow"\n')
    model = tmp_path / "model.jsonl"
    model.write_text(
        "\n".join(
            json.dumps(t)
            for t in [
                {
                    "tool_calls": [
                        {"name": "shell", "arguments": {"command": "python3 fetch.py http://denied.test:8000/a"}}
                    ]
                },
                {
                    "tool_calls": [
                        {"name": "shell", "arguments": {"command": "python3 fetch.py http://denied.test:8000/a"}}
                    ]
                },
                {"text": "done"},
            ]
        )
    )
    transcript = tmp_path / "t.jsonl"
    env = {
        **os.environ,
        "OA_ADMIN_POLICY": str(admin),
        "OA_EGRESS_OUTER_NETWORK": egress_project["outer"],
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "run",
            "--workspace",
            str(ws),
            "--model",
            f"script:{model}",
            "--non-interactive",
            "--egress",
            "allow:allowed.test:8000",
            "--transcript",
            str(transcript),
            "go",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in transcript.read_text().splitlines()]
    assert [e["decision"] for e in events if e["type"] == "egress"] == ["deny", "deny"]
    assert not [e for e in events if e["type"] == "approval" and e["tool"] == "egress"]


@pytest.mark.parametrize(
    ("typed", "decision"),
    [("y\n", "allow_once"), ("a\n", "approved_for_session"), ("n not that host\n", "reject_once")],
)
def test_the_terminal_offers_once_session_or_no(monkeypatch, capsys, typed, decision):
    """At the terminal the question reads y / n / a (a = for this
    session); the answer maps to the gate's once or session rule."""
    import io

    from orchestrator.policy.approvals import ApprovalGate, NonInteractiveApprover, TerminalApprover
    from orchestrator.policy.ladder import Ladder

    monkeypatch.setattr("sys.stdin", io.StringIO(typed))
    outcome = ApprovalGate(Ladder(), TerminalApprover()).widen_egress(
        "c1", "GET denied.test:8000/a", {"host": "denied.test"}
    )
    assert outcome.decision == decision and outcome.allowed == (decision != "reject_once")
    assert "a = allow it for this session" in capsys.readouterr().err
    never = ApprovalGate(Ladder(), NonInteractiveApprover(), auto_approve=True).widen_egress(
        "c1", "GET denied.test:8000/a", {}
    )
    assert not never.allowed and "interactive" in never.reason
