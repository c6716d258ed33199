"""What tests/box/test_mcp_copy_mode.py shares with other tests, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jsonschema
from mcp import Client, StdioServerParameters

REPO = Path(__file__).resolve().parents[2]


def server_params(workspace: Path, state: Path, *extra: str) -> StdioServerParameters:
    """The server from this tree (not whatever the venv's entry point was installed from)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(state)}
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "orchestrator.cli", "mcp", "--workspace", str(workspace), *extra],
        env=env,
        cwd=REPO,
    )


def text(result) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


class Checked:
    """Calls a tool and checks its structuredContent against the tool's declared outputSchema."""

    def __init__(self, client: Client, tools: dict) -> None:
        self.client, self.tools = client, tools

    async def __call__(self, name: str, arguments: dict | None = None):
        result = await self.client.call_tool(name, arguments or {})
        jsonschema.validate(result.structured_content, self.tools[name].output_schema)
        assert text(result), "a text block for clients without structured output"
        return result
