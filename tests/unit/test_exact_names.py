"""Structured listings are never parsed back from display text (issue 49). The agent gives list_files'
entries and grep_files' matches structured (meta `names`, `hits`: each name exact, sandbox_agent/
names.py), the API and the MCP server hand them on, and every name comes back usable: a following
read_file (list_files, grep_files) takes it. Names with a newline, a tab, bytes that are not UTF-8, a
`:1:` that looks like a match's line number, in real boxes. Before, a newline made two invented
entries and dropped the last real one, and a name that is not UTF-8 broke the agent's answer (the
host took the agent for lost and replaced the box)."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import anyio
import jsonschema
import pytest

from sandbox_agent import names, server
from tests.helpers import make_workspace

ROOT = Path(__file__).resolve().parents[2]
# name (as os.fsdecode gives it) -> content; a directory whose name is not UTF-8 holds one of them too
ODD = {
    "nl\nname": "one\n",
    "tab\tname": "two\n",
    "bad\udcffutf8": "three\n",
    "m:1:x": "four\n",
    "plain.txt": "five\n",
    "d\udcfe/in\nside": "six\n",
    "\x01" * 40: "seven\n",
}


def expected_entries() -> list[str]:
    return sorted([*ODD, "d\udcfe/"])


@pytest.mark.docker
@pytest.mark.parametrize("mode", ["bind", "copy"])
def test_list_and_grep_give_every_name_exact_and_each_reads_back(sandbox_image, tmp_path, mode):
    from orchestrator import Sandbox

    ws = make_workspace(tmp_path / "ws", ODD)
    with Sandbox(ws, auto_approve=True, mode=mode) as box:
        listed = box.list_files()
        assert sorted(listed.entries) == expected_entries() and len(listed.entries) == listed.result.meta["entries"]
        for entry in listed.entries:
            if entry.endswith("/"):
                assert box.list_files(entry).entries == ["d\udcfe/in\nside"]
            else:
                assert box.read_file(entry).text == ODD[entry]
        assert box.read_file(b"bad\xffutf8").text == "three\n"  # bytes too
        # the model's text: one entry a line, as ever; the bytes that are not UTF-8 shown escaped
        assert "bad\\xffutf8" in listed.output and "d\\xfe/" in listed.output
        found = box.grep_files(r"^(one|two|three|four|five|six|seven)$")
        assert sorted((m.path, m.line, m.text) for m in found.matches) == sorted(
            (n, 1, t.strip()) for n, t in ODD.items()
        )
        for match in found.matches:
            assert box.grep_files(".", path=match.path).matches[0].path == match.path
        assert box.list_files("d\udcfe").entries == ["d\udcfe/in\nside"]


@pytest.mark.docker
def test_a_name_holding_a_newline_is_one_entry_and_the_last_entry_is_kept(sandbox_image, tmp_path):
    from orchestrator import Sandbox

    ws = make_workspace(tmp_path / "ws", {"a\nb": "x\n", "tab\tc": "y\n", "z.txt": "z\n"})
    with Sandbox(ws, auto_approve=True) as box:
        assert box.list_files().entries == ["a\nb", "tab\tc", "z.txt"]
        assert [m.path for m in box.grep_files("^[xyz]$").matches] == ["a\nb", "tab\tc", "z.txt"]


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_the_mcp_server_gives_names_exact_and_takes_them_back(sandbox_image, tmp_path):
    from mcp import Client, StdioServerParameters

    ws = make_workspace(tmp_path / "ws", ODD)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "orchestrator.cli", "mcp", "--workspace", str(ws)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )

    async def session() -> None:
        async with Client(params, read_timeout_seconds=120) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            listed = await client.call_tool("list_files", {})
            schemas = {name: tool.output_schema for name, tool in tools.items() if tool.output_schema is not None}
            jsonschema.validate(listed.structured_content, schemas["list_files"])
            given = listed.structured_content["names"]
            assert sorted(os.fsencode(names.from_arg(n)) for n in given) == sorted(
                os.fsencode(e) for e in expected_entries()
            )
            assert {"bytes_b64": "YmFk/3V0Zjg="} in given and "nl\nname" in given
            for name in given:
                if not (names.from_arg(name)).endswith("/"):
                    read = await client.call_tool("read_file", {"path": name})
                    assert not read.is_error and read.structured_content["output"] == ODD[names.from_arg(name)]
            found = await client.call_tool("grep_files", {"pattern": "^three$"})
            jsonschema.validate(found.structured_content, schemas["grep_files"])
            assert found.structured_content["hits"] == [
                {"path": {"bytes_b64": "YmFk/3V0Zjg="}, "line": 1, "text": "three"}
            ]

    anyio.run(session)


# -- the agent alone ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["a.txt", "nl\nname", "tab\tname", "bad\udcffutf8", "\x01" * 300, "ü/ß", 'q"\\', "\udc80" * 3]
)
def test_exact_round_trips_and_is_never_longer_than_base64(name):
    form = names.exact(name)
    assert names.from_arg(form) == name and names.from_arg(json.loads(json.dumps(form))) == name
    cost = len(json.dumps(form, ensure_ascii=False, separators=(",", ":")))
    assert cost <= 4 * ((len(os.fsencode(name)) + 2) // 3) + len('{"bytes_b64":""}')
    json.dumps(form, ensure_ascii=False).encode("utf-8")  # valid UTF-8, whatever the name


@pytest.mark.parametrize("bad", [{"bytes_b64": "!!"}, {"bytes_b64": 3}, {"bytes_b64": "YQ==", "x": 1}, ["a"], 5, None])
def test_a_path_in_neither_form_is_refused(bad):
    with pytest.raises(ValueError):
        names.from_arg(bad)


def test_every_answer_the_agent_sends_is_valid_utf8(monkeypatch):
    """A tool echoing a name that is not UTF-8 into its text (a note, an error, a listing's line) is
    answered in valid UTF-8, the name shown escaped; before, the raw byte made the line unreadable."""
    buffer = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", type("Out", (), {"buffer": buffer})())
    server._send(
        {
            "v": 1,
            "id": 1,
            "ok": False,
            "output": "bad\udcffutf8\nx\\xy",
            "error": {"type": "file_not_found", "message": "d\udcfe: no"},
            "meta": {"unreadable": ["u\udc80"], "names": [names.exact("bad\udcffutf8")]},
        }
    )
    line = buffer.getvalue()
    message = json.loads(line.decode("utf-8"))
    assert message["output"] == "bad\\xffutf8\nx\\xy" and message["error"]["message"] == "d\\xfe: no"
    assert (
        message["meta"]["unreadable"] == ["u\\x80"] and names.from_arg(message["meta"]["names"][0]) == "bad\udcffutf8"
    )
