"""What a user of Gemini CLI, OpenHands (and openhands-aci's editor) or SWE-ReX expects of the file
tools, written against our contract (shared/spec/tools.md) and run through a real container.

The cases are the classes those projects' own tests check (read-file, write-file, edit, ls, grep,
ripGrep and fileUtils in Gemini CLI; the runtime editor tests in OpenHands and openhands-aci;
SWE-ReX's file execution tests), restated as behaviour a user sees: what comes back, what the file
holds afterwards, which typed error says why. The shell's cases are in test_peer_cases_shell.py.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.tools.args import validate_arguments
from tests.helpers import chown_tree, error_of, one_box_per_module, put

pytestmark = pytest.mark.docker


box, ws = one_box_per_module("peers")


def listed(result, ws: Path) -> list[str]:
    return [line.removeprefix(ws.name + "/") for line in result.output.splitlines() if not line.startswith("[")]


def grep_hits(result, ws: Path) -> list[tuple[str, int, str]]:
    hits = []
    for line in result.output.splitlines():
        if line.startswith("[") or line == "no matches":
            continue
        path, number, text = line.split(":", 2)
        hits.append((path.removeprefix(ws.name + "/"), int(number), text))
    return hits


# ============================================================================== read_file
def test_read_returns_the_file_exactly_with_its_trailing_newline(box, ws):
    rel = put(ws, "a.txt", "line 1\nline 2\n")
    result = box.call("read_file", {"path": rel})
    assert result.ok and result.output == "line 1\nline 2\n"
    assert result.meta["total_lines"] == 2 and result.meta["truncated"] is False


def test_read_a_file_without_a_final_newline(box, ws):
    rel = put(ws, "a.txt", "one\ntwo")
    result = box.call("read_file", {"path": rel})
    assert result.output == "one\ntwo" and result.meta["total_lines"] == 2
    assert box.call("read_file", {"path": rel, "offset": 2}).output == "two"


def test_read_a_file_of_blank_lines_counts_them(box, ws):
    rel = put(ws, "blank.txt", "\n\n\n")
    result = box.call("read_file", {"path": rel})
    assert result.output == "\n\n\n" and result.meta["total_lines"] == 3


@pytest.mark.parametrize(
    "offset, limit, expected, last",
    [
        (2, 2, "l2\nl3\n", 3),  # a window in the middle
        (4, 100, "l4\nl5\n", 5),  # a limit past the end gives the rest, not an error
        (5, 1, "l5\n", 5),  # the last line alone
        (1, 5, "l1\nl2\nl3\nl4\nl5\n", 5),
    ],
)
def test_read_a_range_of_lines(box, ws, offset, limit, expected, last):
    rel = put(ws, "five.txt", "".join(f"l{i}\n" for i in range(1, 6)))
    result = box.call("read_file", {"path": rel, "offset": offset, "limit": limit})
    assert result.ok and result.output == expected
    assert result.meta["first_line"] == offset and result.meta["last_line"] == last


def test_a_window_that_stops_before_the_end_says_where_to_read_on(box, ws):
    rel = put(ws, "five.txt", "".join(f"l{i}\n" for i in range(1, 6)))
    result = box.call("read_file", {"path": rel, "offset": 2, "limit": 2})
    assert result.meta["truncated"] is True and result.meta["next_offset"] == 4
    assert "offset=4" in result.note


def test_an_offset_past_the_end_is_a_typed_error_that_gives_the_length(box, ws):
    rel = put(ws, "five.txt", "".join(f"l{i}\n" for i in range(1, 6)))
    result = box.call("read_file", {"path": rel, "offset": 7})
    assert error_of(result) == "invalid_arguments" and "5" in result.error.message


@pytest.mark.parametrize("args", [{"offset": 0}, {"limit": 0}, {"offset": -3}])
def test_read_refuses_a_range_below_one_in_the_agent_and_on_the_host(box, ws, args):
    rel = put(ws, "a.txt", "x\n")
    assert error_of(box.call("read_file", {"path": rel, **args})) == "invalid_arguments"
    with pytest.raises(OpenAgentsError) as caught:
        validate_arguments("read_file", {"path": rel, **args})
    assert caught.value.type is ErrorType.INVALID_ARGUMENTS


def test_reading_a_large_file_in_pages_gives_every_byte_once(box, ws):
    """A file over the 48 KiB cap, read by following next_offset until the end, is the file."""
    content = "".join(f"{i:06d} " + "x" * (i % 97) + "\n" for i in range(4000))
    rel = put(ws, "big.txt", content)
    pages, offset = [], 1
    for _ in range(50):
        result = box.call("read_file", {"path": rel, "offset": offset})
        assert result.ok and len(result.output.encode()) <= 48 * 1024
        pages.append(result.output)
        if not result.meta["truncated"]:
            break
        offset = result.meta["next_offset"]
    assert len(pages) > 1 and "".join(pages) == content


def test_a_line_longer_than_the_cap_is_cut_and_says_so(box, ws):
    rel = put(ws, "wide.txt", "y" * 100_000 + "\nnext\n")
    result = box.call("read_file", {"path": rel})
    assert result.ok and len(result.output.encode()) <= 48 * 1024
    assert result.meta["truncated"] is True and "cut" in result.note


@pytest.mark.parametrize(
    "name, content",
    [
        ("文件.txt", "你好，世界\n第二行\n"),
        ("emoji 😀 file.md", "smile 😀 and flag 🇫🇷\n"),
        ("ümlaut ä.txt", "grüße\n"),
        ("with space.txt", "spaced\n"),
        ("tabs.py", "def f():\n\treturn 1\n\t\t# two tabs\n"),
        ("crlf.txt", "a\r\nb\r\n"),
        ("image.svg", '<svg xmlns="http://www.w3.org/2000/svg"><rect width="1"/></svg>\n'),
    ],
)
def test_read_unicode_paths_and_content_byte_for_byte(box, ws, name, content):
    rel = put(ws, name, content)
    result = box.call("read_file", {"path": rel})
    assert result.ok and result.output == content
    assert result.meta["sha256"] == hashlib.sha256(content.encode()).hexdigest()


def test_read_counts_lines_of_a_crlf_file(box, ws):
    rel = put(ws, "crlf.txt", "a\r\nb\r\nc\r\n")
    assert box.call("read_file", {"path": rel}).meta["total_lines"] == 3
    assert box.call("read_file", {"path": rel, "offset": 3}).output == "c\r\n"


@pytest.mark.parametrize("path", ["./{d}/a.txt", "{d}//a.txt", "{d}/./a.txt"])
def test_read_accepts_non_normalised_relative_paths(box, ws, path):
    put(ws, "a.txt", "here\n")
    assert box.call("read_file", {"path": path.format(d=ws.name)}).output == "here\n"


@pytest.mark.parametrize(
    "path, kind",
    [
        ("../etc/passwd", "path_outside_workspace"),
        ("/etc/passwd", "path_outside_workspace"),
        ("{d}/../../etc/passwd", "path_outside_workspace"),
        ("{d}/a\x00.txt", "path_invalid"),
    ],
)
def test_read_refuses_paths_outside_the_workspace(box, ws, path, kind):
    put(ws, "a.txt", "x")
    assert error_of(box.call("read_file", {"path": path.format(d=ws.name)})) == kind


def test_read_refuses_a_symlink_that_leads_out(box, ws):
    (ws / "out").symlink_to("/etc/hostname")
    (ws / "outdir").symlink_to("/etc")
    assert error_of(box.call("read_file", {"path": f"{ws.name}/out"})) == "path_outside_workspace"
    assert error_of(box.call("read_file", {"path": f"{ws.name}/outdir/hostname"})) == "path_outside_workspace"


def test_read_follows_a_symlink_that_stays_inside(box, ws):
    put(ws, "real.txt", "real\n")
    (ws / "link.txt").symlink_to("real.txt")
    chown_tree(ws)
    result = box.call("read_file", {"path": f"{ws.name}/link.txt"})
    assert result.ok and result.output == "real\n"


def test_names_that_only_start_with_two_dots_are_ordinary(box, ws):
    rel = put(ws, "..hidden", "dots\n")
    assert box.call("read_file", {"path": rel}).output == "dots\n"
    assert box.call("write_file", {"path": f"{ws.name}/..new", "content": "n"}).ok
    hits = grep_hits(box.call("grep_files", {"pattern": "dots|n", "path": ws.name}), ws)
    assert {h[0] for h in hits} == {"..hidden", "..new"}


# ============================================================================== write_file
def test_write_creates_a_file_in_new_nested_directories(box, ws):
    result = box.call("write_file", {"path": f"{ws.name}/a/b/c/new.txt", "content": "hello\n"})
    assert result.ok and (ws / "a/b/c/new.txt").read_text() == "hello\n"
    assert result.meta["created"] is True


def test_write_replaces_an_existing_file_and_says_it_was_not_created(box, ws):
    rel = put(ws, "f.txt", "old content that is longer\n")
    result = box.call("write_file", {"path": rel, "content": "new\n"})
    assert result.ok and result.meta["created"] is False
    assert (ws / "f.txt").read_text() == "new\n"


@pytest.mark.parametrize(
    "content", ["", "no final newline", "a\r\nb\r\n", "\ttab\n", "中文 😀\n", "\ufeffbom\n", "x" * 200_000]
)
def test_write_stores_the_content_exactly(box, ws, content):
    rel = f"{ws.name}/out.txt"
    result = box.call("write_file", {"path": rel, "content": content})
    assert result.ok, result
    assert (ws / "out.txt").read_bytes() == content.encode()
    assert result.meta["sha256"] == hashlib.sha256(content.encode()).hexdigest()
    assert box.call("read_file", {"path": rel}).meta["sha256"] == result.meta["sha256"]


def test_write_to_a_unicode_path(box, ws):
    assert box.call("write_file", {"path": f"{ws.name}/目录/😀.txt", "content": "ok"}).ok
    assert (ws / "目录" / "😀.txt").read_text() == "ok"


def test_write_onto_a_directory_is_a_typed_error(box, ws):
    (ws / "d").mkdir()
    assert error_of(box.call("write_file", {"path": f"{ws.name}/d", "content": "x"})) == "is_directory"
    assert (ws / "d").is_dir()


def test_write_under_a_file_is_not_a_directory(box, ws):
    put(ws, "f.txt", "x")
    assert error_of(box.call("write_file", {"path": f"{ws.name}/f.txt/child.txt", "content": "x"})) == "not_a_directory"


@pytest.mark.parametrize("path", [".git/config", "{d}/.git/hooks/pre-commit", "{d}/sub/.GIT/x"])
def test_write_never_goes_under_git(box, ws, path):
    assert error_of(box.call("write_file", {"path": path.format(d=ws.name), "content": "x"})) == "path_in_git_dir"


def test_write_does_not_follow_a_symlink_out_of_the_workspace(box, ws, tmp_path):
    (ws / "escape").symlink_to(tmp_path)
    result = box.call("write_file", {"path": f"{ws.name}/escape/pwned.txt", "content": "x"})
    assert error_of(result) == "path_outside_workspace" and not (tmp_path / "pwned.txt").exists()


# ============================================================================== edit_file
def test_edit_replaces_once_and_shows_a_diff(box, ws):
    rel = put(ws, "f.py", "def f():\n    return 1\n")
    result = box.call("edit_file", {"path": rel, "old_text": "return 1", "new_text": "return 2"})
    assert result.ok and (ws / "f.py").read_text() == "def f():\n    return 2\n"
    assert result.meta["replacements"] == 1
    assert "-    return 1" in result.diff and "+    return 2" in result.diff


def test_edit_across_several_lines(box, ws):
    rel = put(ws, "f.txt", "a\nb\nc\nd\n")
    assert box.call("edit_file", {"path": rel, "old_text": "b\nc\n", "new_text": "B\nBB\nC\n"}).ok
    assert (ws / "f.txt").read_text() == "a\nB\nBB\nC\nd\n"


def test_edit_with_an_empty_new_text_deletes(box, ws):
    rel = put(ws, "f.txt", "keep\ndrop me\nkeep too\n")
    assert box.call("edit_file", {"path": rel, "old_text": "drop me\n", "new_text": ""}).ok
    assert (ws / "f.txt").read_text() == "keep\nkeep too\n"


def test_edit_keeps_tabs_and_needs_them_matched(box, ws):
    rel = put(ws, "f.py", "def f():\n\tif x:\n\t\treturn 1\n")
    ok = box.call("edit_file", {"path": rel, "old_text": "\t\treturn 1", "new_text": "\t\treturn 2"})
    assert ok.ok and (ws / "f.py").read_text() == "def f():\n\tif x:\n\t\treturn 2\n"
    spaces = box.call("edit_file", {"path": rel, "old_text": "        return 2", "new_text": "        return 3"})
    assert error_of(spaces) == "edit_no_match"
    assert (ws / "f.py").read_text() == "def f():\n\tif x:\n\t\treturn 2\n"


def test_edit_no_match_points_at_the_close_text(box, ws):
    """OpenHands and Gemini CLI both tell the model what it got wrong; a bare 'not found' makes it guess."""
    rel = put(ws, "f.py", "def f():\n\tif x:\n\t\treturn compute(value)\n")
    result = box.call("edit_file", {"path": rel, "old_text": "        return compute(value)", "new_text": "pass"})
    assert error_of(result) == "edit_no_match"
    assert "line 3" in result.error.message and "whitespace" in result.error.message


def test_edit_no_match_names_the_nearest_line_for_a_typo(box, ws):
    rel = put(ws, "f.py", "alpha = 1\nbeta = compute_total(items)\ngamma = 3\n")
    result = box.call("edit_file", {"path": rel, "old_text": "beta = compute_totl(items)", "new_text": "beta = 0"})
    assert error_of(result) == "edit_no_match"
    assert "line 2" in result.error.message and "compute_total" in result.error.message


def test_edit_no_match_without_anything_close_says_so_plainly(box, ws):
    rel = put(ws, "f.txt", "alpha\nbeta\n")
    result = box.call("edit_file", {"path": rel, "old_text": "zzzz qqqq wwww", "new_text": "x"})
    assert error_of(result) == "edit_no_match" and "f.txt" in result.error.message
    assert (ws / "f.txt").read_text() == "alpha\nbeta\n"


def test_edit_ambiguous_counts_and_locates_the_occurrences(box, ws):
    rel = put(ws, "f.txt", "x = 1\ny = 2\nx = 1\nz\nx = 1\n")
    result = box.call("edit_file", {"path": rel, "old_text": "x = 1", "new_text": "x = 9"})
    assert error_of(result) == "edit_ambiguous"
    assert "3 times" in result.error.message and "1, 3, 5" in result.error.message
    assert (ws / "f.txt").read_text() == "x = 1\ny = 2\nx = 1\nz\nx = 1\n"


def test_edit_ambiguous_multiline_occurrences(box, ws):
    rel = put(ws, "f.txt", "if a:\n    go()\nif a:\n    go()\n")
    result = box.call("edit_file", {"path": rel, "old_text": "if a:\n    go()", "new_text": "stop()"})
    assert error_of(result) == "edit_ambiguous" and "2 times" in result.error.message


def test_edit_allow_multiple_replaces_every_occurrence_and_counts(box, ws):
    rel = put(ws, "f.txt", "foo bar foo\nfoo\n")
    result = box.call("edit_file", {"path": rel, "old_text": "foo", "new_text": "baz", "allow_multiple": True})
    assert result.ok and result.meta["replacements"] == 3
    assert (ws / "f.txt").read_text() == "baz bar baz\nbaz\n"


def test_edit_where_new_text_equals_old_text_is_refused_and_writes_nothing(box, ws):
    rel = put(ws, "f.txt", "same\n")
    before = (ws / "f.txt").stat().st_mtime_ns
    result = box.call("edit_file", {"path": rel, "old_text": "same", "new_text": "same"})
    assert error_of(result) == "invalid_arguments" and "same" in result.error.message
    assert (ws / "f.txt").stat().st_mtime_ns == before
    with pytest.raises(OpenAgentsError) as caught:
        validate_arguments("edit_file", {"path": rel, "old_text": "same", "new_text": "same"})
    assert caught.value.type is ErrorType.INVALID_ARGUMENTS


@pytest.mark.parametrize(
    "old, new",
    [
        ("a.b(c)", r"\1 $1 $& \n \\ "),  # regex syntax in either side is literal text
        ("[x]+*?", "{y}|^$"),
        ("price: $5", "price: $$10"),
    ],
)
def test_edit_texts_are_literal_not_patterns(box, ws, old, new):
    rel = put(ws, "f.txt", f"before\n{old}\naXb(c)\n")
    result = box.call("edit_file", {"path": rel, "old_text": old, "new_text": new})
    assert result.ok, result
    assert (ws / "f.txt").read_text() == f"before\n{new}\naXb(c)\n"


def test_edit_the_last_line_of_a_file_without_a_final_newline(box, ws):
    rel = put(ws, "f.txt", "first\nlast")
    assert box.call("edit_file", {"path": rel, "old_text": "last", "new_text": "LAST"}).ok
    assert (ws / "f.txt").read_bytes() == b"first\nLAST"
    assert error_of(box.call("edit_file", {"path": rel, "old_text": "LAST\n", "new_text": "x"})) == "edit_no_match"


def test_edit_adding_lines_at_the_end_of_a_file_without_a_final_newline(box, ws):
    rel = put(ws, "f.txt", "first\nlast")
    assert box.call("edit_file", {"path": rel, "old_text": "last", "new_text": "last\nmore"}).ok
    assert (ws / "f.txt").read_bytes() == b"first\nlast\nmore"


def test_edit_a_crlf_file_with_lf_old_text(box, ws):
    rel = put(ws, "f.txt", "one\r\ntwo\r\nthree\r\n")
    assert box.call("edit_file", {"path": rel, "old_text": "one\ntwo\n", "new_text": "1\n2\n"}).ok
    assert (ws / "f.txt").read_bytes() == b"1\r\n2\r\nthree\r\n"


def test_edit_inserts_chinese_text_into_an_english_file(box, ws):
    rel = put(ws, "f.txt", "hello\nworld\n")
    assert box.call("edit_file", {"path": rel, "old_text": "hello\n", "new_text": "hello\n你好，世界 😀\n"}).ok
    assert (ws / "f.txt").read_text(encoding="utf-8") == "hello\n你好，世界 😀\nworld\n"


def test_edit_matches_unicode_old_text(box, ws):
    rel = put(ws, "f.txt", "名前 = 'テスト'\nemoji = '👍'\n")
    assert box.call("edit_file", {"path": rel, "old_text": "'👍'", "new_text": "'👎'"}).ok
    assert (ws / "f.txt").read_text(encoding="utf-8") == "名前 = 'テスト'\nemoji = '👎'\n"


def test_edit_a_missing_file_or_a_directory(box, ws):
    (ws / "d").mkdir()
    assert (
        error_of(box.call("edit_file", {"path": f"{ws.name}/nope.txt", "old_text": "a", "new_text": "b"}))
        == "file_not_found"
    )
    assert error_of(box.call("edit_file", {"path": f"{ws.name}/d", "old_text": "a", "new_text": "b"})) == "is_directory"


def test_edit_with_the_hash_read_gave_succeeds_and_a_stale_one_is_refused(box, ws):
    rel = put(ws, "f.txt", "v1\n")
    digest = box.call("read_file", {"path": rel}).meta["sha256"]
    (ws / "f.txt").write_text("v1 changed\n")
    stale = box.call("edit_file", {"path": rel, "old_text": "v1", "new_text": "v2", "expected_sha256": digest})
    assert error_of(stale) == "stale_content" and (ws / "f.txt").read_text() == "v1 changed\n"
    fresh = box.call("read_file", {"path": rel}).meta["sha256"]
    assert box.call("edit_file", {"path": rel, "old_text": "v1", "new_text": "v2", "expected_sha256": fresh}).ok


def test_edit_refuses_a_file_that_is_not_utf8_and_leaves_it(box, ws):
    data = "caf\xe9\nna\xefve\n".encode("latin-1")
    rel = put(ws, "latin1.txt", data)
    result = box.call("edit_file", {"path": rel, "old_text": "na", "new_text": "NA"})
    assert not result.ok and result.error.type.recoverable
    assert "UTF-8" in result.error.message
    assert (ws / "latin1.txt").read_bytes() == data


@pytest.mark.parametrize("codec, bom", [("utf-16-le", b"\xff\xfe"), ("utf-16-be", b"\xfe\xff")])
def test_edit_a_utf16_file_it_can_read_keeps_its_encoding(box, ws, codec, bom):
    """read_file decodes UTF-16 with a BOM; the model then edits what it read. The file stays UTF-16
    with its BOM (the contract keeps the byte-order mark) and its CRLF endings."""
    rel = put(ws, "wide.txt", bom + "名前\r\nvalue = 1\r\n".encode(codec))
    read = box.call("read_file", {"path": rel})
    result = box.call(
        "edit_file",
        {"path": rel, "old_text": "value = 1", "new_text": "value = 2", "expected_sha256": read.meta["sha256"]},
    )
    assert result.ok, result
    assert (ws / "wide.txt").read_bytes() == bom + "名前\r\nvalue = 2\r\n".encode(codec)


def test_edit_under_git_is_refused(box, ws):
    assert (
        error_of(box.call("edit_file", {"path": f"{ws.name}/.git/config", "old_text": "a", "new_text": "b"}))
        == "path_in_git_dir"
    )


# ============================================================================== list_files
def test_list_an_empty_directory(box, ws):
    (ws / "empty").mkdir()
    chown_tree(ws)
    result = box.call("list_files", {"path": f"{ws.name}/empty"})
    assert result.ok and "empty" in result.output.lower() and result.meta["entries"] == 0


def test_list_puts_directories_first_then_files_by_name(box, ws):
    for name in ("b-file.txt", "a-file.txt"):
        put(ws, name, "x")
    for name in ("y-dir", "x-dir"):
        (ws / name).mkdir()
    chown_tree(ws)
    result = box.call("list_files", {"path": ws.name, "recursive": False})
    assert listed(result, ws) == ["x-dir/", "y-dir/", "a-file.txt", "b-file.txt"]


def test_a_recursive_listing_shows_each_directory_with_its_contents(box, ws):
    for name in ("z.txt", "a/inner.txt", "a/sub/deep.txt", "b/only.txt"):
        put(ws, name, "x")
    entries = listed(box.call("list_files", {"path": ws.name}), ws)
    assert set(entries) == {"a/", "a/inner.txt", "a/sub/", "a/sub/deep.txt", "b/", "b/only.txt", "z.txt"}
    for child in ("a/inner.txt", "a/sub/", "a/sub/deep.txt"):
        assert entries.index("a/") < entries.index(child)
    assert entries.index("a/sub/") < entries.index("a/sub/deep.txt")


def test_list_shows_hidden_files_and_skips_only_the_named_directories(box, ws):
    for name in (
        ".env.example",
        ".github/workflows/ci.yml",
        ".gitignore",
        "node_modules/x/index.js",
        "dist/out.js",
        "target/debug/a",
        "distribution/keep.txt",
        "src/node_modules/y.js",
    ):
        put(ws, name, "x")
    (ws / ".git").mkdir()
    entries = listed(box.call("list_files", {"path": ws.name}), ws)
    for shown in (".env.example", ".github/", ".github/workflows/ci.yml", ".gitignore", "distribution/keep.txt"):
        assert shown in entries
    assert not any(e.startswith((".git/", "node_modules", "dist/", "target", "src/node_modules")) for e in entries), (
        entries
    )


def test_list_names_paths_from_the_workspace_root(box, ws):
    put(ws, "sub/f.txt", "x")
    result = box.call("list_files", {"path": f"{ws.name}/sub"})
    assert result.output.splitlines() == [f"{ws.name}/sub/f.txt"]


def test_list_does_not_enter_a_symlinked_directory(box, ws):
    put(ws, "real/inside.txt", "x")
    (ws / "loop").symlink_to(".")
    (ws / "etc").symlink_to("/etc")
    entries = listed(box.call("list_files", {"path": ws.name}), ws)
    assert "loop" in entries and "etc" in entries and "real/inside.txt" in entries
    assert not any(e.startswith(("loop/", "etc/")) for e in entries)


def test_list_a_symlink_to_a_directory_outside_is_refused(box, ws):
    (ws / "etc").symlink_to("/etc")
    assert error_of(box.call("list_files", {"path": f"{ws.name}/etc"})) == "path_outside_workspace"


def test_list_unicode_names(box, ws):
    put(ws, "日本語/ファイル.txt", "x")
    put(ws, "😀.md", "x")
    entries = listed(box.call("list_files", {"path": ws.name}), ws)
    assert {"日本語/", "日本語/ファイル.txt", "😀.md"} <= set(entries)


def test_list_stops_at_the_cap_and_says_how_to_see_more(box, ws):
    for i in range(520):
        (ws / f"f{i:04d}").write_text("x")
    chown_tree(ws)
    result = box.call("list_files", {"path": ws.name})
    assert result.meta["truncated"] is True and len(listed(result, ws)) == 500
    assert "500" in result.output.splitlines()[-1]


# ============================================================================== grep_files
def test_grep_gives_path_line_and_text(box, ws):
    put(ws, "a.txt", "zero\nneedle one\nnothing\nneedle two\n")
    put(ws, "sub/b.txt", "needle three")
    hits = grep_hits(box.call("grep_files", {"pattern": "needle", "path": ws.name}), ws)
    assert sorted(hits) == [("a.txt", 2, "needle one"), ("a.txt", 4, "needle two"), ("sub/b.txt", 1, "needle three")]


def test_grep_with_no_match_is_a_success_that_says_so(box, ws):
    put(ws, "a.txt", "hay\n")
    result = box.call("grep_files", {"pattern": "needle", "path": ws.name})
    assert result.ok and result.meta["matches"] == 0 and "no matches" in result.output.lower()


@pytest.mark.parametrize(
    "pattern, expected",
    [
        (r"foo\(\)", ["call foo() here"]),
        (r"a\.b", ["a.b"]),
        (r"\$HOME", ["echo $HOME"]),
        (r"\[x\]", ["list[x]"]),
        (r"^\s+indented", ["    indented"]),
        (r"\bword\b", ["a word here"]),
        (r"v\d+\.\d+", ["version v1.23"]),
        (r"foo|bar", ["call foo() here", "bar"]),
    ],
)
def test_grep_regex_special_characters(box, ws, pattern, expected):
    put(
        ws,
        "f.txt",
        "call foo() here\na.b\naxb\necho $HOME\nlist[x]\n    indented\nnot "
        "indented\na word here\nswordfish\nversion v1.23\nbar\n",
    )
    hits = grep_hits(box.call("grep_files", {"pattern": pattern, "path": ws.name}), ws)
    assert [h[2] for h in hits] == expected


def test_grep_is_case_sensitive_unless_asked(box, ws):
    put(ws, "f.txt", "Hello\nhello\nHELLO\n")
    sensitive = grep_hits(box.call("grep_files", {"pattern": "hello", "path": ws.name}), ws)
    insensitive = grep_hits(box.call("grep_files", {"pattern": "hello", "path": ws.name, "ignore_case": True}), ws)
    assert [h[1] for h in sensitive] == [2] and [h[1] for h in insensitive] == [1, 2, 3]


def test_grep_a_single_file(box, ws):
    rel = put(ws, "one.txt", "x\nmatch\n")
    put(ws, "other.txt", "match\n")
    hits = grep_hits(box.call("grep_files", {"pattern": "match", "path": rel}), ws)
    assert hits == [("one.txt", 2, "match")]


def test_grep_a_missing_path_is_file_not_found(box, ws):
    assert error_of(box.call("grep_files", {"pattern": "x", "path": f"{ws.name}/missing"})) == "file_not_found"


@pytest.mark.parametrize("pattern", ["(unclosed", "[a-", "*star", "a{2,1}"])
def test_grep_an_invalid_regex_is_typed(box, ws, pattern):
    assert error_of(box.call("grep_files", {"pattern": pattern, "path": ws.name})) == "invalid_regex"


def test_grep_skips_binary_files(box, ws):
    put(ws, "blob.bin", b"\x00\x01needle\x00\xff")
    put(ws, "img.png", b"\x89PNG\r\n\x1a\n\x00needle")
    put(ws, "text.txt", "needle\n")
    hits = grep_hits(box.call("grep_files", {"pattern": "needle", "path": ws.name}), ws)
    assert [h[0] for h in hits] == ["text.txt"]


def test_grep_searches_hidden_files_but_not_skipped_directories(box, ws):
    put(ws, ".env", "needle\n")
    put(ws, "node_modules/lib/index.js", "needle\n")
    put(ws, ".git/config", "needle\n")
    put(ws, "src/a.js", "needle\n")
    found = {h[0] for h in grep_hits(box.call("grep_files", {"pattern": "needle", "path": ws.name}), ws)}
    assert found == {".env", "src/a.js"}


@pytest.mark.parametrize(
    "glob, expected",
    [
        ("*.js", {"a.js", "src/b.js"}),
        ("*.{js,ts}", {"a.js", "src/b.js", "src/c.ts"}),
        ("src/**", {"src/b.js", "src/c.ts", "src/deep/d.py"}),
        ("**/deep/*.py", {"src/deep/d.py"}),
        ("*.PY", set()),  # globs are case-sensitive, as ripgrep's are
    ],
)
def test_grep_include_globs(box, ws, glob, expected):
    for name in ("a.js", "src/b.js", "src/c.ts", "src/deep/d.py", "e.md"):
        put(ws, name, "needle\n")
    found = {h[0] for h in grep_hits(box.call("grep_files", {"pattern": "needle", "path": ws.name, "glob": glob}), ws)}
    assert found == expected


def test_grep_file_names_with_spaces_colons_and_unicode(box, ws):
    put(ws, "with space.txt", "needle\n")
    put(ws, "日本/データ.txt", "needle\n")
    put(ws, "emoji😀.txt", "needle\n")
    found = {h[0] for h in grep_hits(box.call("grep_files", {"pattern": "needle", "path": ws.name}), ws)}
    assert found == {"with space.txt", "日本/データ.txt", "emoji😀.txt"}


def test_grep_unicode_patterns_and_content(box, ws):
    put(ws, "f.txt", "价格: 100元\nprice: 100\nsmile 😀\n")
    hits = grep_hits(box.call("grep_files", {"pattern": "元|😀", "path": ws.name}), ws)
    assert [(h[1], h[2]) for h in hits] == [(1, "价格: 100元"), (3, "smile 😀")]


def test_grep_crlf_lines_come_back_without_the_carriage_return(box, ws):
    put(ws, "f.txt", "one\r\nneedle\r\nthree\r\n")
    hits = grep_hits(box.call("grep_files", {"pattern": "needle$", "path": ws.name}), ws)
    assert hits == [("f.txt", 2, "needle")]


def test_grep_in_deeply_nested_directories(box, ws):
    deep = "/".join(f"d{i}" for i in range(30))
    put(ws, f"{deep}/f.txt", "needle\n")
    hits = grep_hits(box.call("grep_files", {"pattern": "needle", "path": ws.name}), ws)
    assert hits == [(f"{deep}/f.txt", 1, "needle")]


def test_grep_stops_at_the_cap_and_says_so(box, ws):
    put(ws, "many.txt", "needle\n" * 300)
    result = box.call("grep_files", {"pattern": "needle", "path": ws.name})
    assert result.meta["truncated"] is True and len(grep_hits(result, ws)) == 200
    assert "200" in result.output.splitlines()[-1]


def test_grep_does_not_follow_a_symlink_out(box, ws):
    (ws / "etc").symlink_to("/etc")
    (ws / "passwd").symlink_to("/etc/passwd")
    put(ws, "f.txt", "root\n")
    found = {h[0] for h in grep_hits(box.call("grep_files", {"pattern": "root", "path": ws.name}), ws)}
    assert found == {"f.txt"}


# ============================================================================== classes added after the first pass
@pytest.mark.parametrize(
    "content, binary",
    [
        (b"\x80" * 128, True),  # dense invalid UTF-8 (Gemini CLI's isBinaryFile case)
        (bytes(range(128, 256)) * 8, True),
        ("print('\ufffd literal replacement char')\n".encode(), False),  # a real U+FFFD is text
        ("中文 😀 \ufffd mixed\n".encode() * 20, False),
        ("café au lait\n".encode("latin-1"), False),  # one stray byte: text, flagged
        ("\ufeffutf-8 with a bom\n".encode(), False),
    ],
)
def test_read_judges_binary_as_users_expect(box, ws, content, binary):
    rel = put(ws, "f.dat", content)
    result = box.call("read_file", {"path": rel})
    assert result.ok and bool(result.meta.get("binary")) is binary
    if binary:
        assert "\ufffd" not in result.output and str(len(content)) in result.output
    else:
        assert result.output.replace("\ufffd", "") == content.decode("utf-8", errors="ignore").removeprefix(
            "\ufeff"
        ).replace("\ufffd", "")


def test_grep_reports_in_a_stable_order(box, ws):
    """grep reports in a stable order (a directory's files by name, then its
    subdirectories); list_files' directories-first order does not change it."""
    for name in ("b.txt", "a/z.txt", "c/d/e.txt", "a.txt"):
        put(ws, name, "hit\n")
    hits = grep_hits(box.call("grep_files", {"pattern": "hit", "path": ws.name}), ws)
    assert [h[0] for h in hits] == [
        "a.txt",
        "b.txt",
        "a/z.txt",
        "c/d/e.txt",
    ]  # a directory's files, then its subdirectories, by name


def test_gitignored_files_are_listed_and_searched(box, ws):
    """The contract skips only .git, node_modules, target and dist; .gitignore does not hide files."""
    put(ws, ".gitignore", "*.log\nbuild/\n")
    put(ws, "app.log", "needle\n")
    put(ws, "build/out.txt", "needle\n")
    assert {"app.log", "build/", "build/out.txt"} <= set(listed(box.call("list_files", {"path": ws.name}), ws))
    found = {h[0] for h in grep_hits(box.call("grep_files", {"pattern": "needle", "path": ws.name}), ws)}
    assert found == {"app.log", "build/out.txt"}


def test_list_or_grep_a_skipped_directory_named_explicitly(box, ws):
    put(ws, "node_modules/pkg/index.js", "needle\n")
    assert "node_modules/pkg/index.js" in listed(box.call("list_files", {"path": f"{ws.name}/node_modules"}), ws)
    hits = grep_hits(box.call("grep_files", {"pattern": "needle", "path": f"{ws.name}/node_modules/pkg/index.js"}), ws)
    assert hits == [("node_modules/pkg/index.js", 1, "needle")]


def test_edit_an_empty_file_is_no_match(box, ws):
    rel = put(ws, "empty.txt", "")
    assert error_of(box.call("edit_file", {"path": rel, "old_text": "x", "new_text": "y"})) == "edit_no_match"
    assert (ws / "empty.txt").read_bytes() == b""


def test_write_then_edit_then_read_round_trip(box, ws):
    rel = f"{ws.name}/flow.py"
    assert box.call("write_file", {"path": rel, "content": "def main():\n    print('hi')\n"}).ok
    first = box.call("read_file", {"path": rel})
    assert box.call(
        "edit_file", {"path": rel, "old_text": "'hi'", "new_text": "'bye'", "expected_sha256": first.meta["sha256"]}
    ).ok
    again = box.call(
        "edit_file", {"path": rel, "old_text": "'bye'", "new_text": "'x'", "expected_sha256": first.meta["sha256"]}
    )
    assert error_of(again) == "stale_content"
    assert box.call("read_file", {"path": rel}).output == "def main():\n    print('bye')\n"


@pytest.mark.parametrize(
    "tool, args, kind",
    [
        ("write_file", {"path": "newdir/", "content": "x"}, "is_directory"),  # not a file called newdir
        ("write_file", {"path": "f.txt/", "content": "x"}, "not_a_directory"),
        ("read_file", {"path": "f.txt/"}, "not_a_directory"),
        ("edit_file", {"path": "f.txt/", "old_text": "x", "new_text": "y"}, "not_a_directory"),
        ("grep_files", {"pattern": "x", "path": "f.txt/"}, "not_a_directory"),
        ("read_file", {"path": "nothing/"}, "file_not_found"),
    ],
)
def test_a_trailing_slash_names_a_directory(box, ws, tool, args, kind):
    put(ws, "f.txt", "x\n")
    result = box.call(tool, {**args, "path": f"{ws.name}/{args['path']}"})
    assert error_of(result) == kind
    assert sorted(p.name for p in ws.iterdir()) == ["f.txt"] and (ws / "f.txt").read_text() == "x\n"


def test_grep_an_unreadable_file_named_explicitly_is_permission_denied(box, ws):
    rel = put(ws, "secret.txt", "needle\n", mode=0)
    try:
        result = box.call("grep_files", {"pattern": "needle", "path": rel})
    finally:
        (ws / "secret.txt").chmod(0o644)
    assert error_of(result) == "permission_denied"
    assert error_of(box.call("read_file", {"path": rel.replace("secret", "nope")})) == "file_not_found"


def test_grep_a_binary_file_named_explicitly_says_it_was_not_searched(box, ws):
    rel = put(ws, "blob.bin", b"needle\x00\x01\x02")
    result = box.call("grep_files", {"pattern": "needle", "path": rel})
    assert result.ok and result.meta["matches"] == 0 and "binary" in result.note


def test_write_and_edit_through_a_symlink_inside_keep_the_link(box, ws):
    put(ws, "real.txt", "target\n")
    (ws / "link.txt").symlink_to("real.txt")
    assert box.call("edit_file", {"path": f"{ws.name}/link.txt", "old_text": "target", "new_text": "edited"}).ok
    assert (ws / "link.txt").is_symlink() and (ws / "real.txt").read_text() == "edited\n"
    assert box.call("write_file", {"path": f"{ws.name}/link.txt", "content": "written\n"}).ok
    assert (ws / "link.txt").is_symlink() and (ws / "real.txt").read_text() == "written\n"


def test_read_a_file_without_read_permission_is_permission_denied(box, ws):
    rel = put(ws, "secret.txt", "s\n", mode=0)
    try:
        assert error_of(box.call("read_file", {"path": rel})) == "permission_denied"
    finally:
        (ws / "secret.txt").chmod(0o644)


def test_a_nul_byte_past_the_first_block_still_makes_the_file_binary(box, ws):
    content = b"a" * 9000 + b"\n" + b"text\x00more\n"
    rel = put(ws, "late.bin", content)
    result = box.call("read_file", {"path": rel})
    assert result.ok and result.meta["binary"] is True and "\x00" not in result.output
    assert result.meta["sha256"] == hashlib.sha256(content).hexdigest() and str(len(content)) in result.output


@pytest.mark.parametrize(
    "tool, args",
    [
        ("write_file", {"content": "x"}),
        ("read_file", {}),
        ("edit_file", {"old_text": "a", "new_text": "b"}),
    ],
)
def test_a_name_longer_than_the_file_system_allows_is_a_path_error(box, ws, tool, args):
    result = box.call(tool, {"path": f"{ws.name}/{'n' * 300}.txt", **args})
    assert error_of(result) == "path_invalid" and result.error.recoverable


def test_a_writable_file_in_a_read_only_directory_can_be_written_and_edited(box, ws):
    """As with an editor or `>`: the file's own permission decides, not the directory's (which only
    forbids new entries). The result says the write was not atomic; no temp file is left."""
    rel = put(ws, "rodir/f.txt", "one\ntwo\nthree\n")
    (ws / "rodir").chmod(0o555)
    try:
        edit = box.call("edit_file", {"path": rel, "old_text": "two", "new_text": "2"})
        assert edit.ok, edit
        assert (
            (ws / "rodir/f.txt").read_text() == "one\n2\nthree\n"
            and edit.meta["atomic"] is False
            and "in place" in edit.note
        )
        write = box.call("write_file", {"path": rel, "content": "short\n"})
        assert write.ok and (ws / "rodir/f.txt").read_text() == "short\n"
        new = box.call("write_file", {"path": f"{ws.name}/rodir/new.txt", "content": "n"})
        assert error_of(new) == "permission_denied"
        assert sorted(p.name for p in (ws / "rodir").iterdir()) == ["f.txt"]
    finally:
        (ws / "rodir").chmod(0o755)
