"""The report's bounds without a container: what one page keeps of a transcript is bounded however
many records it has, and every kept text is visible and cut with a marker."""

from __future__ import annotations

import json

from orchestrator.report import MAX_PAGE_BYTES, Limits, build
from orchestrator.report.collect import gather
from orchestrator.report.limits import Budget, text
from orchestrator.workspace.records import SessionRecord, WorkspaceMode


def test_text_is_visible_and_cut_with_a_marker():
    """Control and bidi characters come out as escapes; a long value is
    cut (its head, or its tail for outputs) and says by how much."""
    assert text("a\x1b[31mb\u202e", 100) == "a\\x1b[31mb\\u202e"
    assert text("x" * 50, 10) == "x" * 10 + "…[cut 40 chars]"
    assert text("x" * 49 + "END", 10, tail=True).endswith("\n" + "x" * 7 + "END")
    budget = Budget(1000, floor=20)
    kept = [budget.take("y" * 400, 400) for _ in range(10)]
    assert sum(len(k) for k in kept) < 1500 and budget.cut > 0  # past its room each value keeps only the floor


def test_a_transcript_of_many_calls_keeps_a_bounded_timeline(tmp_path):
    """100,000 calls: the timeline keeps its first entries, counts the rest (each once), keeps nothing else of them."""
    path = tmp_path / "t.jsonl"
    with path.open("w") as fh:
        fh.write(json.dumps({"seq": 1, "type": "session_start", "task": "t", "model": "m"}) + "\n")
        for i in range(100_000):
            fh.write(
                json.dumps(
                    {
                        "type": "tool_call",
                        "call_id": f"c{i}",
                        "tool": "shell",
                        "state": "validating",
                        "arguments": {"command": "<b>"},
                    }
                )
                + "\n"
            )
            fh.write(
                json.dumps(
                    {"type": "tool_result", "call_id": f"c{i}", "tool": "shell", "ok": True, "output": "o" * 100}
                )
                + "\n"
            )
        fh.write(
            json.dumps({"type": "session_end", "status": "finished", "reason": "done", "turns": 1, "wall_s": 1.5})
            + "\n"
        )
    limits = Limits()
    g = gather(path, limits)
    assert len(g.entries) == limits.max_entries and len(g.calls) == limits.max_entries
    assert g.entries_left_out == 100_000 - limits.max_entries
    assert g.status == "finished" and g.wall_s == 1.5


def test_a_page_over_its_cap_is_built_again_smaller(tmp_path, monkeypatch):
    """Bounds that would make a page past MAX_PAGE_BYTES (texts of '<', each growing fivefold escaped): the page is
    rebuilt with halved bounds until it fits, and says what it left out."""
    import orchestrator.report as report

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    path = tmp_path / "t.jsonl"
    big = "<" * 20_000
    with path.open("w") as fh:
        for i in range(2100):
            fh.write(
                json.dumps(
                    {
                        "type": "tool_call",
                        "call_id": f"c{i}",
                        "tool": "shell",
                        "state": "validating",
                        "arguments": {"c": big},
                    }
                )
                + "\n"
            )
            fh.write(
                json.dumps({"type": "tool_result", "call_id": f"c{i}", "tool": "shell", "ok": True, "output": big})
                + "\n"
            )
    record = SessionRecord(
        id="20260101-000000-abcdef",
        created=0.0,
        workspace=str(tmp_path),
        mode=WorkspaceMode.BIND,
        box_workspace=str(tmp_path),
        user="1000:1000",
        status="finished",
        transcript=str(path),
    )
    sizes = []

    def measured(context):
        page = render(context)
        sizes.append(len(page.encode()))
        return page

    render = report.render
    monkeypatch.setattr(report, "render", measured)
    page = build(record, Limits(timeline_bytes=64 << 20))
    assert len(sizes) > 1 and sizes[0] > MAX_PAGE_BYTES and sizes[-1] == len(page.encode()) <= MAX_PAGE_BYTES
    assert (
        "Left out of this page" in page
        and "timeline entries past the first" in page
        and "&lt;&lt;&lt;" in page
        and "<<" not in page
    )
    sizes.clear()
    assert len(build(record).encode()) <= MAX_PAGE_BYTES and len(sizes) == 1  # the default shares fit at once
