"""`oa-sandbox report` and `run --report`: pages of real sessions (a scripted model, real
containers), their rows checked in the HTML and in a real headless Chromium."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.report import MAX_PAGE_BYTES
from tests.helpers import chown_tree, committed_example
from tests.helpers.report_browser import Elements, chromium, dump_dom, needs_chromium, run_cli, run_session

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
POLICY = (
    "rules:\n  - {id: edits, kind: edit, decision: allow}\n"
    "  - {id: tests, tool: shell, command_prefix: python3 -B -m unittest, decision: allow}\n"
)


def calc(tmp: Path) -> Path:
    ws = committed_example(tmp / "calc")  # the committed, buggy version (the README's main job fixes the checkout's)
    chown_tree(ws)
    return ws


def turns() -> list[dict]:
    recorded = [
        json.loads(line) for line in (ROOT / "examples" / "calc.jsonl").read_text().splitlines() if line.startswith("{")
    ]
    # One call the policy refuses (non-interactive: nobody to ask), before the final answer.
    return [
        *recorded[:-1],
        {
            "text": "and a call nobody allowed",
            "tool_calls": [{"name": "shell", "arguments": {"command": "rm -rf build"}}],
        },
        recorded[-1],
    ]


def sections(page: str) -> dict[str, str]:
    """Each <section id=...>'s HTML."""
    out = {}
    for part in page.split('<section id="')[1:]:
        name, _, rest = part.partition('"')
        out[name] = rest.split("</section>", 1)[0]
    return out


def test_run_report_of_a_bind_session(tmp_path):
    """`run --report FILE` in bind mode: the page has the summary, every call with its approval and
    who decided (a refused one too), the shell output, each turn's checkpoint and the edit's diff."""
    ws = calc(tmp_path)
    out = tmp_path / "bind.html"
    sid, proc = run_session(
        tmp_path, ws, turns(), POLICY, "fix the bug", "--workspace-mode", "bind", "--report", str(out)
    )
    assert proc.returncode == 3, proc.stderr[-3000:]  # finished, a call refused
    assert f"report: {out}" in proc.stderr
    page = out.read_text(encoding="utf-8")
    assert len(page.encode()) <= MAX_PAGE_BYTES
    parts = sections(page)
    summary, timeline, checkpoints, changes = (
        parts["summary"],
        parts["timeline"],
        parts["checkpoints"],
        parts["changes"],
    )
    assert "fix the bug" in summary and "script:model.jsonl" in summary and "bind" in summary
    assert "<th>Runtime</th><td>runsc</td>" in summary or "<th>Runtime</th><td>runc</td>" in summary
    assert "3 (finished, a call was refused)" in summary and "1 refused" in summary
    for tool in ("list_files", "read_file", "shell", "edit_file"):
        assert f'<strong class="tool">{tool}</strong>' in timeline
    assert "allow by openagents" in timeline or "automatic by openagents" in timeline
    assert (
        "reject_once by openagents" in timeline and "refused_by_policy" in timeline
    )  # the refused call, open, with its reason
    assert "FAILED" in timeline and "OK" in timeline  # the tests' output, before and after the fix
    assert "<td>start</td>" in checkpoints and "calc.py" in checkpoints
    assert "+    return a + b" in changes and "-    return a - b" in changes
    assert "No request went through the egress gate" in parts["egress"]


@needs_chromium
def test_report_of_a_copy_session_in_chromium(tmp_path):
    """`oa-sandbox report ID` of a copy session, opened in headless Chromium: the rows are in the rendered DOM, the
    final diff is the copy's against the workspace, and a screenshot of the page is a real picture."""
    ws = calc(tmp_path)
    sid, proc = run_session(tmp_path, ws, turns(), POLICY, "fix the bug", "--workspace-mode", "copy")
    assert proc.returncode == 3, proc.stderr[-3000:]
    out = tmp_path / "copy.html"
    done = run_cli("report", sid, "-o", str(out), state=tmp_path / "state")
    assert done.returncode == 0, done.stderr
    dom = dump_dom(out)
    elements = Elements(dom)
    assert elements.title == f"oa-sandbox report: session {sid}"
    rows = [attrs.get("class") for tag, attrs in elements.tags if tag == "li"]
    assert rows.count("model") == 6 and sum(1 for r in rows if r and r.startswith("call")) == 7
    assert "oa-sandbox changes " + sid in dom and "+    return a + b" in dom
    assert not any(tag == "script" for tag, _ in elements.tags)
    shot = tmp_path / "copy.png"
    proc = chromium(out, "--hide-scrollbars", "--window-size=1280,1600", f"--screenshot={shot}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    png = shot.read_bytes()
    assert (
        png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000
    )  # a laid-out page, not a blank one (a blank 1280x1600 PNG is ~6 KB)


def test_report_of_an_unknown_session(tmp_path):
    """An id that names no session, or is not shaped like one, is a set-up error (exit 2)."""
    missing = run_cli("report", "20000101-000000-abcdef", state=tmp_path / "state")
    assert missing.returncode == 2 and "no session" in missing.stderr
    bad = run_cli("report", "../../etc", state=tmp_path / "state")
    assert bad.returncode == 2 and "not a session id" in bad.stderr


def test_report_from_the_python_api(tmp_path, monkeypatch, sandbox_image):
    """`Sandbox.report(path)`: the page of an API session (its calls,
    who decided, the copy's diff), written and returned, after close."""
    from orchestrator import Sandbox
    from tests.helpers import make_workspace

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = make_workspace(tmp_path / "ws", {"a.txt": "old\n"})
    chown_tree(ws)
    with Sandbox(ws, auto_approve=True, mode="copy") as box:
        box.write_file("a.txt", "new <b>\n")
        box.shell("echo '<script>x</script>'")
    out = tmp_path / "api.html"
    page = box.report(out)
    assert out.read_text(encoding="utf-8") == page and len(page.encode()) <= MAX_PAGE_BYTES
    assert '<strong class="tool">write_file</strong>' in page and '<strong class="tool">shell</strong>' in page
    assert "&lt;script&gt;x&lt;/script&gt;" in page and "<script>x" not in page
    assert "+new &lt;b&gt;" in page and "-old" in page


def test_report_of_a_rolled_back_session(tmp_path, monkeypatch, sandbox_image):
    """A session rolled back to its start (the API's rollback, a call the ladder decides): the page shows
    the rollback in the timeline with who decided, and the final diff is empty (the write was undone)."""
    from orchestrator import Sandbox
    from tests.helpers import make_workspace

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = make_workspace(tmp_path / "ws", {"a.txt": "old\n"})
    chown_tree(ws)
    with Sandbox(ws, auto_approve=True, mode="copy") as box:
        box.write_file("a.txt", "rolled back later\n")
        box.rollback(0)
        assert box.read_file("a.txt").text == "old\n"
    page = box.report(tmp_path / "rolled.html")
    parts = sections(page)
    assert '<strong class="tool">rollback</strong>' in parts["timeline"] and "by user" in parts["timeline"]
    assert "rolled back later" not in parts["changes"]
