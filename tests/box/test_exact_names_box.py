"""The tests of tests/unit/test_exact_names.py that need a real box (issue 48: one tier per folder);
what they are about is said there."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import jsonschema
import pytest

from sandbox_agent import names
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
