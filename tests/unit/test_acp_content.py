"""Fast checks of what the ACP server shows an editor and tells the model, without a box:
prompt content (orchestrator/acp/content.py) and file locations and diffs (orchestrator/acp/files.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.acp import files
from orchestrator.acp.content import PromptError, inside, link_path, prompt_text
from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.protocol import ToolResult


def test_link_paths_and_the_workspace_boundary():
    assert link_path("file:///w/a%20b.txt") == "/w/a b.txt"
    assert link_path("file://localhost/w/x/../y") == "/w/y"
    assert link_path("/w/z") == "/w/z"
    assert link_path("https://example.invalid/a") is None
    assert link_path("file://otherhost/w/a") is None
    roots = [Path("/w")]
    assert inside("/w/src/a.py", roots) == "src/a.py"
    assert inside("/w", roots) is None and inside("/wx/a", roots) is None and inside("/etc/passwd", roots) is None


def test_prompt_text_reads_workspace_links_only():
    reads: list[str] = []

    def read_file(rel: str) -> ToolResult:
        reads.append(rel)
        return ToolResult(ok=True, output="1\tcontent of " + rel)

    roots = [Path("/w")]
    text = prompt_text(
        [
            {"type": "text", "text": "look"},
            {"type": "resource_link", "name": "a.py", "uri": "file:///w/src/a.py"},
            {"type": "resource_link", "name": "passwd", "uri": "file:///w/../etc/passwd"},
        ],
        roots,
        read_file,
    )
    assert reads == ["src/a.py"]  # the ../ link normalises outside the workspace: named, not read
    assert "look" in text and "content of src/a.py" in text and "/etc/passwd is named only, not read" in text
    with pytest.raises(PromptError):
        prompt_text([{"type": "image", "data": "aGk=", "mimeType": "image/png"}], roots, read_file)
    with pytest.raises(PromptError):
        prompt_text([{"type": "text", "text": "  "}], roots, read_file)
    with pytest.raises(PromptError):
        prompt_text([{"type": "resource_link", "uri": "file:///w/a"}], roots, read_file)  # no name


def test_a_link_the_box_cannot_read_says_why():
    failed = ToolResult.failure(OpenAgentsError(ErrorType.FILE_NOT_FOUND, "no such file: gone.txt"))
    text = prompt_text(
        [{"type": "resource_link", "name": "gone.txt", "uri": "/w/gone.txt"}], [Path("/w")], lambda rel: failed
    )
    assert "file_not_found" in text


def test_locations_and_workspace_paths():
    root = Path("/home/u/proj")
    assert files.workspace_rel("/workspace/src/a.py") == "src/a.py"
    assert files.workspace_rel("./src//a.py") == "src/a.py"
    assert files.workspace_rel("../x") is None and files.workspace_rel("/etc/passwd") is None
    loc = files.locations("read_file", {"path": "src/a.py", "offset": 40}, root)
    assert [(where.path, where.line) for where in loc] == [("/home/u/proj/src/a.py", 40)]
    assert [(where.path, where.line) for where in files.locations("list_files", {}, root)] == [("/home/u/proj", None)]
    assert files.locations("shell", {"command": "ls"}, root) is None
    assert files.locations("read_file", {"path": "../../etc/passwd"}, root) is None


def test_diffs_read_the_workspace_without_following_links(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("one\ntwo\nthree\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET")
    os.symlink(secret, ws / "link.txt")
    (ws / "big.txt").write_bytes(b"x" * (files.DIFF_MAX_BYTES + 1))
    (ws / "bin.dat").write_bytes(b"\xff\xfe\x00")

    before = files.read_text(ws, {"path": "a.txt"})
    assert before.text == "one\ntwo\nthree\n"
    assert files.first_changed_line("edit_file", before, {"old_text": "three"}) == 3
    assert files.read_text(ws, {"path": "new.txt"}).missing
    for unknown in ("link.txt", "big.txt", "bin.dat"):
        seen = files.read_text(ws, {"path": unknown})
        assert not seen.known, unknown  # neither text nor "missing": no diff is claimed
    after = files.FileText(text="one\n")
    assert files.diff(ws, {"path": "a.txt"}, before, after).oldText == "one\ntwo\nthree\n"
    assert files.diff(ws, {"path": "new.txt"}, files.FileText(missing=True), after).oldText is None
    assert files.diff(ws, {"path": "link.txt"}, files.read_text(ws, {"path": "link.txt"}), after) is None
