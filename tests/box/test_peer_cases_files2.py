"""Issue 23, round 2 of the file tools' contract: what the test suites of goose, SWE-agent, Codex,
opencode, Aider and Roo Code expect of read_file, write_file, edit_file and grep_files, restated as
behaviour a user sees through a real container. Each class names the peer source it comes from.
The regular-expression deadline runs under both runtimes in test_tools_in_sandbox.py.
"""

from __future__ import annotations

import pytest

from tests.helpers import error_of, one_box_per_module, put

pytestmark = pytest.mark.docker

box, ws = one_box_per_module("peers2")
BOM = b"\xef\xbb\xbf"


def hits(result, ws) -> list[str]:
    return [
        line.removeprefix(ws.name + "/")
        for line in result.output.splitlines()
        if not line.startswith("[") and line != "no matches"
    ]


# ============================================================================== 1. no silent "not found"
def test_grep_searches_a_file_larger_than_the_old_8_mib_cap(box, ws):
    """Roo-Code src/services/ripgrep/__tests__/integration.test.ts and goose
    crates/goose-mcp/src/developer/tests/search_test.rs: ripgrep searches a file whatever its size;
    a directory search that skipped a 9 MiB log answered a plain "no matches"."""
    put(ws, "logs/huge.log", b"filler line\n" * (800 * 1024) + b"the needle is here\n")
    result = box.call("grep_files", {"pattern": "needle", "path": ws.name})
    assert result.ok and hits(result, ws) == ["logs/huge.log:819201:the needle is here"]


def test_grep_names_every_file_it_did_not_search(box, ws):
    """Roo-Code src/services/ripgrep/index.ts reports what ripgrep could not read; a search that skips
    a file must say which, so "no matches" is never a silent "not found"."""
    put(ws, "blob.bin", b"needle\x00\x01\x02")
    put(ws, "secret.txt", "needle\n", mode=0)
    put(ws, "plain.txt", "nothing here\n")
    try:
        result = box.call("grep_files", {"pattern": "needle", "path": ws.name})
    finally:
        (ws / "secret.txt").chmod(0o644)
    assert result.ok and result.output == "no matches"
    assert f"{ws.name}/blob.bin" in result.note and "binary" in result.note
    assert f"{ws.name}/secret.txt" in result.note and "unreadable" in result.note
    assert result.meta["skipped"] == {"binary": 1, "unreadable": 1}


def test_grep_bounds_the_list_of_skipped_files(box, ws):
    for i in range(25):
        put(ws, f"b{i:02}.bin", b"\x00bin")
    result = box.call("grep_files", {"pattern": "x", "path": ws.name})
    assert "25 files binary" in result.note and "and 15 more" in result.note and len(result.note) < 2000


def test_grep_finds_text_in_a_utf16_file_with_a_bom(box, ws):
    """opencode's grep (ripgrep) and Gemini CLI's integration-tests/utf-bom-encoding.test.ts: a UTF-16
    file with a byte-order mark is text, searched decoded, not skipped as binary without a word."""
    put(ws, "script.ps1", b"\xff\xfe" + "Write-Host 'hello'\r\n$needle = 1\r\n".encode("utf-16-le"))
    result = box.call("grep_files", {"pattern": r"\$needle", "path": ws.name})
    assert hits(result, ws) == ["script.ps1:2:$needle = 1"]


# ============================================================================== 3. byte-order marks
def test_read_says_the_file_has_a_bom(box, ws):
    """Codex codex-rs/apply-patch/src/text_file.rs keeps a file's BOM; Gemini CLI
    integration-tests/utf-bom-encoding.test.ts reads BOM files. read_file hides the mark from the
    output but must say it is there."""
    rel = put(ws, "Program.cs", BOM + b"using System;\r\nclass A {}\r\n")
    result = box.call("read_file", {"path": rel})
    assert result.output == "using System;\r\nclass A {}\r\n"
    assert result.meta["bom"] is True and "byte-order mark" in result.note


def test_write_over_a_bom_file_keeps_the_bom(box, ws):
    """The round trip read -> write_file of a C# file must not change its first three bytes."""
    rel = put(ws, "Program.cs", BOM + b"using System;\r\nclass A {}\r\n")
    text = box.call("read_file", {"path": rel}).output
    result = box.call("write_file", {"path": rel, "content": text.replace("class A", "class B")})
    assert result.ok and result.meta["bom"] is True and "byte-order mark" in result.note
    assert (ws / "Program.cs").read_bytes() == BOM + b"using System;\r\nclass B {}\r\n"
    again = box.call(
        "write_file", {"path": rel, "content": "\ufeffclass C {}\r\n"}
    )  # the model's own U+FEFF: one mark, not two
    assert again.ok and (ws / "Program.cs").read_bytes() == BOM + b"class C {}\r\n"


def test_write_over_a_utf16_powershell_file_keeps_its_encoding(box, ws):
    rel = put(ws, "profile.ps1", b"\xff\xfe" + "Set-Location C:\\\r\n".encode("utf-16-le"))
    text = box.call("read_file", {"path": rel}).output
    assert box.call("write_file", {"path": rel, "content": text + "Get-Date\r\n"}).ok
    assert (ws / "profile.ps1").read_bytes() == b"\xff\xfe" + "Set-Location C:\\\r\nGet-Date\r\n".encode("utf-16-le")


def test_a_new_file_gets_no_bom(box, ws):
    assert box.call("write_file", {"path": f"{ws.name}/new.cs", "content": "class N {}\n"}).ok
    assert (ws / "new.cs").read_bytes() == b"class N {}\n"


def test_edit_of_the_first_line_keeps_the_bom(box, ws):
    """Codex codex-rs/apply-patch/src/text_file.rs: an edit at the start of a BOM file keeps the mark."""
    rel = put(ws, "Program.cs", BOM + b"using System;\r\nclass A {}\r\n")
    result = box.call("edit_file", {"path": rel, "old_text": "using System;", "new_text": "using System.IO;"})
    assert result.ok and result.meta["bom"] is True
    assert (ws / "Program.cs").read_bytes() == BOM + b"using System.IO;\r\nclass A {}\r\n"


# ============================================================================== 4. overlapping matches
@pytest.mark.parametrize("content, old", [("aaa\n", "aa"), ("abcabca\n", "abca"), ("x = 1\n\n\nend\n", "\n\n")])
def test_overlapping_occurrences_are_ambiguous(box, ws, content, old):
    """goose crates/goose-mcp/src/developer/text_editor.rs (str_replace: old_str must occur exactly
    once) and opencode's edit tool: "aa" is in "aaa" at two places; editing one of them is a guess."""
    rel = put(ws, "f.txt", content)
    result = box.call("edit_file", {"path": rel, "old_text": old, "new_text": "Z"})
    assert error_of(result) == "edit_ambiguous" and "overlapping" in result.error.message
    assert (
        box.call("edit_file", {"path": rel, "old_text": old, "new_text": "Z", "allow_multiple": True}).error.type.value
        == "edit_ambiguous"
    )
    assert (ws / "f.txt").read_text() == content


def test_repeated_but_not_overlapping_occurrences_replace_with_allow_multiple(box, ws):
    rel = put(ws, "f.txt", "abab\n")
    result = box.call("edit_file", {"path": rel, "old_text": "ab", "new_text": "x", "allow_multiple": True})
    assert result.ok and result.meta["replacements"] == 2 and (ws / "f.txt").read_text() == "xx\n"


# ============================================================================== 6. blame
def test_an_undecodable_utf16_file_is_not_the_arguments_fault(box, ws):
    """Aider aider/io.py (read_text reports a file it cannot decode, it does not blame the request):
    a UTF-16 file with an odd trailing byte is shown with U+FFFD and the note says why."""
    rel = put(ws, "broken.txt", b"\xff\xfe" + "ok line\n".encode("utf-16-le") + b"\x41")
    result = box.call("read_file", {"path": rel})
    assert result.ok, result.error
    assert result.output.startswith("ok line\n") and "\ufffd" in result.output
    assert result.meta["invalid_encoding"] is True and "not valid UTF-16 LE" in result.note


def test_editing_a_file_that_is_not_utf8_is_a_typed_encoding_error(box, ws):
    rel = put(ws, "latin1.txt", "caf\xe9\n".encode("latin-1"))
    result = box.call("edit_file", {"path": rel, "old_text": "caf", "new_text": "CAF"})
    assert error_of(result) == "encoding_error" and result.error.recoverable


# ============================================================================== 7. mixed line endings
@pytest.mark.parametrize(
    "content, old, new, expected",
    [
        # a line inserted above untouched lines: their endings stay as they were
        (b"head\r\na\nb\r\nc\n", "a\nb\nc", "NEW\na\nb\nc", b"head\r\nNEW\na\nb\r\nc\n"),
        # a line removed between untouched ones
        (b"a\nb\r\nc\nd\r\n", "a\nb\nc\nd", "a\nc\nd", b"a\nc\nd\r\n"),
        # a line changed in the middle, context on both sides
        (b"x\r\ny\nz\r\n", "x\ny\nz", "x\nY\nz", b"x\r\nY\nz\r\n"),
    ],
)
def test_an_edit_in_a_mixed_file_changes_only_the_edited_lines(box, ws, content, old, new, expected):
    """Codex codex-rs/apply-patch/src/eol.rs and Aider aider/coders/editblock_coder.py: context lines
    the model repeats unchanged keep their own line endings; only the edited span may change, and
    the diff shows only the edited lines."""
    rel = put(ws, "mixed.txt", content)
    result = box.call("edit_file", {"path": rel, "old_text": old, "new_text": new})
    assert result.ok, result.error
    assert (ws / "mixed.txt").read_bytes() == expected
    changed = [line for line in result.diff.split("\n") if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    unchanged_context = [
        line[1:]
        for line in changed
        if line[1:].rstrip("\r") in old.split("\n") and line[1:].rstrip("\r") in new.split("\n")
    ]
    assert not unchanged_context, f"untouched lines appear in the diff: {changed}"


# ============================================================================== 8. legacy encodings
CP1251_SOURCE = (
    "// Модуль расчёта: сумма двух чисел\nint sum(int a, int b) {\n    return a + b;  // результат\n}\n"
).encode("cp1251")
LATIN1_TEXT = "Ça a été déjà très bien; naïve façade, œuvre à côté.\nLine two élève.\n".encode("cp1252")


@pytest.mark.parametrize("content, codec", [(CP1251_SOURCE * 3, "cp1251"), (LATIN1_TEXT * 3, "cp1252")])
def test_a_legacy_encoded_text_file_is_shown_not_called_binary(box, ws, content, codec):
    """Aider aider/io.py and SWE-agent's file viewer show such a file (decoding with replacement);
    calling mostly-ASCII windows-1251 or Latin-1 source "binary" hides it from the model."""
    rel = put(ws, "legacy.txt", content)
    result = box.call("read_file", {"path": rel})
    assert result.ok and not result.meta.get("binary"), result.output
    assert result.output == content.decode("utf-8", errors="replace")
    assert result.meta["encoding_guess"] == codec and codec in result.note and "not valid UTF-8" in result.note


def test_dense_high_bytes_without_text_stay_binary(box, ws):
    rel = put(ws, "noise.dat", bytes(range(128, 256)) * 8)
    assert box.call("read_file", {"path": rel}).meta["binary"] is True
