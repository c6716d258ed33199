"""The approval preview (issue 22): the diff an edit would make, bounded in memory and time, made
only for a person who will see it, and shown escaped. The file it reads is the box's.

No Docker: a workspace on disk, the registry's own validation, the gate with test approvers.
"""

from __future__ import annotations

import io
import os
import time
import tracemalloc
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.models.base import ToolCall
from orchestrator.policy.approvals import (
    Answer,
    ApprovalGate,
    ApprovalRequest,
    NonInteractiveApprover,
    PermissionOption,
    TerminalApprover,
    shows_diffs,
)
from orchestrator.policy.ladder import Ladder, PolicyRule
from orchestrator.terminal.live import LiveView
from orchestrator.tools.registry import ToolRegistry
from orchestrator.workspace.bounded_diff import bounded_unified_diff
from orchestrator.workspace.preview import PREVIEW_SECONDS, proposed_diff
from tests.helpers.preview_bounds import pathological_lines


def prepare(ws: Path, name: str, args: dict) -> object:
    return ToolRegistry(sandbox=None, workspace=ws).prepare(  # type: ignore[arg-type]  # preparing never reaches a sandbox
        ToolCall(id="c", name=name, arguments=args)
    )


def children() -> list[int]:
    """Live (not zombie) child processes of this test process."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            out.append(int(entry))
    return out


# -- size: estimated before anything is built ----------------------------------------------------


def test_an_edit_that_would_make_a_huge_file_is_refused_before_it_is_built(tmp_path):
    """1 MiB of 'a', old_text='a', new_text 256 bytes, allow_multiple: the old preview built a
    256 MiB `after` and its diff (765 MiB, 1.7 s). Now: counted, refused, nothing built."""
    (tmp_path / "big.txt").write_text("a" * (1 << 20))
    call = prepare(
        tmp_path, "edit_file", {"path": "big.txt", "old_text": "a", "new_text": "b" * 256, "allow_multiple": True}
    )
    before = set(children())
    tracemalloc.start()
    try:
        started = time.monotonic()
        preview = proposed_diff(tmp_path, call)
        elapsed = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert preview is not None and preview.text is None
    assert preview.note == "preview skipped: the edit would make a 256 MiB file (previews stop at 1 MiB)"
    assert elapsed < 1.0
    assert peak < 16 << 20  # the file read (1 MiB of bytes, then its text), nothing of the size of the result
    assert set(children()) == before  # no differ was even started


def test_a_write_over_the_cap_is_refused_by_its_size(tmp_path):
    call = prepare(tmp_path, "write_file", {"path": "new.txt", "content": "x\n" * (1 << 20)})
    preview = proposed_diff(tmp_path, call)
    assert preview is not None and preview.text is None
    assert preview.note == "preview skipped: the write would make a 2 MiB file (previews stop at 1 MiB)"


# -- time: the diff runs in a child with a deadline -------------------------------------------------


def test_a_pathological_diff_is_stopped_at_its_deadline(tmp_path):
    """Two ~900 KB files of 180,000 short lines built against difflib: the child is killed at the
    preview's deadline and the prompt says so; the old preview ran on the main thread for minutes."""
    before_text, after_text = pathological_lines(180_000)
    assert len(before_text) < 1 << 20 and len(after_text) < 1 << 20
    (tmp_path / "big.txt").write_text(before_text)
    call = prepare(tmp_path, "write_file", {"path": "big.txt", "content": after_text})
    before = set(children())
    started = time.monotonic()
    preview = proposed_diff(tmp_path, call)
    elapsed = time.monotonic() - started
    assert preview is not None and preview.text is None
    assert preview.note == f"preview skipped: the diff took longer than {PREVIEW_SECONDS:g} s"
    assert elapsed < PREVIEW_SECONDS + 3.0  # the deadline, plus the child's start on a busy machine
    assert set(children()) == before  # killed and reaped


def test_bounded_diff_deadline_and_output_cap():
    slow_before, slow_after = pathological_lines(20_000)
    started = time.monotonic()
    slow = bounded_unified_diff(slow_before, slow_after, "a/x", "b/x", max_bytes=1 << 16, deadline_s=0.5)
    assert slow.text is None and slow.skipped == "the diff took longer than 0.5 s"
    assert time.monotonic() - started < 3.5

    many = "".join(f"line {i}\n" for i in range(10_000))
    cut = bounded_unified_diff(many, many.replace("line", "LINE"), "a/x", "b/x", max_bytes=4096, deadline_s=10)
    assert cut.text is not None and cut.cut and cut.skipped is None
    assert len(cut.text.encode()) <= 4096 and cut.text.endswith("\n") and cut.text.startswith("--- a/x\n+++ b/x\n@@ ")

    one_line = bounded_unified_diff("x" * 100_000, "y" * 100_000, "a/x", "b/x", max_bytes=4096, deadline_s=10)
    assert one_line.text is not None and one_line.cut and len(one_line.text.encode()) <= 4096


def test_a_small_edit_still_gets_its_diff(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\nthree")
    preview = proposed_diff(
        tmp_path, prepare(tmp_path, "edit_file", {"path": "a.txt", "old_text": "three", "new_text": "3"})
    )
    assert preview is not None and preview.note is None
    assert preview.text == (
        "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\n two\n-three\n\\ No newline at end of file\n"
        "+3\n\\ No newline at end of file\n"
    )
    created = proposed_diff(tmp_path, prepare(tmp_path, "write_file", {"path": "new.txt", "content": "x\ny\n"}))
    assert created is not None and created.text == "--- a/new.txt\n+++ b/new.txt\n@@ -0,0 +1,2 @@\n+x\n+y\n"
    assert proposed_diff(tmp_path, prepare(tmp_path, "read_file", {"path": "a.txt"})) is None


# -- only for a person who will see it -------------------------------------------------------------


class Person:
    """A person at a terminal that shows diffs; answers from a list, records what it was shown."""

    shows_diff = True

    def __init__(self, *keys: str) -> None:
        self.keys = list(keys)
        self.asked: list[ApprovalRequest] = []

    def ask(self, request: ApprovalRequest) -> Answer:
        self.asked.append(request)
        key = self.keys.pop(0)
        return Answer(
            option=PermissionOption.REJECT_ONCE if key == "n" else PermissionOption.ALLOW_ONCE,
            remember_for_session=key == "a",
        )


class Editor(Person):
    """An approver that shows no diff (the ACP and MCP approvers send the arguments only)."""

    shows_diff = False


class CountingPreview:
    def __init__(self, ws: Path) -> None:
        self.ws = ws
        self.calls = 0

    def __call__(self, prepared):
        self.calls += 1
        return proposed_diff(self.ws, prepared)


@pytest.mark.parametrize(
    "case",
    [
        "non-interactive",
        "auto-approve",
        "policy allows",
        "policy denies",
        "approver shows no diff",
        "read-only tool",
        "approved for the session",
    ],
)
def test_no_preview_is_made_that_nobody_will_see(tmp_path, case):
    (tmp_path / "a.txt").write_text("one\n")
    edit = prepare(tmp_path, "edit_file", {"path": "a.txt", "old_text": "one", "new_text": "two"})
    preview = CountingPreview(tmp_path)
    ladder, approver, auto = Ladder(), Person("y"), False
    if case == "non-interactive":
        approver = NonInteractiveApprover()
    elif case == "auto-approve":
        auto = True
    elif case == "policy allows":
        ladder = Ladder([PolicyRule(kind="edit", decision="allow")])
    elif case == "policy denies":
        ladder = Ladder([PolicyRule(tool="edit_file", decision="deny")])
    elif case == "approver shows no diff":
        approver = Editor("y")
    elif case == "read-only tool":
        edit = prepare(tmp_path, "read_file", {"path": "a.txt"})
    gate = ApprovalGate(ladder, approver, auto_approve=auto, preview=preview)
    if case == "approved for the session":
        approver.keys = ["a"]
        gate.decide(edit)
        assert preview.calls == 1 and approver.asked[0].diff is not None  # the one question a person saw had it
    gate.decide(edit)
    assert preview.calls == (1 if case == "approved for the session" else 0)


def test_a_person_at_the_terminal_gets_the_preview_and_the_reason_when_there_is_none(tmp_path):
    (tmp_path / "a.txt").write_text("one\n")
    (tmp_path / "big.txt").write_text("a" * (1 << 20))
    person = Person("y", "y")
    gate = ApprovalGate(Ladder(), person, preview=CountingPreview(tmp_path))
    gate.decide(prepare(tmp_path, "edit_file", {"path": "a.txt", "old_text": "one", "new_text": "two"}))
    gate.decide(
        prepare(
            tmp_path, "edit_file", {"path": "big.txt", "old_text": "a", "new_text": "b" * 256, "allow_multiple": True}
        )
    )
    assert "-one\n+two\n" in (person.asked[0].diff or "") and person.asked[0].diff_note is None
    assert (
        person.asked[1].diff is None
        and person.asked[1].diff_note == "preview skipped: the edit would make a 256 MiB file (previews stop at 1 MiB)"
    )


def test_which_approvers_show_diffs():
    assert shows_diffs(TerminalApprover(show_diff=lambda diff: None))
    assert not shows_diffs(TerminalApprover())
    assert not shows_diffs(NonInteractiveApprover())
    assert not shows_diffs(Editor())


# -- shown escaped ---------------------------------------------------------------------------------

HOSTILE = "\x1b]52;c;cm0gLXJmIH4=\x07clipboard\n\u202eevil\u2066\nsafe\nfake\rprompt\n\x1b[2J\x1b[Hcleared\n"


def test_the_preview_reaches_the_terminal_escaped(tmp_path, monkeypatch, capsys):
    """A box-written file full of terminal controls (OSC 52, clear screen, a lone CR, bidi): the
    prompt shows every one of them as an escape, in the diff and in the note."""
    (tmp_path / "evil.txt").write_text(HOSTILE)
    out = io.StringIO()
    view = LiveView(Console(file=out, force_terminal=False, highlight=False, markup=False, emoji=False, soft_wrap=True))
    terminal = TerminalApprover(show_diff=view.show_diff)
    monkeypatch.setattr("sys.stdin", io.StringIO("y\ny\n"))
    gate = ApprovalGate(Ladder(), terminal, preview=lambda prepared: proposed_diff(tmp_path, prepared))
    assert gate.decide(
        prepare(tmp_path, "edit_file", {"path": "evil.txt", "old_text": "safe", "new_text": "\x1b[31mred\x1b[0m"})
    ).allowed
    shown = out.getvalue()
    assert "-safe" in shown and "\\x1b]52;c;cm0gLXJmIH4=\\x07clipboard" in shown and "\\u202eevil\\u2066" in shown
    assert "fake\\x0dprompt" in shown and "\\x1b[2J\\x1b[Hcleared" in shown and "+\\x1b[31mred\\x1b[0m" in shown
    for raw in ("\x1b", "\x07", "\r", "\u202e", "\u2066"):
        assert raw not in shown
    (tmp_path / "big.txt").write_text("a" * (1 << 20))
    assert gate.decide(
        prepare(
            tmp_path,
            "edit_file",
            {"path": "big.txt", "old_text": "a", "new_text": "\x1b" * 256, "allow_multiple": True},
        )
    ).allowed
    err = capsys.readouterr().err
    assert "preview skipped: the edit would make a 256 MiB file" in err and "\x1b" not in err
