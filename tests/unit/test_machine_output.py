"""terminal/machine.py's bounds, host-only: every front-end's list of names (run's summary, a batch
result, MCP's apply_changes and changes, ACP's _meta) stays at most MAX_LISTED items and its line at
most MAX_LINE_BYTES, with a total and the whole list in a file, for many names and for long ones."""

from __future__ import annotations

import json
import os
from pathlib import Path

from orchestrator.acp.landing import META_KEY, Landing
from orchestrator.batch.tasks import ResultWriter, TaskResult
from orchestrator.boxfs import to_store
from orchestrator.boxfs.names import from_exact
from orchestrator.ground.text import json_line
from orchestrator.mcp.results import apply_meta
from orchestrator.terminal.machine import MAX_LINE_BYTES, MAX_LISTED, Bounded, fit_json, name_item
from orchestrator.workspace.review import ApplyReport, LeftOut


def names(count: int, length: int = 40) -> list[str]:
    return [to_store(b"n\n" + b"x" * length + b"\xff%07d" % i) for i in range(count)]


def test_a_list_of_200000_names_is_cut_at_1000_with_its_total_and_its_file(tmp_path):
    many = names(200_000)
    out: dict = {}
    lists = Bounded(out, tmp_path / "lists", "t")
    lists.put("applied", many, name_item)
    line = lists.line()
    got = json.loads(line)
    assert (
        len(line.encode()) <= MAX_LINE_BYTES and len(got["applied"]) == MAX_LISTED and got["applied_total"] == 200_000
    )
    full = Path(got["applied_file"]).read_text().splitlines()
    assert len(full) == 200_000 and from_exact(json.loads(full[-1])) == b"n\n" + b"x" * 40 + b"\xff0199999"
    assert not [p for p in (tmp_path / "lists").iterdir() if p.name.startswith(".")]  # no temporary file left


def test_long_names_cut_a_list_further_to_keep_the_line_under_its_bound(tmp_path):
    long = names(1000, length=8000)  # 1,000 names of 8 KB: their exact and shown forms would be ~40 MB
    out: dict = {"other": "kept"}
    lists = Bounded(out, tmp_path, "t")
    lists.put("applied", long, name_item, lambda p: p)
    lists.put("left_out", long, lambda p: {"path": name_item(p), "reason": "why"})
    got = json.loads(lists.line())
    assert len(lists.line().encode()) <= MAX_LINE_BYTES and got["other"] == "kept"
    assert (
        0 < len(got["applied"]) < 1000
        and len(got["applied_shown"]) == len(got["applied"])
        and got["applied_total"] == 1000
    )
    assert len(Path(got["left_out_file"]).read_text().splitlines()) == 1000


def test_mcp_and_acp_results_are_bounded_and_exact(tmp_path):
    many = names(30_000)
    report = ApplyReport(applied=many, left_out=[LeftOut(path=p, reason="absolute symlink") for p in many])
    meta = apply_meta(report, tmp_path / "lists")
    assert (
        len(json_line(meta).encode()) <= MAX_LINE_BYTES
        and meta["applied_total"] == 30_000
        and len(meta["applied"]) <= MAX_LISTED
    )
    assert (
        from_exact(meta["applied"][0]) == b"n\n" + b"x" * 40 + b"\xff0000000" and "\n" not in meta["applied_shown"][0]
    )
    assert meta["left_out"][0]["path_shown"].startswith("n\\nx") and meta["left_out"][0]["reason"] == "absolute symlink"
    acp = Landing(session="s", workspace="/w", applied=many, lists_dir=tmp_path / "acp").meta()[META_KEY]
    assert (
        len(json_line(acp).encode()) <= MAX_LINE_BYTES
        and acp["appliedTotal"] == 30_000
        and len(acp["applied"]) <= MAX_LISTED
    )
    assert (
        len(Path(acp["appliedFile"]).read_text().splitlines()) == 30_000
        and acp["leftOutTotal"] == 0
        and acp["leftOutFile"] is None
    )
    text = report.lines(1000)
    assert len(text) == 2002 and text[1000] == "... and 29000 more applied" and all("\n" not in line for line in text)


def test_a_result_line_is_never_over_its_bound(tmp_path):
    result = TaskResult(id="t", status="finished", exit_code=0, reason="r" * (3 << 20))
    writer = ResultWriter(tmp_path / "out.jsonl")
    writer.write(result)
    writer.close()
    (line,) = (tmp_path / "out.jsonl").read_bytes().splitlines()
    got = json.loads(line)
    assert len(line) <= MAX_LINE_BYTES and got["id"] == "t" and got["status"] == "finished" and "line_cut" in got
    assert len(fit_json({"a": "x" * (2 << 20), "b": 1}).encode()) <= MAX_LINE_BYTES
    os.unlink(tmp_path / "out.jsonl")


def test_a_checkpoint_event_names_files_exactly_with_shown_forms():
    from orchestrator import events as ev

    record = ev.CheckpointRecorded(
        turn=1,
        ok=True,
        files_changed=[to_store(b"a\nb\xff"), "plain"],
        skipped=[{"path": to_store(b"back\\slash"), "reason": "too big"}],
    ).fields()
    assert record["files_changed"] == [{"bytes_b64": "YQpi/w=="}, "plain"] and record["files_changed_shown"] == [
        "a\\nb\\xff",
        "plain",
    ]
    assert record["skipped"] == [{"path": "back\\slash", "path_shown": "back\\slash", "reason": "too big"}]
    assert ev.parse({"type": "checkpoint", **record}) is not None  # a resumed transcript still reads it
