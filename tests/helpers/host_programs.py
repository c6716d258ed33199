"""What tests/attacks/test_host_programs.py shares with other tests, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

# A stdio MCP server in 20 lines: its one tool says what runs it (interpreter, prefix, cwd, PATH, HOME).
PY_SERVER = r"""
import json, os, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("id") is None:
        continue
    method = msg.get("method")
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "probe", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "where", "description": "what runs this server",
                             "inputSchema": {"type": "object", "properties": {}}}]}
    elif method == "tools/call":
        info = {"program": sys.executable, "prefix": sys.prefix, "cwd": os.getcwd(), "PATH": os.environ.get("PATH", ""),
                "HOME": os.environ.get("HOME", ""), "sys.path": sys.path}
        result = {"content": [{"type": "text", "text": json.dumps(info)}], "isError": False}
    else:
        result = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\n")
    sys.stdout.flush()
"""
