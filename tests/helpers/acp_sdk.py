"""What tests/box/test_acp_sdk.py shares with other tests, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

from pathlib import Path

# -- 3. the editor's stdio MCP servers ---------------------------------------------------------------
MCP_SERVER = '''
import os, sys
from mcp.server.mcpserver import MCPServer

app = MCPServer("notes")
with open(os.environ["PID_FILE"], "w") as fh:
    fh.write(str(os.getpid()))

@app.tool()
def add_note(text: str) -> str:
    """Store a note on the host."""
    with open(os.environ["NOTES_FILE"], "a") as fh:
        fh.write(text + "\\n")
    return "stored: " + text

app.run()
'''


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return False
