"""Over MCP, a tool call's structuredContent carries the gate's records of the requests it made
(issue 29): what the audit says reaches an MCP client too, in the declared outputSchema."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import jsonschema
import pytest
from mcp import Client, StdioServerParameters

from tests.helpers import make_workspace
from tests.helpers.egress import FETCH, OUTER_CIDR

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]


def test_mcp_results_carry_the_calls_egress_records(egress_project, sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"fetch.py": FETCH})
    admin = tmp_path / "admin.toml"
    admin.write_text(f'[egress]\nallow_cidrs = ["{OUTER_CIDR}"]\n[[rules]]\ntool = "shell"\ndecision = "allow"\n')
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OA_ADMIN_POLICY": str(admin),
        "OA_EGRESS_OUTER_NETWORK": egress_project["outer"],
    }
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "orchestrator.cli", "mcp", "--workspace", str(ws), "--egress", "allow:allowed.test:8000"],
        env=env,
        cwd=REPO,
    )

    async def session():
        async with Client(server, read_timeout_seconds=120) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["shell"].annotations.open_world_hint is True

            async def shell(command: str):
                result = await client.call_tool("shell", {"command": command})
                jsonschema.validate(result.structured_content, tools["shell"].output_schema)
                return result.structured_content

            got = await shell(
                "python3 fetch.py http://allowed.test:8000/ && python3 fetch.py http://denied.test:8000/x?token=s3cret"
            )
            assert [(r["host"], r["port"], r["path"], r["decision"]) for r in got["egress"]] == [
                ("allowed.test", 8000, "/", "allow"),
                ("denied.test", 8000, "/x", "deny"),
            ]  # the query never recorded
            allowed, denied = got["egress"]
            assert allowed["bytes_down"] > 0 and allowed["credential"] is False and "default deny" == denied["rule"]
            assert denied["bytes_up"] > 0 and denied["bytes_down"] > 0  # what the box sent, the refusal it got
            assert "s3cret" not in str(got["egress"])
            quiet = await shell("true")
            assert quiet["egress"] == []  # the box has egress: an empty list says nothing went out
            read = await client.call_tool("read_file", {"path": "fetch.py"})
            assert read.structured_content["egress"] == []

    anyio.run(session)
