"""`oa-sandbox mcp` driven by a third-party agent framework's own MCP client: pydantic-ai's MCPToolset
(FastMCP's Client underneath), with a scripted FunctionModel (no network). Such clients hand the
model `structuredContent`, not the text block: the model must receive the file's text and the
command's output there, and every result must conform to the tool's declared outputSchema (FastMCP
checks it)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest

pytest.importorskip("pydantic_ai", reason="pydantic-ai-slim[mcp] is in the test extra (pyproject.toml)")

from fastmcp.client.transports import StdioTransport  # noqa: E402
from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.mcp import MCPToolset  # noqa: E402
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart  # noqa: E402
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402

from tests.helpers import make_workspace  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
CALC = "def add(a, b):\n    return a - b\n"
TEST = "from calc import add\nassert add(2, 3) == 5, 'add is wrong'\nprint('ALL 1 TESTS PASSED')\n"

PLAN = [
    ("read_file", {"path": "calc.py"}),
    ("edit_file", {"path": "calc.py", "old_text": "return a - b", "new_text": "return a + b"}),
    ("shell", {"command": "python3 test_calc.py"}),
]


def test_pydantic_ai_reads_edits_and_runs_the_tests(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"calc.py": CALC, "test_calc.py": TEST})
    received: list[tuple[str, object, str]] = []  # (tool, what the framework handed the model, its string form)

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        assert {"read_file", "edit_file", "shell"} <= {t.name for t in info.function_tools}
        returns = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]
        if returns and len(returns) > len(received):
            last = returns[-1]
            received.append((last.tool_name, last.content, last.model_response_str()))
        step = len(returns)
        if step < len(PLAN):
            name, args = PLAN[step]
            return ModelResponse(parts=[ToolCallPart(tool_name=name, args=args, tool_call_id=f"c{step}")])
        return ModelResponse(parts=[TextPart("fixed: add adds, the tests pass")])

    transport = StdioTransport(
        command=sys.executable,
        args=["-m", "orchestrator.cli", "mcp", "--workspace", str(ws)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=str(REPO),
    )
    # init_timeout: the server starts its sandbox before it answers initialize (seconds under gVisor on a
    # loaded machine; the 5 s default failed once in a full run)
    agent = Agent(FunctionModel(model), toolsets=[MCPToolset(transport, read_timeout=120, init_timeout=120)])

    async def run() -> str:
        result = await agent.run("make the tests pass")
        return str(result.output)

    output = anyio.run(run)
    assert output == "fixed: add adds, the tests pass"
    assert [name for name, _, _ in received] == ["read_file", "edit_file", "shell"]

    (_, read, read_str), (_, edit, _), (_, ran, ran_str) = received
    # what the model is handed is the structured result, and the payload is in it
    assert isinstance(read, dict) and read["output"] == CALC and "sha256" in read, read
    assert CALC in json.loads(read_str)["output"]
    assert isinstance(edit, dict) and edit["ok"] is True and edit["replacements"] == 1
    assert isinstance(ran, dict) and ran["exit_code"] == 0 and "ALL 1 TESTS PASSED" in ran["output"], ran
    assert "ALL 1 TESTS PASSED" in ran_str
    assert (ws / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
