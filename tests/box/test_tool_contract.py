"""The tool contract as users of Gemini CLI and OpenHands expect it, through a real container.

Each case is a behaviour a peer's test suite checks (line endings kept per line, binary and
UTF-16 files, unreadable directories, read-only files, long lines, brace globs, FIFOs), written
from what the user sees, not from our implementation.
"""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from tests.helpers import chown_tree, error_of, one_box_per_module, put

pytestmark = pytest.mark.docker


box, ws = one_box_per_module("contract")


# -- edit_file: line endings, BOM ------------------------------------------------------------
@pytest.mark.parametrize(
    "before, old, new, after",
    [
        ("a\r\nb\nc\r\nd\n", "c", "C", "a\r\nb\nC\r\nd\n"),  # mixed: only the edited line changes
        ("a\r\nb\nc\r\nd\n", "b\nc\n", "B\nC\n", "a\r\nB\nC\r\nd\n"),  # across lines: each break keeps its own ending
        ("a\r\nb\r\nc\r\n", "b\n", "b\nb2\n", "a\r\nb\r\nb2\r\nc\r\n"),  # CRLF file: new lines get CRLF
        ("a\r\nb\r\nc\r\n", "b\r\n", "x\r\n", "a\r\nx\r\nc\r\n"),  # CRLF in old_text as sent
        ("one\ntwo", "two", "2", "one\n2"),  # no trailing newline stays so
        ("\ufeffkeep\r\nme\r\n", "me", "you", "\ufeffkeep\r\nyou\r\n"),  # BOM and CRLF kept
    ],
)
def test_edit_keeps_every_line_ending_and_the_bom(box, ws, before, old, new, after):
    rel = put(ws, "f.txt", before)
    result = box.call("edit_file", {"path": rel, "old_text": old, "new_text": new})
    assert result.ok, result
    assert (ws / "f.txt").read_bytes() == after.encode()
    untouched = [line for line in before.splitlines(True) if line in after.splitlines(True)]
    diff = result.diff
    assert not any(f"-{line}" in diff.splitlines(True) for line in untouched), (
        "the diff claims an untouched line changed"
    )


def test_edit_diff_is_honest_about_what_changed(box, ws):
    rel = put(ws, "f.txt", "a\r\nb\nc\r\nd\n")
    diff = box.call("edit_file", {"path": rel, "old_text": "c", "new_text": "C"}).diff
    changed = [line for line in diff.split("\n") if line and line[0] in "+-" and not line.startswith(("+++", "---"))]
    assert changed == ["-c\r", "+C\r"]


# -- read_file: binary, encodings, special files ---------------------------------------------
@pytest.mark.parametrize(
    "content",
    [
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10" + bytes(range(256)),
        b"text then a NUL\x00 and more",
        bytes(range(1, 32)) * 40,
        b"\x7fELF\x02\x01\x01" + b"\x00" * 64,
    ],
)
def test_read_file_never_puts_binary_garbage_in_the_context(box, ws, content):
    rel = put(ws, "blob.bin", content)
    result = box.call("read_file", {"path": rel})
    assert result.ok and result.meta.get("binary") is True
    assert "binary" in result.output and str(len(content)) in result.output
    assert "\ufffd" not in result.output and "\x00" not in result.output
    assert result.meta["sha256"] == hashlib.sha256(content).hexdigest()


@pytest.mark.parametrize(
    "codec, bom", [("utf-16-le", b"\xff\xfe"), ("utf-16-be", b"\xfe\xff"), ("utf-32-le", b"\xff\xfe\x00\x00")]
)
def test_read_file_decodes_utf16_and_utf32_with_a_bom(box, ws, codec, bom):
    text = "héllo wörld\nzweite Zeile\n"
    rel = put(ws, "wide.txt", bom + text.encode(codec))
    result = box.call("read_file", {"path": rel})
    assert result.ok and result.output == text
    assert "UTF-" in result.note and result.meta["total_lines"] == 2
    second = box.call("read_file", {"path": rel, "offset": 2})
    assert second.output == "zweite Zeile\n"


@pytest.mark.parametrize(
    "content", [b"\xff\xfe\nplain\n", b"\xfe\xff\nplain\n", b"\xff\xfe" + b"plain text line\n" * 3 + b"a\xdc x\n"]
)
def test_a_byte_order_mark_is_a_hint_not_a_verdict(box, ws, content):
    """Issue 40.6 (codex's own test): a file starting with a UTF-16/32 mark whose body is not that
    encoding (odd length, a lone surrogate) is judged by the ordinary rules: its lines read back as
    they are, never as UTF-16 garbage; grep finds them."""
    rel = put(ws, "hinted.txt", content)
    result = box.call("read_file", {"path": rel})
    assert result.ok, result.error
    assert "plain" in result.output and "UTF-16" not in result.note and "UTF-32" not in result.note
    assert "\nplain" in result.output and result.meta.get("encoding") is None
    found = box.call("grep_files", {"pattern": "plain", "path": rel.rpartition("/")[0]})
    assert found.ok and "plain" in found.output, found


def test_write_file_keeps_a_wide_encoding_only_when_the_mark_was_true(box, ws):
    """A file whose UTF-16 mark was only a hint is not UTF-16: write_file writes the new text as UTF-8,
    as read_file showed it; a real UTF-16 file keeps its mark and encoding."""
    hinted = put(ws, "hinted.txt", b"\xff\xfe\nplain\n")
    assert box.call("write_file", {"path": hinted, "content": "new\n"}).ok
    assert (ws / "hinted.txt").read_bytes() == b"new\n"
    real = put(ws, "real.txt", b"\xff\xfe" + "old\n".encode("utf-16-le"))
    assert box.call("write_file", {"path": real, "content": "new\n"}).ok
    assert (ws / "real.txt").read_bytes() == b"\xff\xfe" + "new\n".encode("utf-16-le")


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe" + bytes(range(256)) * 4 + b"\x00\xdc\x00\xdc",
        b"\xff\xfe\x00\x00\nplain\n",
        b"\x00\x00\xfe\xff" + b"\xff\xff\xff\xff" * 8,
    ],
)
def test_a_byte_order_mark_before_binary_is_binary(box, ws, content):
    """A mark followed by bytes that are neither its encoding nor text is binary: described, never shown."""
    result = box.call("read_file", {"path": put(ws, "hinted.bin", content)})
    assert result.ok and result.meta.get("binary") is True and "\ufffd" not in result.output


def test_read_file_flags_invalid_utf8_instead_of_passing_it_silently(box, ws):
    rel = put(ws, "latin1.txt", "caf\xe9 au lait\n".encode("latin-1"))
    result = box.call("read_file", {"path": rel})
    assert result.ok and result.output == "caf\ufffd au lait\n"
    assert "not valid UTF-8" in result.note and result.meta["invalid_utf8"] is True


def test_special_files_fail_at_once_with_a_typed_error(box, ws):
    os.mkfifo(ws / "pipe")
    chown_tree(ws)
    rel = f"{ws.name}/pipe"
    started = time.monotonic()
    outcomes = [
        box.call("read_file", {"path": rel}),
        box.call("edit_file", {"path": rel, "old_text": "a", "new_text": "b"}),
        box.call("write_file", {"path": rel, "content": "x"}),
    ]
    assert time.monotonic() - started < 5
    assert [error_of(r) for r in outcomes] == ["not_regular_file"] * 3
    assert (ws / "pipe").is_fifo()


def test_read_file_on_a_directory_and_a_missing_file(box, ws):
    (ws / "sub").mkdir()
    assert error_of(box.call("read_file", {"path": f"{ws.name}/sub"})) == "is_directory"
    assert error_of(box.call("read_file", {"path": f"{ws.name}/nope.txt"})) == "file_not_found"


def test_read_file_on_an_empty_file(box, ws):
    rel = put(ws, "empty.txt", "")
    result = box.call("read_file", {"path": rel})
    assert result.ok and result.output == "" and result.meta["total_lines"] == 0


# -- list_files ------------------------------------------------------------------------------
def test_list_files_skips_an_unreadable_directory_and_says_so(box, ws):
    put(ws, "open/a.txt", "a")
    put(ws, "locked/secret.txt", "s")
    put(ws, "z.txt", "z")
    (ws / "locked").chmod(0)
    try:
        result = box.call("list_files", {"path": ws.name})
    finally:
        (ws / "locked").chmod(0o755)
    assert result.ok, result
    listed = result.output.splitlines()
    assert f"{ws.name}/open/a.txt" in listed and f"{ws.name}/z.txt" in listed and f"{ws.name}/locked/" in listed
    assert "locked" in result.note and "unreadable" in result.note


def test_list_files_errors_match_the_other_tools(box, ws):
    put(ws, "file.txt", "x")
    assert error_of(box.call("list_files", {"path": f"{ws.name}/missing"})) == "file_not_found"
    assert error_of(box.call("read_file", {"path": f"{ws.name}/missing"})) == "file_not_found"
    assert error_of(box.call("grep_files", {"pattern": "x", "path": f"{ws.name}/missing"})) == "file_not_found"
    assert error_of(box.call("list_files", {"path": f"{ws.name}/file.txt"})) == "not_a_directory"


# -- grep_files ------------------------------------------------------------------------------
def test_grep_says_when_it_cuts_a_long_line(box, ws):
    rel = put(ws, "long.txt", "needle " + "x" * 3000 + "\nshort needle\n")
    result = box.call("grep_files", {"pattern": "needle", "path": ws.name})
    first, second = result.output.splitlines()[:2]
    assert "3007" in first and "cut" in first
    assert second == f"{rel}:2:short needle"
    assert "cut" in result.note and result.meta["lines_cut"] == 1


@pytest.mark.parametrize(
    "glob, expected",
    [
        ("*.{ts,tsx}", {"a.ts", "b.tsx", "src/c.ts"}),  # no '/': the name, at any depth
        ("**/*.ts", {"a.ts", "src/c.ts"}),
        ("src/*.ts", {"src/c.ts"}),
        ("*.py", {"d.py", "src/deep/e.py"}),
        ("{src/deep/*.py,a.*}", {"a.ts", "src/deep/e.py"}),
        ("[ab].ts*", {"a.ts", "b.tsx"}),
    ],
)
def test_grep_globs_work_as_in_ripgrep(box, ws, glob, expected):
    for name in ("a.ts", "b.tsx", "src/c.ts", "d.py", "src/deep/e.py", "f.js"):
        put(ws, name, "hit\n")
    result = box.call("grep_files", {"pattern": "hit", "path": ws.name, "glob": glob})
    assert result.ok, result
    found = {line.split(":", 1)[0].removeprefix(ws.name + "/") for line in result.output.splitlines()}
    assert found == expected


def test_grep_refuses_a_broken_glob_with_a_typed_error(box, ws):
    assert (
        error_of(box.call("grep_files", {"pattern": "x", "path": ws.name, "glob": "*.{ts,tsx"})) == "invalid_arguments"
    )
    assert (
        error_of(box.call("grep_files", {"pattern": "x", "path": ws.name, "glob": "{a,b}" * 12})) == "invalid_arguments"
    )


# -- write_file / edit_file and permissions --------------------------------------------------
def test_write_and_edit_respect_a_read_only_file(box, ws):
    rel = put(ws, "ro.txt", "keep\n", mode=0o444)
    write = box.call("write_file", {"path": rel, "content": "gone\n"})
    edit = box.call("edit_file", {"path": rel, "old_text": "keep", "new_text": "gone"})
    assert error_of(write) == "permission_denied" and error_of(edit) == "permission_denied"
    assert (ws / "ro.txt").read_text() == "keep\n" and (ws / "ro.txt").stat().st_mode & 0o777 == 0o444


def test_write_into_a_read_only_directory_is_refused(box, ws):
    put(ws, "rodir/x.txt", "x")
    (ws / "rodir").chmod(0o555)
    try:
        result = box.call("write_file", {"path": f"{ws.name}/rodir/new.txt", "content": "n"})
    finally:
        (ws / "rodir").chmod(0o755)
    assert error_of(result) == "permission_denied"
    assert sorted(p.name for p in (ws / "rodir").iterdir()) == ["x.txt"], "a temp file was left behind"


def test_a_replaced_file_keeps_its_mode(box, ws):
    rel = put(ws, "run.sh", "echo 1\n", mode=0o750)
    assert box.call("edit_file", {"path": rel, "old_text": "1", "new_text": "2"}).ok
    assert box.call("write_file", {"path": rel, "content": "echo 3\n"}).ok
    assert (ws / "run.sh").stat().st_mode & 0o777 == 0o750


def test_write_creates_parents_and_edit_refuses_empty_old_text(box, ws):
    assert box.call("write_file", {"path": f"{ws.name}/new/deep/f.txt", "content": "x"}).ok
    assert (ws / "new/deep/f.txt").read_text() == "x"
    assert (
        error_of(box.call("edit_file", {"path": f"{ws.name}/new/deep/f.txt", "old_text": "", "new_text": "y"}))
        == "invalid_arguments"
    )
